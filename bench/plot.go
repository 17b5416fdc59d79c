package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Sweep labels: the plots group reports by IORConfig.Label.
const (
	SweepDS      = "ds"      // one report, several data-server counts
	SweepClients = "clients" // one report per client count
	SweepBlock   = "block"   // one report per transfer size
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

// labels returns the distinct labels that are prefix or start with
// prefix+"-", in order of appearance.
func (r *Results) labels(prefix string) []string {
	var out []string
	for _, rep := range r.IOR {
		l := rep.Config.Label
		if (l == prefix || strings.HasPrefix(l, prefix+"-")) && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

func (r *Results) label(l string) []*IORReport {
	var out []*IORReport
	for _, rep := range r.IOR {
		if rep.Config.Label == l {
			out = append(out, rep)
		}
	}
	return out
}

// series is one line of a plot.
type series struct {
	name   string
	pts    plotter.XYs
	dashed bool
	color  color.Color
}

// seriesKey names a line by target, pNFS mode and phase.
func seriesKey(target string, on bool, phase string) string {
	if targetName(target) == TargetGanesha {
		return "NFS-Ganesha " + phase
	}
	if on {
		return "Shoal pNFS " + phase
	}
	return "Shoal pNFS off " + phase
}

var palette = map[string]color.Color{
	"Shoal pNFS write":     color.RGBA{0x1f, 0x77, 0xb4, 0xff},
	"Shoal pNFS read":      color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	"Shoal pNFS off write": color.RGBA{0xff, 0x7f, 0x0e, 0xff},
	"Shoal pNFS off read":  color.RGBA{0xd6, 0x27, 0x28, 0xff},
	"NFS-Ganesha write":    color.RGBA{0x94, 0x67, 0xbd, 0xff},
	"NFS-Ganesha read":     color.RGBA{0x8c, 0x56, 0x4b, 0xff},
}

// collect adds, for every cell of every report, the point (x(rep, cell),
// median MB/s) to the line of its target, mode and phase, and returns the
// lines in a stable order.
func collect(reps []*IORReport, x func(*IORReport, *IORCell) float64) []series {
	m := map[string]*series{}
	for _, rep := range reps {
		for i := range rep.Cells {
			c := &rep.Cells[i]
			k := seriesKey(rep.Config.Target, c.PNFS, c.Phase)
			s := m[k]
			if s == nil {
				s = &series{name: k, color: palette[k]}
				m[k] = s
			}
			s.pts = append(s.pts, plotter.XY{X: x(rep, c), Y: c.Median})
		}
	}
	var out []series
	for _, k := range []string{"Shoal pNFS write", "Shoal pNFS read", "Shoal pNFS off write", "Shoal pNFS off read", "NFS-Ganesha write", "NFS-Ganesha read"} {
		if s := m[k]; s != nil {
			sort.Slice(s.pts, func(i, j int) bool { return s.pts[i].X < s.pts[j].X })
			out = append(out, *s)
		}
	}
	return out
}

// ceilingLines are the raw link capacities: with pNFS min(clients, DS)
// links, and one link for everything through a single server.
func ceilingLines(reps []*IORReport, x func(*IORReport, *IORCell) float64) []series {
	pn := series{name: "ceiling: min(clients, DS) links", dashed: true, color: color.Black}
	one := series{name: "ceiling: one link (single server)", dashed: true, color: color.Gray{Y: 0x80}}
	seen := map[float64]bool{}
	for _, rep := range reps {
		for i := range rep.Cells {
			c := &rep.Cells[i]
			if c.CeilingMBps <= 0 || c.Phase != PhaseWrite || targetName(rep.Config.Target) != TargetShoal {
				continue
			}
			xv := x(rep, c)
			if c.PNFS && !seen[xv] {
				seen[xv] = true
				pn.pts = append(pn.pts, plotter.XY{X: xv, Y: c.CeilingMBps})
				one.pts = append(one.pts, plotter.XY{X: xv, Y: rep.Config.LinkBitsPerSec / 8 / 1e6})
			}
		}
	}
	if len(pn.pts) == 0 {
		return nil
	}
	for _, s := range []*series{&pn, &one} {
		sort.Slice(s.pts, func(i, j int) bool { return s.pts[i].X < s.pts[j].X })
	}
	return []series{pn, one}
}

// linePlot draws lines on a new plot.
func linePlot(title, xlabel, ylabel string, lines []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	for _, s := range lines {
		l, pts, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		if s.color != nil {
			l.Color, pts.Color = s.color, s.color
		}
		l.Width = vg.Points(1.5)
		if s.dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			pts.Radius = 0
			p.Add(l)
		} else {
			pts.Shape = draw.CircleGlyph{}
			p.Add(l, pts)
		}
		p.Legend.Add(s.name, l)
	}
	return p, nil
}

// save writes p as NAME.png and NAME.svg in dir.
func save(p *plot.Plot, dir, name string) ([]string, error) {
	var out []string
	for _, ext := range []string{".png", ".svg"} {
		path := filepath.Join(dir, name+ext)
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return out, fmt.Errorf("save %s: %w", path, err)
		}
		out = append(out, path)
	}
	return out, nil
}

// WritePlots draws what the results hold into dir: throughput against
// data servers (sweep "ds"), clients (sweep "clients") and transfer size
// (sweep "block"), each with the link ceiling, and the small-file rates.
// It returns the files written.
func (r *Results) WritePlots(dir string) ([]string, error) {
	var files []string
	var errs []error
	add := func(f []string, err error) {
		files = append(files, f...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	mb := "aggregate MB/s (10^6 B/s)"
	// A data-server sweep may be repeated at other link rates under
	// labels "ds-RATE"; each gets a plot of its own.
	for _, l := range r.labels(SweepDS) {
		reps := r.label(l)
		x := func(_ *IORReport, c *IORCell) float64 { return float64(c.DataServers) }
		lines := append(collect(reps, x), ceilingLines(reps, x)...)
		title := fmt.Sprintf("Throughput vs data servers (%d clients, %.0f Mbit/s links)", reps[0].Config.Clients, reps[0].Config.LinkBitsPerSec/1e6)
		p, err := linePlot(title, "data servers", mb, lines)
		if err == nil {
			add(save(p, dir, "scaling-"+l))
		} else {
			errs = append(errs, err)
		}
	}
	if reps := r.label(SweepClients); len(reps) > 0 {
		x := func(rep *IORReport, _ *IORCell) float64 { return float64(rep.Config.Clients) }
		lines := append(collect(reps, x), ceilingLines(reps, x)...)
		title := fmt.Sprintf("Throughput vs clients (%d data servers)", maxDS(reps))
		p, err := linePlot(title, "clients", mb, lines)
		if err == nil {
			add(save(p, dir, "scaling-clients"))
		} else {
			errs = append(errs, err)
		}
	}
	if reps := r.label(SweepBlock); len(reps) > 0 {
		x := func(rep *IORReport, _ *IORCell) float64 { return float64(rep.Config.TransferSize) / 1024 }
		lines := append(collect(reps, x), ceilingLines(reps, x)...)
		title := fmt.Sprintf("Throughput vs transfer size (%d clients, %d data servers)", reps[0].Config.Clients, maxDS(reps))
		p, err := linePlot(title, "transfer (block) size, KiB, log scale", mb, lines)
		if err == nil {
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = plot.LogTicks{Prec: -1}
			var ticks []plot.Tick
			for kib := 32.0; kib <= 4096; kib *= 2 {
				ticks = append(ticks, plot.Tick{Value: kib, Label: FormatSize(int64(kib * 1024))})
			}
			p.X.Tick.Marker = plot.ConstantTicks(ticks)
			add(save(p, dir, "blocksize"))
		} else {
			errs = append(errs, err)
		}
	}
	if len(r.Meta) > 0 {
		add(r.metaPlot(dir))
	}
	return files, errors.Join(errs...)
}

func maxDS(reps []*IORReport) int {
	n := 0
	for _, r := range reps {
		n = max(n, slices.Max(r.Config.DataServers))
	}
	return n
}

// metaName labels a metadata report in the plots and tables.
func metaLabel(r *MetaReport) string {
	if targetName(r.Config.Target) == TargetGanesha {
		return "NFS-Ganesha"
	}
	if r.Config.PNFS {
		return fmt.Sprintf("Shoal pNFS (%d DS)", r.Config.DataServers)
	}
	return fmt.Sprintf("Shoal pNFS off (%d DS)", r.Config.DataServers)
}

// metaColumns are the bars' groups: every mdtest phase per layout, then
// postmark.
func (r *Results) metaColumns() []string {
	var cols []string
	for _, rep := range r.Meta {
		for _, m := range rep.Runs {
			k := strings.TrimSpace(m.Phase + " " + m.Dir)
			if !slices.Contains(cols, k) {
				cols = append(cols, k)
			}
		}
	}
	return cols
}

func (r *Results) metaPlot(dir string) ([]string, error) {
	cols := r.metaColumns()
	p := plot.New()
	p.Title.Text = "Small-file rates (mdtest- and postmark-like)"
	p.Y.Label.Text = "operations per second (postmark: transactions)"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	w := vg.Points(14)
	colors := []color.Color{palette["Shoal pNFS write"], palette["Shoal pNFS off write"], palette["NFS-Ganesha write"], palette["Shoal pNFS read"]}
	for i, rep := range r.Meta {
		vals := make(plotter.Values, len(cols))
		for _, m := range rep.Runs {
			vals[slices.Index(cols, strings.TrimSpace(m.Phase+" "+m.Dir))] = m.Rate
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, err
		}
		b.LineStyle.Width = 0
		b.Color = colors[i%len(colors)]
		b.Offset = w * vg.Length(float64(i)-float64(len(r.Meta)-1)/2)
		p.Add(b)
		p.Legend.Add(metaLabel(rep), b)
	}
	p.NominalX(cols...)
	p.X.Tick.Label.Rotation = 0.5
	p.X.Tick.Label.XAlign = draw.XRight
	return save(p, dir, "smallfiles")
}

// WriteMarkdown writes every result as Markdown tables: bandwidth with
// its ceiling and the CPU use per run, so a reader can tell whether the
// network or the CPU was the limit.
func (r *Results) WriteMarkdown(w io.Writer) error {
	for _, sweep := range append(r.labels(SweepDS), SweepClients, SweepBlock) {
		reps := r.label(sweep)
		if len(reps) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n### Sweep: %s\n\n", sweep)
		fmt.Fprintln(w, "| target | clients | DS | transfer | phase | MB/s median [min-max] | ceiling MB/s | % of ceiling | via DS | server cores (MDS/DS) | client cores | machine CPU busy |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
		for _, rep := range reps {
			c := rep.Config
			for _, cell := range rep.Cells {
				name := seriesKey(c.Target, cell.PNFS, "")
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
				fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s [%s-%s] | %.0f | %s | %.0f%% | %s | %s | %s |\n",
					strings.TrimSpace(name), c.Clients, cell.DataServers, FormatSize(int64(c.TransferSize)), cell.Phase,
					num(cell.Median), num(cell.Min), num(cell.Max), cell.CeilingMBps, pct, 100*cell.DSShare,
					role, cores(cell.ClientCores), busy)
			}
		}
		if strings.HasPrefix(sweep, SweepDS) {
			writeChecks(w, CheckDS(reps))
		}
	}
	if len(r.Meta) > 0 {
		fmt.Fprint(w, "\n### Small files\n\n")
		fmt.Fprintln(w, "| target | clients | phase | dir | ops/s | ops | seconds | server cores | client cores | machine CPU busy |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
		for _, rep := range r.Meta {
			for _, m := range rep.Runs {
				fmt.Fprintf(w, "| %s | %d | %s | %s | %.0f | %d | %.2f | %s | %s | %.0f%% |\n", metaLabel(rep), rep.Config.Clients,
					m.Phase, m.Dir, m.Rate, m.Ops, m.Seconds, cores(m.ServerCores), cores(m.ClientCores), 100*m.Busy)
			}
		}
	}
	return nil
}
