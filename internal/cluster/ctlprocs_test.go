package cluster

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestCtlProcsDeclared checks ctlProcs against the protocol's procedure
// numbers as generated from spec/control.x: every CTLPROC_* is declared,
// each by exactly one kind of caller (NULL: all), with the handler of the
// endpoint that serves that caller and no other. A procedure added to the
// spec without a declaration would be PROC_UNAVAIL everywhere.
func TestCtlProcsDeclared(t *testing.T) {
	procs := ctlprotoProcs(t)
	if len(procs) != len(ctlProcs) {
		t.Errorf("%d CTLPROC_* in ctlproto, %d declarations in ctlProcs", len(procs), len(ctlProcs))
	}
	for name, num := range procs {
		p, ok := ctlProcs[num]
		if !ok {
			t.Errorf("%s (%d) is not declared in ctlProcs", name, num)
			continue
		}
		if name == "CTLPROC_NULL" {
			if p.from != fromMDS|fromDS|fromPeer || p.agent != nil || p.registry != nil || p.releaseArgs {
				t.Errorf("CTLPROC_NULL: %+v, want every caller and no handler", p)
			}
			continue
		}
		switch p.from {
		case fromMDS, fromPeer:
			if p.agent == nil || p.registry != nil {
				t.Errorf("%s: served by a data server, want an agent handler only", name)
			}
		case fromDS:
			if p.registry == nil || p.agent != nil {
				t.Errorf("%s: served by the MDS, want a registry handler only", name)
			}
		default:
			t.Errorf("%s: callers %b, want exactly one kind", name, p.from)
		}
	}
}

// ctlprotoProcs returns the CTLPROC_* constants of the generated ctlproto
// package, read from its source.
func ctlprotoProcs(t *testing.T) map[string]uint32 {
	t.Helper()
	files, err := filepath.Glob("../ctlproto/*_xdr.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("generated ctlproto source: %v (%d files)", err, len(files))
	}
	procs := map[string]uint32{}
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range vs.Names {
				if !strings.HasPrefix(id.Name, "CTLPROC_") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.INT {
					t.Fatalf("%s: not an integer literal", id.Name)
				}
				v, err := strconv.ParseUint(lit.Value, 0, 32)
				if err != nil {
					t.Fatalf("%s: %v", id.Name, err)
				}
				procs[id.Name] = uint32(v)
			}
			return true
		})
	}
	if len(procs) == 0 {
		t.Fatal("no CTLPROC_* constants in ctlproto")
	}
	return procs
}
