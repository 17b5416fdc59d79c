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

// TestCeiling: the link capacity a cell's traffic can use, per phase,
// mode and number of copies (500 Mbit links: 62.5 MB/s each).
func TestCeiling(t *testing.T) {
	const link = 62.5
	tests := []struct {
		name           string
		clients, ds, m int
		on             bool
		target, phase  string
		want           float64
	}{
		{"read, clients > DS", 8, 4, 1, true, "", PhaseRead, 4 * link},
		{"read, 2 copies: one copy serves", 8, 4, 2, true, "", PhaseRead, 4 * link},
		{"read, clients < DS", 2, 4, 1, true, "", PhaseRead, 2 * link},
		{"write, 1 copy", 8, 4, 1, true, "", PhaseWrite, 4 * link},
		{"write, 2 copies: DS downloads carry 2W", 8, 4, 2, true, "", PhaseWrite, 2 * link},
		{"write, 3 copies", 8, 6, 3, true, "", PhaseWrite, 2 * link},
		{"write, 2 copies, 3 DS", 8, 3, 2, true, "", PhaseWrite, 1.5 * link},
		{"write, 2 copies, clients the limit", 1, 4, 2, true, "", PhaseWrite, link},
		{"off write, 2 copies: MDS upload carries 2W", 8, 4, 2, false, "", PhaseWrite, link / 2},
		{"off read, 2 copies", 8, 4, 2, false, "", PhaseRead, link},
		{"ganesha", 8, 4, 1, true, TargetGanesha, PhaseWrite, link},
	}
	for _, tt := range tests {
		cfg := IORConfig{Clients: tt.clients, LinkBitsPerSec: 500e6, Target: tt.target}
		if got := ceilingMBps(cfg, tt.ds, tt.m, tt.on, tt.phase); got != tt.want {
			t.Errorf("%s: ceiling %.2f, want %.2f", tt.name, got, tt.want)
		}
	}
	if got := ceilingMBps(IORConfig{Clients: 8}, 4, 2, true, PhaseWrite); got != 0 {
		t.Errorf("unknown link rate: ceiling %v, want 0", got)
	}
}

func TestCheckMirrors(t *testing.T) {
	cell := func(m int, phase string, share, ceil float64) IORCell {
		return IORCell{DataServers: 4, Mirrors: m, PNFS: true, Phase: phase, Summary: Summary{Median: share * ceil}, CeilingMBps: ceil}
	}
	tests := []struct {
		name   string
		cells  []IORCell
		notMet []string
	}{
		{name: "met", cells: []IORCell{cell(1, PhaseWrite, 0.95, 250), cell(1, PhaseRead, 0.93, 250), cell(2, PhaseWrite, 0.9, 125), cell(2, PhaseRead, 0.92, 250)}},
		{name: "slow copies", cells: []IORCell{cell(1, PhaseWrite, 0.95, 250), cell(1, PhaseRead, 0.93, 250), cell(2, PhaseWrite, 0.7, 125), cell(2, PhaseRead, 0.92, 250)},
			notMet: []string{"write with m >= 2"}},
		{name: "slow reads", cells: []IORCell{cell(1, PhaseRead, 0.93, 250), cell(2, PhaseWrite, 0.9, 125), cell(2, PhaseRead, 0.85, 250)},
			notMet: []string{"read:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checks := CheckMirrors([]*IORReport{{Cells: tt.cells}})
			if len(checks) != 2 {
				t.Fatalf("%d checks, want 2: %+v", len(checks), checks)
			}
			for _, c := range checks {
				wantFail := false
				for _, s := range tt.notMet {
					wantFail = wantFail || strings.HasPrefix(c.What, s)
				}
				if c.OK == wantFail {
					t.Errorf("%s: OK=%v, want %v (%s)", c.What, c.OK, !wantFail, c.Detail)
				}
			}
		})
	}
}
