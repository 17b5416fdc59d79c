package main

import (
	"fmt"
	"strings"
)

type tokKind int

const (
	tEOF tokKind = iota
	tIdent
	tNum
	tPunct
)

type token struct {
	kind tokKind
	text string
	file string
	line int
}

func (t token) pos() string { return fmt.Sprintf("%s:%d", t.file, t.line) }

// lex splits src into tokens. Comments (C and C++ style) and lines whose
// first non-blank character is '%' (rpcgen passthrough) are dropped.
func lex(file, src string) ([]token, error) {
	var toks []token
	line := 1
	atLineStart := true
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\n':
			line++
			i++
			atLineStart = true
			continue
		case c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v':
			i++
			continue
		case c == '%' && atLineStart:
			for i < len(src) && src[i] != '\n' {
				i++
			}
			continue
		}
		atLineStart = false
		switch {
		case strings.HasPrefix(src[i:], "//"):
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case strings.HasPrefix(src[i:], "/*"):
			end := strings.Index(src[i+2:], "*/")
			if end < 0 {
				return nil, fmt.Errorf("%s:%d: unterminated comment", file, line)
			}
			line += strings.Count(src[i:i+2+end], "\n")
			i += end + 4
		case isIdentStart(c):
			j := i
			for j < len(src) && (isIdentStart(src[j]) || isDigit(src[j])) {
				j++
			}
			toks = append(toks, token{tIdent, src[i:j], file, line})
			i = j
		case isDigit(c) || (c == '-' && i+1 < len(src) && isDigit(src[i+1])):
			j := i + 1
			for j < len(src) && (isDigit(src[j]) || isIdentStart(src[j])) {
				j++
			}
			toks = append(toks, token{tNum, src[i:j], file, line})
			i = j
		case strings.ContainsRune("{}[]<>()=;:,*", rune(c)):
			toks = append(toks, token{tPunct, string(c), file, line})
			i++
		default:
			return nil, fmt.Errorf("%s:%d: unexpected character %q", file, line, c)
		}
	}
	return toks, nil
}

func isIdentStart(c byte) bool {
	return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
