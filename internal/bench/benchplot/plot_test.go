package benchplot_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/shoalfs/shoal/internal/bench"
	"github.com/shoalfs/shoal/internal/bench/benchplot"
	"github.com/shoalfs/shoal/internal/bench/benchtest"
)

// TestPlots writes reports of every sweep as JSON, reads them back as
// `shoal bench plot` does and checks that every chart is written as PNG
// and SVG and returned.
func TestPlots(t *testing.T) {
	dir := t.TempDir()
	benchtest.WriteSweeps(t, dir)
	res, err := bench.LoadResults(dir)
	if err != nil {
		t.Fatal(err)
	}
	files, err := benchplot.Write(res, dir)
	if err != nil {
		t.Fatal(err)
	}
	// What each format's file starts with.
	magic := map[string][]byte{".png": []byte("\x89PNG\r\n\x1a\n"), ".svg": []byte("<?xml")}
	var want []string
	for _, name := range []string{"scaling-ds", "scaling-clients", "blocksize", "mirrors", "smallfiles"} {
		for _, ext := range []string{".png", ".svg"} {
			p := filepath.Join(dir, name+ext)
			want = append(want, p)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Errorf("%s: %v (wrote %v)", name+ext, err, files)
				continue
			}
			if !bytes.HasPrefix(b, magic[ext]) {
				t.Errorf("%s starts with %q, want %q", name+ext, b[:min(len(b), 8)], magic[ext])
			}
		}
	}
	slices.Sort(want)
	slices.Sort(files)
	if !slices.Equal(files, want) {
		t.Errorf("Write returned %v, want %v", files, want)
	}
}

// TestPlotsNothing: results without reports draw nothing and are no error.
func TestPlotsNothing(t *testing.T) {
	files, err := benchplot.Write(&bench.Results{}, t.TempDir())
	if err != nil || len(files) != 0 {
		t.Errorf("Write(empty) = %v, %v; want no files, no error", files, err)
	}
}
