//go:build noplot

package main

import (
	"fmt"
	"io"
)

// plotsIncluded says this build has no charts (-tags noplot).
const plotsIncluded = false

// benchPlot refuses: a shoal built with -tags noplot (a server's, without
// the plotting library) has no charts. `shoal bench` still runs and writes
// its JSON reports; a full build draws them.
func benchPlot(_ io.Writer, dir, _ string) error {
	return fmt.Errorf("this shoal was built with -tags noplot: charts are not included; `shoal bench` results are JSON in %s, draw them with a full build (go build ./cmd/shoal)", dir)
}
