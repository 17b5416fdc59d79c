package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// unmappedSentinels are the exported sentinels of errTableSources that
// errTable leaves out on purpose, each with the reason.
var unmappedSentinels = map[string]string{
	"pnfs.ErrDataLost": "Server.dataLost turns it into a new write verifier, never a status",
	"store.ErrNotSupported": "the operations that can meet it answer it themselves " +
		"(NFS4ERR_NOTSUPP from ALLOCATE, DEALLOCATE and SEEK; COPY falls back to a plain copy)",
	"store.ErrClosed":  "a store closed under a request (shutdown) is a server fault",
	"meta.ErrConflict": "only package cluster's stripe-map updates meet it, and retry",
	"meta.ErrNotInline": "inline.go calls WriteInline only for a write that fits, " +
		"under the file's lock that every placement of a stripe map takes",
	"meta.ErrTxnTooLarge": "a transaction over etcd's limits is a server fault",
	"meta.ErrInconsistent": "only meta.Check (shoal admin fsck, offline) returns it; " +
		"no NFS operation runs the check",
}

// errTableSources are the packages whose every exported Err* sentinel must
// be in errTable, by directory relative to this package's.
var errTableSources = map[string]string{
	"pnfs":  "../pnfs",
	"meta":  "../meta",
	"store": "../store",
}

// TestErrTableComplete checks that errTable (errors.go) maps every exported
// Err* sentinel that packages pnfs, meta and store declare, so that a new
// sentinel cannot reach a client as NFS4ERR_SERVERFAULT unnoticed. It reads
// the packages' source rather than a list they export: a list would have to
// be kept up to date by hand, which is the mistake this test is for.
func TestErrTableComplete(t *testing.T) {
	declared := map[string]bool{}
	for pkg, dir := range errTableSources {
		for _, name := range exportedErrVars(t, dir) {
			declared[pkg+"."+name] = true
		}
	}
	if len(declared) == 0 {
		t.Fatal("no sentinels found in the source of pnfs, meta and store")
	}
	mapped := errTableNames(t)
	for name := range declared {
		_, unmapped := unmappedSentinels[name]
		switch {
		case unmapped && mapped[name]:
			t.Errorf("%s is in errTable and in unmappedSentinels; drop it from unmappedSentinels", name)
		case !unmapped && !mapped[name]:
			t.Errorf("%s has no entry in errTable (errors.go): it would reach clients as NFS4ERR_SERVERFAULT", name)
		}
	}
	for name := range unmappedSentinels {
		if !declared[name] {
			t.Errorf("unmappedSentinels names %s, which is not declared", name)
		}
	}
}

// exportedErrVars returns the exported package-level variables named Err*
// declared in the non-test Go files of dir.
func exportedErrVars(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if id.IsExported() && strings.HasPrefix(id.Name, "Err") {
						names = append(names, id.Name)
					}
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatalf("no exported Err* variables in %s", dir)
	}
	slices.Sort(names)
	return names
}

// errTableNames returns the sentinels errTable names ("pkg.ErrX"), read
// from errors.go.
func errTableNames(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile("errors.go")
	if err != nil {
		t.Fatal(err)
	}
	af, err := parser.ParseFile(token.NewFileSet(), "errors.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, d := range af.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			if len(vs.Names) != 1 || vs.Names[0].Name != "errTable" {
				continue
			}
			lit := vs.Values[0].(*ast.CompositeLit)
			for _, e := range lit.Elts {
				entry := e.(*ast.CompositeLit)
				if sel, ok := entry.Elts[0].(*ast.SelectorExpr); ok {
					if pkg, ok := sel.X.(*ast.Ident); ok {
						names[pkg.Name+"."+sel.Sel.Name] = true
					}
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("errTable not found in errors.go")
	}
	return names
}
