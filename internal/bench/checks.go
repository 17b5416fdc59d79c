package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Targets of the data-server sweep (the scaling shape of the pNFS
// papers): pNFS reaches MinShare of the links its traffic crosses at every
// data-server count and grows with it, the single server stays within
// OneLinkBand of one link, and pNFS beats it by MinRatio at the largest
// count.
const (
	MinShare    = 0.85
	OneLinkBand = 0.15
	MinRatio    = 4.5
	// growSlack tolerates a step from N to N+1 data servers that is flat
	// within noise once the clients' links, not the DSes, are the limit.
	growSlack = 0.97
)

// Check is one verdict on a sweep.
type Check struct {
	What string
	OK   bool
	// Detail gives the numbers behind the verdict.
	Detail string
}

// CheckDS judges one data-server sweep (pNFS on and off in the same
// reports) against the targets above, per phase. Only single-copy cells
// count; CheckMirrors judges the cost of copies.
func CheckDS(reps []*IORReport) []Check {
	type key struct {
		ds    int
		pnfs  bool
		phase string
	}
	cells := map[key]IORCell{}
	var counts []int
	for _, rep := range reps {
		if rep.Config.Target != "" && rep.Config.Target != TargetShoal {
			continue
		}
		for _, c := range rep.Cells {
			if c.Mirrors > 1 {
				continue
			}
			cells[key{c.DataServers, c.PNFS, c.Phase}] = c
			if !slices.Contains(counts, c.DataServers) {
				counts = append(counts, c.DataServers)
			}
		}
	}
	slices.Sort(counts)
	if len(counts) == 0 {
		return nil
	}
	var out []Check
	for _, phase := range []string{PhaseWrite, PhaseRead} {
		var low, flat, offOut []string
		grows := true
		prev := 0.0
		for _, n := range counts {
			on, ok := cells[key{n, true, phase}]
			if ok && on.CeilingMBps > 0 {
				if on.Median < MinShare*on.CeilingMBps {
					low = append(low, fmt.Sprintf("%d DS %.0f%%", n, 100*on.Median/on.CeilingMBps))
				}
				if prev > 0 && on.Median < growSlack*prev {
					grows = false
					flat = append(flat, fmt.Sprintf("%d DS %s < %s", n, FormatRate(on.Median), FormatRate(prev)))
				}
				prev = on.Median
			}
			off, ok := cells[key{n, false, phase}]
			if ok && off.CeilingMBps > 0 {
				if d := off.Median/off.CeilingMBps - 1; d < -OneLinkBand || d > OneLinkBand {
					offOut = append(offOut, fmt.Sprintf("%d DS %.0f%%", n, 100*off.Median/off.CeilingMBps))
				}
			}
		}
		detail := func(bad []string) string {
			if len(bad) == 0 {
				return "every count"
			}
			return "misses: " + strings.Join(bad, ", ")
		}
		out = append(out,
			Check{fmt.Sprintf("%s: pNFS >= %.0f%% of min(clients, DS) links", phase, 100*MinShare), len(low) == 0, detail(low)},
			Check{fmt.Sprintf("%s: pNFS grows with the data servers", phase), grows, detail(flat)},
			Check{fmt.Sprintf("%s: pNFS off within %.0f%% of one link", phase, 100*OneLinkBand), len(offOut) == 0, detail(offOut)},
		)
		top := counts[len(counts)-1]
		on, okOn := cells[key{top, true, phase}]
		off, okOff := cells[key{top, false, phase}]
		if okOn && okOff && off.Median > 0 {
			r := on.Median / off.Median
			out = append(out, Check{fmt.Sprintf("%s: pNFS / pNFS off at %d DS >= %.1f", phase, top, MinRatio), r >= MinRatio,
				fmt.Sprintf("%s / %s MB/s = %.1f", FormatRate(on.Median), FormatRate(off.Median), r)})
		}
	}
	return out
}

// Targets of the copies sweep (the replication issue): reads, served by
// one copy, keep MirrorReadShare of the links at every number of copies;
// writes with two or more copies reach MirrorWriteShare of what the links
// allow when every byte enters the data servers once per copy
// (ceilingMBps).
const (
	MirrorReadShare  = 0.90
	MirrorWriteShare = 0.85
)

// CheckMirrors judges a sweep over the number of copies (pNFS on) against
// the targets above, at every data-server count it holds.
func CheckMirrors(reps []*IORReport) []Check {
	var reads, writes []IORCell
	for _, rep := range reps {
		if rep.Config.Target != "" && rep.Config.Target != TargetShoal {
			continue
		}
		for _, c := range rep.Cells {
			switch {
			case !c.PNFS || c.CeilingMBps <= 0:
			case c.Phase == PhaseRead:
				reads = append(reads, c)
			case c.Phase == PhaseWrite && c.Mirrors > 1:
				writes = append(writes, c)
			}
		}
	}
	judge := func(cells []IORCell, share float64) (bool, string) {
		ok := true
		var parts []string
		for _, c := range cells {
			got := c.Median / c.CeilingMBps
			mark := ""
			if got < share {
				ok, mark = false, " (miss)"
			}
			parts = append(parts, fmt.Sprintf("%d DS x%d: %s of %s MB/s = %.0f%%%s", c.DataServers, max(c.Mirrors, 1), FormatRate(c.Median), FormatRate(c.CeilingMBps), 100*got, mark))
		}
		return ok, strings.Join(parts, "; ")
	}
	var out []Check
	if len(reads) > 0 {
		ok, d := judge(reads, MirrorReadShare)
		out = append(out, Check{fmt.Sprintf("read: pNFS >= %.0f%% of min(clients, DS) links at every number of copies", 100*MirrorReadShare), ok, d})
	}
	if len(writes) > 0 {
		ok, d := judge(writes, MirrorWriteShare)
		out = append(out, Check{fmt.Sprintf("write with m >= 2 copies: pNFS >= %.0f%% of min(clients, DS/m) links", 100*MirrorWriteShare), ok, d})
	}
	return out
}

// writeChecks writes the verdicts as a Markdown list under title.
func writeChecks(w io.Writer, title string, checks []Check) {
	if len(checks) == 0 {
		return
	}
	fmt.Fprintf(w, "\nTargets (%s):\n\n", title)
	for _, c := range checks {
		v := "MET"
		if !c.OK {
			v = "NOT MET"
		}
		fmt.Fprintf(w, "- %s: **%s** (%s)\n", c.What, v, c.Detail)
	}
}
