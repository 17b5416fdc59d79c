package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoalfs/shoal/internal/bench/benchtest"
)

// TestBenchPlot runs `shoal bench plot` on reports of every sweep: a full
// build writes the charts and the tables and prints their paths; a build
// with -tags noplot (go test -tags noplot) refuses, names the reports'
// directory and writes nothing.
func TestBenchPlot(t *testing.T) {
	dir := t.TempDir()
	benchtest.WriteSweeps(t, dir)
	var out bytes.Buffer
	err := benchPlot(&out, dir, "")
	md := filepath.Join(dir, "results.md")
	charts, _ := filepath.Glob(filepath.Join(dir, "*.[ps][nv]g"))
	if !plotsIncluded {
		if err == nil || !strings.Contains(err.Error(), "built with -tags noplot") || !strings.Contains(err.Error(), dir) {
			t.Errorf("bench plot = %v, want the noplot error naming %s", err, dir)
		}
		if _, statErr := os.Stat(md); statErr == nil || len(charts) > 0 {
			t.Errorf("a noplot build wrote %v and %s", charts, md)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	printed := strings.Fields(out.String())
	for _, want := range []string{md, filepath.Join(dir, "scaling-ds.png"), filepath.Join(dir, "smallfiles.svg")} {
		if !slices.Contains(printed, want) {
			t.Errorf("printed %q, lacks %s", printed, want)
		}
	}
	if b, err := os.ReadFile(md); err != nil || !bytes.Contains(b, []byte("Sweep: ds")) {
		t.Errorf("results.md: %v, %d bytes without the ds sweep", err, len(b))
	}
	if len(charts) != len(printed)-1 {
		t.Errorf("%d charts in %s, printed %d files besides results.md", len(charts), dir, len(printed)-1)
	}
}

// TestNoplotBuild pins issue 23: a shoal built with -tags noplot (the
// Debian package's, scripts/deb.sh) links no gonum package, still has
// package bench (`shoal bench` runs and writes JSON), and its `shoal bench
// plot` says why it draws nothing; the full build does link gonum, so the
// first check would catch the plotting library coming back.
func TestNoplotBuild(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not in PATH")
	}
	const benchPkg = "github.com/shoalfs/shoal/internal/bench"
	for _, tc := range []struct {
		name      string
		flags     []string
		wantGonum bool
	}{
		{"full", nil, true},
		{"noplot", []string{"-tags", "noplot"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			args := append(append([]string{"list", "-deps"}, tc.flags...), ".")
			cmd := exec.CommandContext(ctx, goBin, args...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
			}
			deps := strings.Fields(string(out))
			var gonum []string
			for _, d := range deps {
				if strings.HasPrefix(d, "gonum.org/") {
					gonum = append(gonum, d)
				}
			}
			if (len(gonum) > 0) != tc.wantGonum {
				t.Errorf("go %s: gonum packages %q, want some: %v", strings.Join(args, " "), gonum, tc.wantGonum)
			}
			if !slices.Contains(deps, benchPkg) || slices.Contains(deps, benchPkg+"/benchplot") != tc.wantGonum {
				t.Errorf("go %s: %s in the deps %v, %s/benchplot %v; want true, %v", strings.Join(args, " "),
					benchPkg, slices.Contains(deps, benchPkg), benchPkg, slices.Contains(deps, benchPkg+"/benchplot"), tc.wantGonum)
			}
		})
	}
	if testing.Short() {
		return
	}
	bin := buildShoal(t, "-tags", "noplot")
	dir := t.TempDir()
	code, _, stderr := runShoal(t, bin, time.Minute, "bench", "plot", "--dir", dir)
	if code == 0 || !strings.Contains(stderr, "this shoal was built with -tags noplot: charts are not included") || !strings.Contains(stderr, dir) {
		t.Errorf("noplot shoal bench plot: exit %d, stderr %q; want failure with the noplot message naming %s", code, stderr, dir)
	}
	code, stdout, _ := runShoal(t, bin, time.Minute, "bench", "--help")
	if code != 0 || !strings.Contains(stdout, "not in this build: -tags noplot") {
		t.Errorf("noplot shoal bench --help: exit %d, stdout %q; want the plot subcommand marked as not built", code, stdout)
	}
}
