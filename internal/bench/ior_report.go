package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the report as indented JSON.
func (r *IORReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// cell returns the summary of one cell, or nil if it was not measured.
func (r *IORReport) cell(n, m int, on bool, phase string) *IORCell {
	for i := range r.Cells {
		c := &r.Cells[i]
		if c.DataServers == n && max(c.Mirrors, 1) == m && c.PNFS == on && c.Phase == phase {
			return c
		}
	}
	return nil
}

// replicated reports whether the report measured more than one copy
// anywhere, so its tables need a column for the copies.
func (r *IORReport) replicated() bool {
	return len(r.Config.Mirrors) > 1 || slices.Max(r.Config.Copies()) > 1
}

// rows calls f for every cluster of the matrix, with its first
// column(s): the data-server count, and the copies when replicated.
func (r *IORReport) rows(tw io.Writer, f func(n, m int)) {
	for _, n := range r.Config.DataServers {
		for _, m := range r.Config.Copies() {
			if r.replicated() {
				fmt.Fprintf(tw, "%d\t%d", n, m)
			} else {
				fmt.Fprintf(tw, "%d", n)
			}
			f(n, m)
			fmt.Fprintln(tw)
		}
	}
}

// WriteTable writes the report for a terminal: the machine and the
// configuration, a bandwidth table with a row per data-server count and a
// column per phase and pNFS mode, the CPU use in the same layout, then
// errors and notes.
func (r *IORReport) WriteTable(w io.Writer) error {
	m, c := r.Machine, r.Config
	fmt.Fprintf(w, "machine: %d CPUs (%s), kernel %s, %s\n", m.NumCPU, m.CPUModel, m.Kernel, m.Go)
	fmt.Fprintf(w, "load average: before %.2f %.2f %.2f, after %.2f %.2f %.2f\n",
		r.LoadBefore[0], r.LoadBefore[1], r.LoadBefore[2], r.LoadAfter[0], r.LoadAfter[1], r.LoadAfter[2])
	layout, order := "file per process", "sequential"
	if c.Shared {
		layout = "one shared file"
	}
	if c.Random {
		order = "random"
	}
	stonewall := ""
	if c.Stonewall > 0 {
		stonewall = fmt.Sprintf(", stonewall %v", c.Stonewall)
	}
	if c.SmallIOThreshold != 0 {
		stonewall += fmt.Sprintf(", small-I/O threshold %d", c.SmallIOThreshold)
	}
	if r.replicated() {
		stonewall += fmt.Sprintf(", copies of every stripe unit %s", joinInts(c.Copies()))
	}
	fmt.Fprintf(w, "ior (%s): %d clients x %s in %s transfers, %s, %s%s, %d reps; servers %s, clients %s\n",
		TargetName(c.Target), c.Clients, FormatSize(c.BlockSize), FormatSize(int64(c.TransferSize)), layout, order, stonewall, c.Reps, r.Servers, r.Clients)
	if c.LinkBitsPerSec > 0 {
		fmt.Fprintf(w, "links: %.0f Mbit/s each; ceiling = raw capacity of the links the traffic crosses\n", c.LinkBitsPerSec/1e6)
		if r.replicated() {
			fmt.Fprintln(w, "  with m copies: pNFS write min(clients, DS/m) links (each byte enters the data servers m times), read min(clients, DS) links; pNFS off write 1/m link")
		}
	}
	first := "DS"
	if r.replicated() {
		first = "DS\tcopies"
	}

	type col struct {
		phase string
		on    bool
	}
	var cols []col
	for _, phase := range []string{PhaseWrite, PhaseRead} {
		for _, on := range c.PNFS {
			cols = append(cols, col{phase, on})
		}
	}
	header := func(tw io.Writer, first string) {
		fmt.Fprint(tw, first)
		for _, cl := range cols {
			fmt.Fprintf(tw, "\t%s pNFS %s", cl.phase, modeName(cl.on))
		}
		fmt.Fprintln(tw)
	}

	fmt.Fprintln(w, "\naggregate bandwidth, MB/s: median [min-max] (ceiling; machine CPU busy)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header(tw, first)
	r.rows(tw, func(n, m int) {
		for _, cl := range cols {
			cell := r.cell(n, m, cl.on, cl.phase)
			switch {
			case cell == nil:
				fmt.Fprint(tw, "\t-")
			default:
				mark := ""
				switch {
				case cl.on && cell.DSShare < pnfsShareOK:
					mark = " *"
				case !cl.on && cell.DSShare > 0:
					mark = " !"
				}
				extra := ""
				if cell.CeilingMBps > 0 {
					extra = fmt.Sprintf(" (%.0f%% of %s", 100*cell.Median/cell.CeilingMBps, FormatRate(cell.CeilingMBps))
					if cell.Busy >= 0 {
						extra += fmt.Sprintf("; %.0f%%", 100*cell.Busy)
					}
					extra += ")"
				} else if cell.Busy >= 0 {
					extra = fmt.Sprintf(" (%.0f%% busy)", 100*cell.Busy)
				}
				fmt.Fprintf(tw, "\t%s [%s-%s]%s%s", FormatRate(cell.Median), FormatRate(cell.Min), FormatRate(cell.Max), extra, mark)
			}
		}
	})
	if err := tw.Flush(); err != nil {
		return err
	}

	split := false
	for _, cell := range r.Cells {
		_, mds := cell.RoleCores[RoleMDS]
		split = split || mds
	}
	if split {
		fmt.Fprintln(w, "\nCPU in cores, median: MDS / DSes / clients, of", m.NumCPU)
	} else {
		fmt.Fprintln(w, "\nCPU in cores, median: servers (MDS+DSes) / clients, of", m.NumCPU)
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header(tw, first)
	r.rows(tw, func(n, m int) {
		for _, cl := range cols {
			cell := r.cell(n, m, cl.on, cl.phase)
			if cell == nil {
				fmt.Fprint(tw, "\t-")
				continue
			}
			if split {
				fmt.Fprintf(tw, "\t%s / %s / %s", roleCores(cell, RoleMDS), roleCores(cell, RoleDS), cores(cell.ClientCores))
			} else {
				fmt.Fprintf(tw, "\t%s / %s", cores(cell.ServerCores), cores(cell.ClientCores))
			}
		}
	})
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nCPU-seconds per GiB moved, median: servers / clients (less sensitive to a busy machine than MB/s)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header(tw, first)
	r.rows(tw, func(n, m int) {
		for _, cl := range cols {
			cell := r.cell(n, m, cl.on, cl.phase)
			if cell == nil {
				fmt.Fprint(tw, "\t-")
				continue
			}
			fmt.Fprintf(tw, "\t%s / %s", cores(cell.ServerCPUPerGiB), cores(cell.ClientCPUPerGiB))
		}
	})
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, n := range c.DataServers {
		for _, m := range c.Copies() {
			for _, on := range c.PNFS {
				if cell := r.cell(n, m, on, PhaseWrite); cell != nil && cell.CommitSeconds > 0 {
					fmt.Fprintf(w, "%s, pNFS %s: the closing COMMIT+CLOSE took %.2fs (median, slowest client)\n", clusterName(c, n, m), modeName(on), cell.CommitSeconds)
				}
			}
		}
	}
	fmt.Fprintln(w)

	for _, e := range r.Errors {
		fmt.Fprintf(w, "FAILED: %s\n", e)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	for _, p := range r.Profiles {
		fmt.Fprintf(w, "cluster CPU profile: %s (go tool pprof -top %s)\n", p, p)
	}
	return nil
}

func cores(c float64) string {
	if c < 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", c)
}

func roleCores(cell *IORCell, role string) string {
	c, ok := cell.RoleCores[role]
	if !ok {
		return "-"
	}
	return cores(c)
}

// joinInts renders v as "1,2".
func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
