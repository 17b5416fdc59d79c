// Command xdrgen generates Go types and XDR encoders/decoders from XDR
// specifications (RFC 4506, with RFC 5531 program definitions).
//
// # Why not an existing generator
//
// Shoal decodes untrusted NFS traffic on every call and moves bulk file data
// through READ and WRITE. The off-the-shelf Go XDR generators we looked at
// panic (or rely on recover) when input is malformed, allocate whatever a
// length prefix asks for, and copy every opaque they decode. xdrgen instead
// emits straight-line code on top of internal/xdr, whose Decoder keeps the
// first error and turns every later read into a no-op. That gives us:
//
//   - sticky errors: generated DecodeXDR methods never panic and callers check
//     Decoder.Err once;
//   - bounded allocation: every variable-length array is sized with
//     Decoder.ArrayLen, which refuses counts whose minimum encoded size (computed
//     here, per element type) exceeds the bytes left in the message, and every
//     bound declared in the .x file (also through typedefs) is enforced;
//   - a zero-copy data path: variable-length opaques alias the input buffer when
//     decoded, and unbounded ones (READ/WRITE data) are spliced into the output
//     with Encoder.OpaqueRef when encoded.
//
// # Go mapping
//
// XDR identifiers become Go identifiers by splitting on '_' and upper-casing
// the first letter of each part (nfs_fh4 → NfsFh4); constant and enum value
// names are kept as written. Enums become int32 types with a String method;
// structs become structs; unions become structs holding the discriminant and
// one pointer per non-void arm; typedefs become type aliases. Program
// definitions only produce constants for program, version and procedure
// numbers.
//
// Usage:
//
//	xdrgen -pkg name -o out.go file.x [more.x ...]
//
// Multiple inputs are concatenated in order.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	pkg := flag.String("pkg", "", "Go package name of the output (required)")
	out := flag.String("o", "", "output file (default: standard output)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: xdrgen -pkg name [-o out.go] file.x...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *pkg == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	src, err := run(*pkg, flag.Args())
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdrgen:", err)
		os.Exit(1)
	}
	if *out == "" {
		_, err = os.Stdout.Write(src)
	} else {
		err = writeIfChanged(*out, src)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdrgen:", err)
		os.Exit(1)
	}
}

// run reads, parses and generates code for the given files.
func run(pkg string, files []string) ([]byte, error) {
	var toks []token
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		name := displayName(f)
		names = append(names, name)
		t, err := lex(name, string(b))
		if err != nil {
			return nil, err
		}
		toks = append(toks, t...)
	}
	defs, err := parse(toks)
	if err != nil {
		return nil, err
	}
	return generate(defs, pkg, strings.Join(names, ", "))
}

// displayName names f relative to its module root, so the generated header
// does not depend on the directory xdrgen was run from.
func displayName(f string) string {
	abs, err := filepath.Abs(f)
	if err != nil {
		return filepath.ToSlash(f)
	}
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if rel, err := filepath.Rel(dir, abs); err == nil {
				return filepath.ToSlash(rel)
			}
			break
		}
		if parent := filepath.Dir(dir); parent == dir {
			break
		}
	}
	return filepath.ToSlash(f)
}

func writeIfChanged(path string, b []byte) error {
	old, err := os.ReadFile(path)
	if err == nil && bytes.Equal(old, b) {
		return nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
