package bench

import (
	"strings"
	"testing"
)

func TestCheckDS(t *testing.T) {
	const link = 62.5 // MB/s of 500 Mbit
	cell := func(n int, on bool, phase string, mbps float64) IORCell {
		ceil := link
		if on {
			ceil = float64(n) * link
		}
		return IORCell{DataServers: n, PNFS: on, Phase: phase, Summary: Summary{Median: mbps}, CeilingMBps: ceil}
	}
	sweep := func(onShare, offShare []float64) []*IORReport {
		rep := &IORReport{Config: IORConfig{Target: TargetShoal}}
		for i := range onShare {
			n := i + 1
			for _, ph := range []string{PhaseWrite, PhaseRead} {
				rep.Cells = append(rep.Cells, cell(n, true, ph, onShare[i]*float64(n)*link), cell(n, false, ph, offShare[i]*link))
			}
		}
		return []*IORReport{rep}
	}
	good := []float64{0.95, 0.93, 0.92, 0.9, 0.9, 0.88}
	offGood := []float64{0.95, 0.94, 0.95, 0.93, 0.94, 0.95}
	tests := []struct {
		name    string
		on, off []float64
		notMet  []string // substrings of the checks that must fail
	}{
		{name: "all met", on: good, off: offGood},
		{name: "cpu bound at 6", on: []float64{0.95, 0.93, 0.92, 0.9, 0.8, 0.6}, off: offGood,
			notMet: []string{"write: pNFS >= 85%", "read: pNFS >= 85%", "write: pNFS grows", "read: pNFS grows",
				"write: pNFS / pNFS off", "read: pNFS / pNFS off"}},
		{name: "single server slow", on: good, off: []float64{0.95, 0.8, 0.95, 0.93, 0.94, 0.95},
			notMet: []string{"write: pNFS off within", "read: pNFS off within"}},
		{name: "single server too fast", on: good, off: []float64{0.95, 1.3, 0.95, 0.93, 0.94, 0.95},
			notMet: []string{"write: pNFS off within", "read: pNFS off within"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checks := CheckDS(sweep(tt.on, tt.off))
			if len(checks) != 8 {
				t.Fatalf("%d checks, want 8: %+v", len(checks), checks)
			}
			for _, c := range checks {
				wantFail := false
				for _, s := range tt.notMet {
					if strings.HasPrefix(c.What, s) {
						wantFail = true
					}
				}
				if c.OK == wantFail {
					t.Errorf("%s: OK=%v, want %v (%s)", c.What, c.OK, !wantFail, c.Detail)
				}
			}
		})
	}
}
