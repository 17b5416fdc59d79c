//go:build !noplot

package main

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/shoalfs/shoal/internal/bench"
	"github.com/shoalfs/shoal/internal/bench/benchplot"
)

// plotsIncluded says this build draws the charts (it is built without
// -tags noplot).
const plotsIncluded = true

// benchPlot draws the plots of the JSON reports in dir into dir and
// writes their tables to md (default DIR/results.md), printing the path
// of every file written to out.
func benchPlot(out io.Writer, dir, md string) error {
	res, err := bench.LoadResults(dir)
	if err != nil {
		return err
	}
	if len(res.IOR)+len(res.Meta) == 0 {
		return fmt.Errorf("no ior or meta JSON reports in %s", dir)
	}
	files, err := benchplot.Write(res, dir)
	for _, f := range files {
		fmt.Fprintln(out, f)
	}
	if err != nil {
		return err
	}
	if md == "" {
		md = filepath.Join(dir, "results.md")
	}
	err = writeJSONFile(md, res.WriteMarkdown)
	if err == nil {
		fmt.Fprintln(out, md)
	}
	return err
}
