package main

import (
	"fmt"
)

// Declaration modes.
const (
	mPlain    = iota // T x
	mFixed           // T x[N]
	mVar             // T x<N>
	mOptional        // T *x
)

// typeSpec names a type: a primitive keyword ("int", "uint", "hyper",
// "uhyper", "bool", "float", "double", "opaque", "string", "void") or an
// identifier defined in the input.
type typeSpec struct {
	name  string
	ident bool
}

type decl struct {
	name string
	typ  typeSpec
	mode int
	size string // bound or length as written (number or const name); "" if none
	tok  token
}

func (d decl) isVoid() bool { return d.typ.name == "void" && !d.typ.ident }

type enumVal struct {
	name  string
	value string
	tok   token
}

type arm struct {
	labels []string
	labTok []token
	d      decl
}

type defKind int

const (
	kConst defKind = iota
	kEnum
	kStruct
	kUnion
	kTypedef
	kProgram
)

type def struct {
	kind defKind
	name string
	tok  token

	value  string    // kConst
	vals   []enumVal // kEnum
	fields []decl    // kStruct
	disc   decl      // kUnion
	arms   []arm     // kUnion
	deflt  *arm      // kUnion
	td     decl      // kTypedef
	consts []enumVal // kProgram: program, version and procedure numbers
}

type parser struct {
	toks []token
	pos  int
	defs []*def
}

type parseError struct{ msg string }

func (p *parser) peek() token {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	t := token{kind: tEOF}
	if len(p.toks) > 0 {
		last := p.toks[len(p.toks)-1]
		t.file, t.line = last.file, last.line
	}
	return t
}

func (p *parser) next() token {
	t := p.peek()
	if p.pos < len(p.toks) {
		p.pos++
	}
	return t
}

func (p *parser) failf(t token, format string, args ...any) {
	panic(parseError{t.pos() + ": " + fmt.Sprintf(format, args...)})
}

func (p *parser) expect(s string) token {
	t := p.next()
	if t.kind == tEOF || t.text != s || (t.kind != tPunct && t.kind != tIdent) {
		p.failf(t, "expected %q, found %q", s, t.text)
	}
	return t
}

func (p *parser) accept(s string) bool {
	t := p.peek()
	if (t.kind == tPunct || t.kind == tIdent) && t.text == s {
		p.pos++
		return true
	}
	return false
}

var keywords = map[string]bool{
	"bool": true, "case": true, "const": true, "default": true, "double": true,
	"quadruple": true, "enum": true, "float": true, "hyper": true, "int": true,
	"opaque": true, "string": true, "struct": true, "switch": true, "typedef": true,
	"union": true, "unsigned": true, "void": true, "program": true, "version": true,
}

func (p *parser) ident() token {
	t := p.next()
	if t.kind != tIdent || keywords[t.text] {
		p.failf(t, "expected identifier, found %q", t.text)
	}
	return t
}

// value parses a constant or a constant name.
func (p *parser) value() token {
	t := p.next()
	if t.kind == tNum || (t.kind == tIdent && !keywords[t.text]) {
		return t
	}
	p.failf(t, "expected value, found %q", t.text)
	return t
}

// parse parses a whole specification. Parse errors are reported as an error
// value; the panic is internal to the recursive-descent parser.
func parse(toks []token) (defs []*def, err error) {
	p := &parser{toks: toks}
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(parseError)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%s", pe.msg)
		}
	}()
	for p.peek().kind != tEOF {
		p.definition()
	}
	return p.defs, nil
}

func (p *parser) definition() {
	t := p.next()
	switch t.text {
	case "const":
		name := p.ident()
		p.expect("=")
		v := p.value()
		p.expect(";")
		p.defs = append(p.defs, &def{kind: kConst, name: name.text, tok: name, value: v.text})
	case "enum":
		name := p.ident()
		d := &def{kind: kEnum, name: name.text, tok: name}
		d.vals = p.enumBody()
		p.expect(";")
		p.defs = append(p.defs, d)
	case "struct":
		name := p.ident()
		d := &def{kind: kStruct, name: name.text, tok: name}
		d.fields = p.structBody()
		p.expect(";")
		p.defs = append(p.defs, d)
	case "union":
		name := p.ident()
		d := &def{kind: kUnion, name: name.text, tok: name}
		p.unionBody(d)
		p.expect(";")
		p.defs = append(p.defs, d)
	case "typedef":
		p.typedef(t)
	case "program":
		p.program()
	default:
		p.failf(t, "expected definition, found %q", t.text)
	}
}

func (p *parser) typedef(t token) {
	// typedef struct/union/enum { ... } name;
	switch k := p.peek().text; k {
	case "struct", "union", "enum":
		if p.pos+1 < len(p.toks) && p.toks[p.pos+1].text == "{" ||
			k == "union" && p.pos+1 < len(p.toks) && p.toks[p.pos+1].text == "switch" {
			p.next()
			d := &def{}
			switch k {
			case "struct":
				d.kind, d.fields = kStruct, p.structBody()
			case "enum":
				d.kind, d.vals = kEnum, p.enumBody()
			case "union":
				d.kind = kUnion
				p.unionBody(d)
			}
			name := p.ident()
			d.name, d.tok = name.text, name
			p.expect(";")
			p.defs = append(p.defs, d)
			return
		}
	}
	dc := p.declaration()
	if dc.isVoid() {
		p.failf(t, "typedef of void")
	}
	p.expect(";")
	p.defs = append(p.defs, &def{kind: kTypedef, name: dc.name, tok: dc.tok, td: dc})
}

func (p *parser) enumBody() []enumVal {
	p.expect("{")
	var vals []enumVal
	for {
		n := p.ident()
		p.expect("=")
		v := p.value()
		vals = append(vals, enumVal{n.text, v.text, n})
		if p.accept(",") {
			if p.accept("}") { // tolerate a trailing comma
				return vals
			}
			continue
		}
		p.expect("}")
		return vals
	}
}

func (p *parser) structBody() []decl {
	p.expect("{")
	var fields []decl
	for !p.accept("}") {
		d := p.declaration()
		p.expect(";")
		if d.isVoid() {
			continue
		}
		fields = append(fields, d)
	}
	if len(fields) == 0 {
		p.failf(p.peek(), "empty struct")
	}
	return fields
}

func (p *parser) unionBody(d *def) {
	p.expect("switch")
	p.expect("(")
	d.disc = p.declaration()
	p.expect(")")
	p.expect("{")
	for !p.accept("}") {
		t := p.peek()
		switch t.text {
		case "case":
			var a arm
			for p.accept("case") {
				v := p.value()
				a.labels = append(a.labels, v.text)
				a.labTok = append(a.labTok, v)
				p.expect(":")
			}
			if p.peek().text == "default" {
				p.failf(p.peek(), "default shares an arm with case labels; not supported")
			}
			a.d = p.declaration()
			p.expect(";")
			d.arms = append(d.arms, a)
		case "default":
			p.next()
			p.expect(":")
			if d.deflt != nil {
				p.failf(t, "duplicate default arm")
			}
			a := &arm{d: p.declaration()}
			p.expect(";")
			d.deflt = a
		default:
			p.failf(t, "expected case or default, found %q", t.text)
		}
	}
	if len(d.arms) == 0 && d.deflt == nil {
		p.failf(d.tok, "union %s has no arms", d.name)
	}
}

// typeSpecifier parses a type specifier other than opaque/string/void.
func (p *parser) typeSpecifier() typeSpec {
	t := p.next()
	switch t.text {
	case "unsigned":
		switch p.peek().text {
		case "int":
			p.next()
			return typeSpec{name: "uint"}
		case "hyper":
			p.next()
			return typeSpec{name: "uhyper"}
		case "long", "char", "short":
			p.failf(t, "unsupported type unsigned %s", p.peek().text)
		}
		return typeSpec{name: "uint"}
	case "int", "hyper", "bool", "float", "double":
		return typeSpec{name: t.text}
	case "quadruple":
		p.failf(t, "quadruple is not supported")
	case "struct", "union", "enum":
		if p.peek().text == "{" || p.peek().text == "switch" {
			p.failf(t, "nested anonymous %s definitions are not supported; define it at top level and refer to it by name", t.text)
		}
		p.failf(t, "unexpected %q in type specifier", t.text)
	}
	if t.kind != tIdent || keywords[t.text] {
		p.failf(t, "expected type, found %q", t.text)
	}
	return typeSpec{name: t.text, ident: true}
}

func (p *parser) declaration() decl {
	t := p.peek()
	switch t.text {
	case "void":
		p.next()
		return decl{typ: typeSpec{name: "void"}, tok: t}
	case "opaque", "string":
		p.next()
		name := p.ident()
		d := decl{name: name.text, typ: typeSpec{name: t.text}, tok: name}
		switch {
		case t.text == "opaque" && p.accept("["):
			d.mode = mFixed
			d.size = p.value().text
			p.expect("]")
		case p.accept("<"):
			d.mode = mVar
			if !p.accept(">") {
				d.size = p.value().text
				p.expect(">")
			}
		default:
			p.failf(p.peek(), "%s %s needs a length", t.text, name.text)
		}
		return d
	}
	ts := p.typeSpecifier()
	if p.accept("*") {
		name := p.ident()
		return decl{name: name.text, typ: ts, mode: mOptional, tok: name}
	}
	name := p.ident()
	d := decl{name: name.text, typ: ts, tok: name}
	switch {
	case p.accept("["):
		d.mode = mFixed
		d.size = p.value().text
		p.expect("]")
	case p.accept("<"):
		d.mode = mVar
		if !p.accept(">") {
			d.size = p.value().text
			p.expect(">")
		}
	}
	return d
}

// program parses an RFC 5531 program definition; only its numbers matter.
func (p *parser) program() {
	name := p.ident()
	d := &def{kind: kProgram, name: name.text, tok: name}
	p.expect("{")
	var pending []enumVal
	for !p.accept("}") {
		p.expect("version")
		vname := p.ident()
		p.expect("{")
		var procs []enumVal
		for !p.accept("}") {
			// result type
			if !p.accept("void") {
				p.procType()
			}
			pname := p.ident()
			p.expect("(")
			for {
				if !p.accept("void") {
					p.procType()
				}
				if !p.accept(",") {
					break
				}
			}
			p.expect(")")
			p.expect("=")
			v := p.value()
			p.expect(";")
			procs = append(procs, enumVal{pname.text, v.text, pname})
		}
		p.expect("=")
		vv := p.value()
		p.expect(";")
		pending = append(pending, enumVal{vname.text, vv.text, vname})
		pending = append(pending, procs...)
	}
	p.expect("=")
	pv := p.value()
	p.expect(";")
	d.consts = append([]enumVal{{name.text, pv.text, name}}, pending...)
	p.defs = append(p.defs, d)
}

func (p *parser) procType() {
	switch p.peek().text {
	case "opaque", "string":
		p.failf(p.peek(), "procedure argument of type %s: wrap it in a typedef", p.peek().text)
	}
	p.typeSpecifier()
}
