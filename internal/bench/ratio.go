package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// TargetShoalAsync is the classic benchmark's target that runs
// `shoal serve --sync=false` (knfsd's async convention: metadata changes
// answered once written to the metadata log, synced within the commit
// interval).
const TargetShoalAsync = "shoal-async"

// Ratio is one target's median rate on one workload divided by the
// baseline's (NFS-Ganesha's) on the same workload, measured in the same run.
type Ratio struct {
	Target   string  `json:"target"`
	Baseline string  `json:"baseline"`
	Workload string  `json:"workload"`
	Ratio    float64 `json:"ratio"`
	// Goal is the ratio issue 27 asks of this target on this workload (0:
	// none): Shoal at its default 1.5× Ganesha on create and remove,
	// Shoal with --sync=false 2×.
	Goal float64 `json:"goal,omitempty"`
}

// ratioGoal is issue 27's goal for target on workload, or 0.
func ratioGoal(target, workload string) float64 {
	if !strings.HasPrefix(workload, Create+" ") && !strings.HasPrefix(workload, Remove+" ") {
		return 0
	}
	switch target {
	case TargetShoal:
		return 1.5
	case TargetShoalAsync:
		return 2
	}
	return 0
}

// computeRatios divides every other target's medians by the baseline's,
// workload by workload; nil if the baseline did not run.
func computeRatios(targets []TargetReport, baseline string) []Ratio {
	base := map[string]float64{}
	for _, t := range targets {
		if t.Name != baseline {
			continue
		}
		for _, r := range t.Results {
			if len(r.Samples) > 0 && r.Median > 0 {
				base[r.Workload] = r.Median
			}
		}
	}
	if len(base) == 0 {
		return nil
	}
	var out []Ratio
	for _, t := range targets {
		if t.Name == baseline {
			continue
		}
		for _, r := range t.Results {
			b, ok := base[r.Workload]
			if !ok || len(r.Samples) == 0 {
				continue
			}
			out = append(out, Ratio{Target: t.Name, Baseline: baseline, Workload: r.Workload,
				Ratio: r.Median / b, Goal: ratioGoal(t.Name, r.Workload)})
		}
	}
	return out
}

// writeRatios prints the ratios as a table after the main one.
func writeRatios(w io.Writer, ratios []Ratio) error {
	if len(ratios) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nratio to %s (median / median, same run):\n", ratios[0].Baseline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "target\tworkload\tratio\tgoal")
	for _, r := range ratios {
		goal := "-"
		if r.Goal > 0 {
			met := "met"
			if r.Ratio < r.Goal {
				met = "NOT met"
			}
			goal = fmt.Sprintf("≥ %.1f× (%s)", r.Goal, met)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f×\t%s\n", r.Target, r.Workload, r.Ratio, goal)
	}
	return tw.Flush()
}
