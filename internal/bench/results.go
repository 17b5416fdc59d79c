package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Sweep labels: the plots and tables group reports by IORConfig.Label.
const (
	SweepDS      = "ds"      // one report, several data-server counts
	SweepClients = "clients" // one report per client count
	SweepBlock   = "block"   // one report per transfer size
	SweepMirrors = "mirrors" // one report, several numbers of copies
)

// Results is a set of reports read back from JSON, as `shoal bench plot`
// sees a directory.
type Results struct {
	IOR  []*IORReport
	Meta []*MetaReport
}

// LoadResults reads every *.json report in dir (ior and meta; other JSON
// is skipped).
func LoadResults(dir string) (*Results, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	res := &Results{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var kind struct {
			Kind string `json:"kind"`
		}
		if json.Unmarshal(b, &kind) != nil {
			continue
		}
		switch kind.Kind {
		case IOR:
			var r IORReport
			if err := json.Unmarshal(b, &r); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			// Reports from before copies were recorded kept one.
			for i := range r.Cells {
				r.Cells[i].Mirrors = max(r.Cells[i].Mirrors, 1)
			}
			for i := range r.Runs {
				r.Runs[i].Mirrors = max(r.Runs[i].Mirrors, 1)
			}
			res.IOR = append(res.IOR, &r)
		case "meta":
			var r MetaReport
			if err := json.Unmarshal(b, &r); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			res.Meta = append(res.Meta, &r)
		}
	}
	return res, nil
}

// Labels returns the distinct sweep labels of the IOR reports that are
// prefix or start with prefix+"-" (a sweep repeated at another link rate
// is "ds-RATE"), in order of appearance.
func (r *Results) Labels(prefix string) []string {
	var out []string
	for _, rep := range r.IOR {
		l := rep.Config.Label
		if (l == prefix || strings.HasPrefix(l, prefix+"-")) && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// Sweep returns the IOR reports labelled exactly l, in order of
// appearance.
func (r *Results) Sweep(l string) []*IORReport {
	var out []*IORReport
	for _, rep := range r.IOR {
		if rep.Config.Label == l {
			out = append(out, rep)
		}
	}
	return out
}

// SeriesName names the results of a target, pNFS mode and phase ("Shoal
// pNFS write"): a line or bar of the plots, a row of the tables (with an
// empty phase).
func SeriesName(target string, on bool, phase string) string {
	if TargetName(target) == TargetGanesha {
		return "NFS-Ganesha " + phase
	}
	if on {
		return "Shoal pNFS " + phase
	}
	return "Shoal pNFS off " + phase
}

// MetaLabel names a metadata report in the plots and tables.
func MetaLabel(r *MetaReport) string {
	if TargetName(r.Config.Target) == TargetGanesha {
		return "NFS-Ganesha"
	}
	if r.Config.PNFS {
		return fmt.Sprintf("Shoal pNFS (%d DS)", r.Config.DataServers)
	}
	return fmt.Sprintf("Shoal pNFS off (%d DS)", r.Config.DataServers)
}

// WriteMarkdown writes every result as Markdown tables: bandwidth with
// its ceiling and the CPU use per run, so a reader can tell whether the
// network or the CPU was the limit.
func (r *Results) WriteMarkdown(w io.Writer) error {
	sweeps := append(r.Labels(SweepDS), SweepClients, SweepBlock)
	for _, sweep := range append(sweeps, r.Labels(SweepMirrors)...) {
		reps := r.Sweep(sweep)
		if len(reps) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### Sweep: %s\n\n", sweep)
		fmt.Fprintln(w, "| target | clients | DS | copies | transfer | phase | MB/s median [min-max] | ceiling MB/s | % of ceiling | via DS | server cores (MDS/DS) | client cores | machine CPU busy |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, rep := range reps {
			c := rep.Config
			for _, cell := range rep.Cells {
				name := SeriesName(c.Target, cell.PNFS, "")
				pct := "-"
				if cell.CeilingMBps > 0 {
					pct = fmt.Sprintf("%.0f%%", 100*cell.Median/cell.CeilingMBps)
				}
				role := cores(cell.ServerCores)
				if _, ok := cell.RoleCores[RoleMDS]; ok {
					role = fmt.Sprintf("%s (%s/%s)", role, roleCores(&cell, RoleMDS), roleCores(&cell, RoleDS))
				}
				busy := "-"
				if cell.Busy >= 0 {
					busy = fmt.Sprintf("%.0f%%", 100*cell.Busy)
				}
				fmt.Fprintf(w, "| %s | %d | %d | %d | %s | %s | %s [%s-%s] | %.0f | %s | %.0f%% | %s | %s | %s |\n",
					strings.TrimSpace(name), c.Clients, cell.DataServers, max(cell.Mirrors, 1), FormatSize(int64(c.TransferSize)), cell.Phase,
					FormatRate(cell.Median), FormatRate(cell.Min), FormatRate(cell.Max), cell.CeilingMBps, pct, 100*cell.DSShare,
					role, cores(cell.ClientCores), busy)
			}
		}
		switch {
		case sweep == SweepDS || strings.HasPrefix(sweep, SweepDS+"-"):
			writeChecks(w, "pNFS issue: scaling shape", CheckDS(reps))
		case sweep == SweepMirrors || strings.HasPrefix(sweep, SweepMirrors+"-"):
			writeChecks(w, "replication issue: cost of copies", CheckMirrors(reps))
		}
	}
	if len(r.Meta) > 0 {
		fmt.Fprint(w, "\n### Small files\n\n")
		fmt.Fprintln(w, "| target | clients | phase | dir | ops/s | ops | seconds | server cores | client cores | machine CPU busy |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
		for _, rep := range r.Meta {
			for _, m := range rep.Runs {
				fmt.Fprintf(w, "| %s | %d | %s | %s | %.0f | %d | %.2f | %s | %s | %.0f%% |\n", MetaLabel(rep), rep.Config.Clients,
					m.Phase, m.Dir, m.Rate, m.Ops, m.Seconds, cores(m.ServerCores), cores(m.ClientCores), 100*m.Busy)
			}
		}
	}
	return nil
}
