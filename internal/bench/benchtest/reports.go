// Package benchtest writes benchmark reports for tests of what reads them
// back: package bench's tables and package benchplot's charts check the
// same directory of reports, written as `shoal bench` writes them.
package benchtest

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoalfs/shoal/internal/bench"
)

// Counts of the reports WriteSweeps writes.
const (
	IORReports  = 8
	MetaReports = 1
)

// WriteSweeps writes into dir, as JSON, IOR reports of every sweep (a "ds"
// sweep over 1 and 2 data servers with and without pNFS, a "clients" sweep
// of Shoal and NFS-Ganesha over 1 and 2 clients, a "block" sweep over 32 KiB
// and 1 MiB, a "mirrors" sweep over 1 and 2 copies on 4 data servers), one
// metadata report, and a JSON file that is no report.
func WriteSweeps(t testing.TB, dir string) {
	t.Helper()
	cell := func(n int, on bool, phase string, mbps float64) bench.IORCell {
		return bench.IORCell{DataServers: n, PNFS: on, Phase: phase, Summary: bench.Summarize([]float64{mbps}),
			ServerCores: 0.5, ClientCores: 0.2, Busy: 0.9, CeilingMBps: 125 * float64(n), Runs: 1}
	}
	write := func(name string, v interface{ WriteJSON(io.Writer) error }) {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := v.WriteJSON(f); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	ds := &bench.IORReport{Kind: bench.IOR, Config: bench.DefaultIORConfig()}
	ds.Config.Label, ds.Config.LinkBitsPerSec, ds.Config.DataServers = bench.SweepDS, 1e9, []int{1, 2}
	for _, n := range []int{1, 2} {
		ds.Cells = append(ds.Cells, cell(n, true, bench.PhaseWrite, 100*float64(n)), cell(n, false, bench.PhaseWrite, 100))
	}
	write("ds.json", ds)
	for _, c := range []int{1, 2} {
		for _, target := range []string{bench.TargetShoal, bench.TargetGanesha} {
			r := &bench.IORReport{Kind: bench.IOR, Config: bench.DefaultIORConfig()}
			r.Config.Label, r.Config.Clients, r.Config.Target, r.Config.DataServers = bench.SweepClients, c, target, []int{2}
			r.Cells = []bench.IORCell{cell(2, target == bench.TargetShoal, bench.PhaseRead, 90*float64(c))}
			write(fmt.Sprintf("clients-%s-%d.json", target, c), r)
		}
	}
	for _, tr := range []int{32 << 10, 1 << 20} {
		r := &bench.IORReport{Kind: bench.IOR, Config: bench.DefaultIORConfig()}
		r.Config.Label, r.Config.TransferSize = bench.SweepBlock, tr
		r.Cells = []bench.IORCell{cell(4, true, bench.PhaseWrite, float64(tr>>12))}
		write(fmt.Sprintf("block-%d.json", tr), r)
	}
	mir := &bench.IORReport{Kind: bench.IOR, Config: bench.DefaultIORConfig()}
	mir.Config.Label, mir.Config.LinkBitsPerSec, mir.Config.DataServers, mir.Config.Mirrors = bench.SweepMirrors, 1e9, []int{4}, []int{1, 2}
	mir.Config.PNFS = []bool{true}
	for _, m := range []int{1, 2} {
		w, r := cell(4, true, bench.PhaseWrite, 470/float64(m)), cell(4, true, bench.PhaseRead, 470)
		w.Mirrors, r.Mirrors, w.CeilingMBps = m, m, 500/float64(m)
		mir.Cells = append(mir.Cells, w, r)
	}
	write("mirrors.json", mir)
	write("meta.json", &bench.MetaReport{Kind: "meta", Config: bench.DefaultMetaConfig(), Runs: []bench.MetaRun{
		{Dir: bench.DirUnique, Phase: bench.PhaseMDCreate, Ops: 10, Rate: 100},
		{Phase: bench.PhasePostmark, Ops: 10, Rate: 50},
	}})
	if err := os.WriteFile(filepath.Join(dir, "other.json"), []byte(`{"x": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
}
