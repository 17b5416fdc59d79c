// Package benchplot draws the charts of `shoal bench plot` (PNG and SVG,
// with gonum.org/v1/plot) from the reports that package bench reads back
// from JSON. It is a package of its own so that package bench, and the
// shoal binary built with -tags noplot, do not link the plotting library
// and its fonts and image encoders: a server has no use for them.
package benchplot

import (
	"errors"
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/shoalfs/shoal/internal/bench"
)

// series is one line of a plot.
type series struct {
	name   string
	pts    plotter.XYs
	dashed bool
	color  color.Color
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
func collect(reps []*bench.IORReport, x func(*bench.IORReport, *bench.IORCell) float64) []series {
	m := map[string]*series{}
	for _, rep := range reps {
		for i := range rep.Cells {
			c := &rep.Cells[i]
			k := bench.SeriesName(rep.Config.Target, c.PNFS, c.Phase)
			s := m[k]
			if s == nil {
				s = &series{name: k, color: palette[k]}
				m[k] = s
			}
			s.pts = append(s.pts, plotter.XY{X: x(rep, c), Y: c.Median})
		}
	}
	var out []series
	for _, k := range seriesOrder {
		if s := m[k]; s != nil {
			sort.Slice(s.pts, func(i, j int) bool { return s.pts[i].X < s.pts[j].X })
			out = append(out, *s)
		}
	}
	return out
}

// ceilingLines are the raw link capacities (ceilingMBps): with pNFS
// min(clients, DS) links, and one link for everything through a single
// server when the reports measured one. Where a write's ceiling differs
// from a read's (more than one copy: min(clients, DS/copies) links) each
// phase gets a line of its own.
func ceilingLines(reps []*bench.IORReport, x func(*bench.IORReport, *bench.IORCell) float64) []series {
	write, read := map[float64]float64{}, map[float64]float64{}
	link := map[float64]float64{}
	single := false
	for _, rep := range reps {
		for i := range rep.Cells {
			c := &rep.Cells[i]
			if c.CeilingMBps <= 0 {
				continue
			}
			if !c.PNFS || bench.TargetName(rep.Config.Target) != bench.TargetShoal {
				single = true
				continue
			}
			xv := x(rep, c)
			if c.Phase == bench.PhaseWrite {
				if _, ok := write[xv]; !ok {
					write[xv] = c.CeilingMBps
					link[xv] = rep.Config.LinkBitsPerSec / 8 / 1e6
				}
			} else if _, ok := read[xv]; !ok {
				read[xv] = c.CeilingMBps
			}
		}
	}
	if len(write) == 0 {
		return nil
	}
	line := func(name string, c color.Color, m map[float64]float64) series {
		s := series{name: name, dashed: true, color: c}
		for xv, y := range m {
			s.pts = append(s.pts, plotter.XY{X: xv, Y: y})
		}
		sort.Slice(s.pts, func(i, j int) bool { return s.pts[i].X < s.pts[j].X })
		return s
	}
	same := true
	for xv, y := range read {
		if w, ok := write[xv]; ok && w != y {
			same = false
		}
	}
	var out []series
	if same {
		out = append(out, line("ceiling: min(clients, DS) links", color.Black, write))
	} else {
		out = append(out,
			line("write ceiling: min(clients, DS/copies) links", color.Black, write),
			line("read ceiling: min(clients, DS) links", color.RGBA{0x17, 0xbe, 0xcf, 0xff}, read))
	}
	if single {
		out = append(out, line("ceiling: one link (single server)", color.Gray{Y: 0x80}, link))
	}
	return out
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

// Write draws what r holds into dir: throughput against data servers
// (sweep "ds"), clients (sweep "clients") and transfer size (sweep
// "block"), each with the link ceiling, the cost of copies (sweep
// "mirrors") and the small-file rates. It returns the files written, also
// when drawing some of them failed.
func Write(r *bench.Results, dir string) ([]string, error) {
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
	for _, l := range r.Labels(bench.SweepDS) {
		reps := r.Sweep(l)
		x := func(_ *bench.IORReport, c *bench.IORCell) float64 { return float64(c.DataServers) }
		lines := append(collect(reps, x), ceilingLines(reps, x)...)
		title := fmt.Sprintf("Throughput vs data servers (%d clients, %.0f Mbit/s links)", reps[0].Config.Clients, reps[0].Config.LinkBitsPerSec/1e6)
		p, err := linePlot(title, "data servers", mb, lines)
		if err == nil {
			add(save(p, dir, "scaling-"+l))
		} else {
			errs = append(errs, err)
		}
	}
	if reps := r.Sweep(bench.SweepClients); len(reps) > 0 {
		x := func(rep *bench.IORReport, _ *bench.IORCell) float64 { return float64(rep.Config.Clients) }
		lines := append(collect(reps, x), ceilingLines(reps, x)...)
		title := fmt.Sprintf("Throughput vs clients (%d data servers)", maxDS(reps))
		p, err := linePlot(title, "clients", mb, lines)
		if err == nil {
			add(save(p, dir, "scaling-clients"))
		} else {
			errs = append(errs, err)
		}
	}
	if reps := r.Sweep(bench.SweepBlock); len(reps) > 0 {
		x := func(rep *bench.IORReport, _ *bench.IORCell) float64 { return float64(rep.Config.TransferSize) / 1024 }
		lines := append(collect(reps, x), ceilingLines(reps, x)...)
		title := fmt.Sprintf("Throughput vs transfer size (%d clients, %d data servers)", reps[0].Config.Clients, maxDS(reps))
		p, err := linePlot(title, "transfer (block) size, KiB, log scale", mb, lines)
		if err == nil {
			p.X.Scale = plot.LogScale{}
			p.X.Tick.Marker = plot.LogTicks{Prec: -1}
			var ticks []plot.Tick
			for kib := 32.0; kib <= 4096; kib *= 2 {
				ticks = append(ticks, plot.Tick{Value: kib, Label: bench.FormatSize(int64(kib * 1024))})
			}
			p.X.Tick.Marker = plot.ConstantTicks(ticks)
			add(save(p, dir, "blocksize"))
		} else {
			errs = append(errs, err)
		}
	}
	// The cost of copies: a bar per phase for every number of copies, at
	// the largest data-server count of each "mirrors" sweep.
	for _, l := range r.Labels(bench.SweepMirrors) {
		add(mirrorsPlot(r.Sweep(l), dir, l))
	}
	if len(r.Meta) > 0 {
		add(metaPlot(r, dir))
	}
	return files, errors.Join(errs...)
}

// seriesOrder is the order of the lines and bars in every plot.
var seriesOrder = []string{"Shoal pNFS write", "Shoal pNFS read", "Shoal pNFS off write", "Shoal pNFS off read", "NFS-Ganesha write", "NFS-Ganesha read"}

// mirrorsPlot draws a sweep over the number of copies as grouped bars:
// for every number of copies, a bar per phase (and mode) at its median
// MB/s, each capped by a dashed mark at its own ceiling (ceilingMBps:
// with m copies a write's is min(clients, DS/m) links, a read's
// min(clients, DS)) and labelled with its share of it. The bars are drawn
// as polygons in data coordinates so the marks sit exactly over them.
func mirrorsPlot(reps []*bench.IORReport, dir, name string) ([]string, error) {
	reps = largestDS(reps)
	type bar struct {
		key        string
		copies     int
		mbps, ceil float64
	}
	var bars []bar
	var copies []int
	var keys []string
	top := 0.0
	for _, rep := range reps {
		for _, c := range rep.Cells {
			b := bar{bench.SeriesName(rep.Config.Target, c.PNFS, c.Phase), max(c.Mirrors, 1), c.Median, c.CeilingMBps}
			bars = append(bars, b)
			top = max(top, b.mbps, b.ceil)
			if !slices.Contains(copies, b.copies) {
				copies = append(copies, b.copies)
			}
			if !slices.Contains(keys, b.key) {
				keys = append(keys, b.key)
			}
		}
	}
	if len(bars) == 0 {
		return nil, nil
	}
	slices.Sort(copies)
	slices.SortFunc(keys, func(a, b string) int { return slices.Index(seriesOrder, a) - slices.Index(seriesOrder, b) })
	c := reps[0].Config
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Cost of copies (%d data servers, %d clients, %.0f Mbit/s links)", maxDS(reps), c.Clients, c.LinkBitsPerSec/1e6)
	p.X.Label.Text = "copies of every stripe unit (shoal mds --mirrors)"
	p.Y.Label.Text = "aggregate MB/s (10^6 B/s)"
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	// Room above the bars for their labels and the legend.
	p.Y.Min, p.Y.Max = 0, 1.45*top
	p.X.Min, p.X.Max = -0.5, float64(len(copies))-0.5
	var ticks []plot.Tick
	for i, m := range copies {
		label := fmt.Sprintf("%d copies", m)
		if m == 1 {
			label = "1 copy"
		}
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: label})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	slot := 0.8 / float64(len(keys))
	var labels plotter.XYLabels
	var ceilLine *plotter.Line
	for j, k := range keys {
		var legend plot.Thumbnailer
		for _, b := range bars {
			if b.key != k {
				continue
			}
			x := float64(slices.Index(copies, b.copies)) - 0.4 + slot*(float64(j)+0.5)
			lo, hi := x-0.4*slot, x+0.4*slot
			poly, err := plotter.NewPolygon(plotter.XYs{{X: lo, Y: 0}, {X: hi, Y: 0}, {X: hi, Y: b.mbps}, {X: lo, Y: b.mbps}})
			if err != nil {
				return nil, err
			}
			poly.Color, poly.LineStyle.Width = palette[k], 0
			p.Add(poly)
			legend = poly
			text := bench.FormatRate(b.mbps)
			y := b.mbps
			if b.ceil > 0 {
				mark, err := plotter.NewLine(plotter.XYs{{X: lo - 0.05*slot, Y: b.ceil}, {X: hi + 0.05*slot, Y: b.ceil}})
				if err != nil {
					return nil, err
				}
				mark.Color, mark.Width = color.Black, vg.Points(1.5)
				mark.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
				p.Add(mark)
				ceilLine = mark
				text += fmt.Sprintf("\n%.0f%% of %s", 100*b.mbps/b.ceil, bench.FormatRate(b.ceil))
				y = max(y, b.ceil)
			}
			labels.XYs = append(labels.XYs, plotter.XY{X: x, Y: y})
			labels.Labels = append(labels.Labels, text)
		}
		if legend != nil {
			p.Legend.Add(k, legend)
		}
	}
	if ceilLine != nil {
		p.Legend.Add("ceiling of each bar: the links it crosses", ceilLine)
	}
	lab, err := plotter.NewLabels(labels)
	if err != nil {
		return nil, err
	}
	for i := range lab.TextStyle {
		lab.TextStyle[i].XAlign = text.XCenter
	}
	lab.Offset = vg.Point{Y: vg.Points(4)}
	p.Add(lab)
	return save(p, dir, name)
}

// largestDS returns reps with only the cells of their largest
// data-server count.
func largestDS(reps []*bench.IORReport) []*bench.IORReport {
	n := maxDS(reps)
	out := make([]*bench.IORReport, len(reps))
	for i, rep := range reps {
		cp := *rep
		cp.Cells = slices.DeleteFunc(slices.Clone(rep.Cells), func(c bench.IORCell) bool { return c.DataServers != n })
		out[i] = &cp
	}
	return out
}

func maxDS(reps []*bench.IORReport) int {
	n := 0
	for _, r := range reps {
		n = max(n, slices.Max(r.Config.DataServers))
	}
	return n
}

// metaColumns are the bars' groups: every mdtest phase per layout, then
// postmark.
func metaColumns(r *bench.Results) []string {
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

// metaPlot draws the small-file rates: a group of bars per column, a bar
// per report.
func metaPlot(r *bench.Results, dir string) ([]string, error) {
	cols := metaColumns(r)
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
		p.Legend.Add(bench.MetaLabel(rep), b)
	}
	p.NominalX(cols...)
	p.X.Tick.Label.Rotation = 0.5
	p.X.Tick.Label.XAlign = draw.XRight
	return save(p, dir, "smallfiles")
}
