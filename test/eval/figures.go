package main

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The figures: boxes of each variant's runs per rate, and each variant's
// median phases stacked, drawn for the width GitHub shows them at.

// palette colours variants alike across figures.
var palette = []color.Color{
	color.RGBA{0x34, 0x98, 0xdb, 0xff}, color.RGBA{0xc0, 0x39, 0x2b, 0xff}, color.RGBA{0x2e, 0xcc, 0x71, 0xff},
	color.RGBA{0xf1, 0xc4, 0x0f, 0xff}, color.RGBA{0x9b, 0x59, 0xb6, 0xff}, color.RGBA{0xe6, 0x7e, 0x22, 0xff},
	color.RGBA{0x16, 0xa0, 0x85, 0xff}, color.RGBA{0x7f, 0x8c, 0x8d, 0xff}, color.RGBA{0xe8, 0x43, 0x93, 0xff},
	color.RGBA{0x95, 0xa5, 0xa6, 0xff}, color.RGBA{0xd3, 0x54, 0x00, 0xff},
}

func variantColor(cells []cell, variant string) color.Color {
	var seen []string
	for _, c := range cells {
		if !slices.Contains(seen, c.variant) {
			seen = append(seen, c.variant)
		}
	}
	return palette[slices.Index(seen, variant)%len(palette)]
}

// minSeconds is where a log axis starts: a downtime of 0 is drawn at 1 ms.
const minSeconds = 0.001

// fontPixels is a size in points as GitHub shows it.
func fontPixels(points float64) float64 { return points / 72 * shownPPI }

// valuesOf are value's figures (seconds) of c's runs that succeeded, and of
// those that did not, which the boxes leave out.
func valuesOf(c cell, value func(migrationRun) (float64, bool)) (succeeded, rolledBack plotter.Values) {
	for _, r := range c.runs {
		v, ok := value(r)
		if !ok {
			continue
		}
		if r.succeeded() {
			succeeded = append(succeeded, max(v/1000, minSeconds))
		} else {
			rolledBack = append(rolledBack, max(v/1000, minSeconds))
		}
	}
	return succeeded, rolledBack
}

// boxes draws, in one panel per rate, one box per cell of value (in
// seconds): every run counts, the box spans the quartiles around the
// median. With log, on a log axis: downtimes of tens of milliseconds and of
// seconds are both readable.
func boxes(cells []cell, title string, value func(migrationRun) (float64, bool), log bool, base string) error {
	top := minSeconds
	for _, c := range cells {
		ok, back := valuesOf(c, value)
		for _, v := range append(ok, back...) {
			top = max(top, v)
		}
	}
	marked := false // the legend names the mark once
	var panels []*plot.Plot
	for _, group := range byRate(cells) {
		p := panel(title, group)
		p.Y.Min, p.Y.Max = 0, top*1.05
		p.Y.Label.Text = "seconds"
		if log {
			p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
			p.Y.Min, p.Y.Max = minSeconds, top*1.5
			p.Y.Label.Text = "seconds (log)"
		}
		for i, c := range group {
			vs, back := valuesOf(c, value)
			if len(vs) > 0 {
				b, err := plotter.NewBoxPlot(vg.Points(16), float64(i), vs)
				if err != nil {
					return err
				}
				b.FillColor = variantColor(cells, c.variant)
				p.Add(b)
			}
			if len(back) > 0 {
				xys := make(plotter.XYs, len(back))
				for k, v := range back {
					xys[k] = plotter.XY{X: float64(i) + 0.3, Y: v}
				}
				s, err := plotter.NewScatter(xys)
				if err != nil {
					return err
				}
				s.GlyphStyle = draw.GlyphStyle{Shape: draw.CrossGlyph{}, Color: color.RGBA{R: 0xc0, A: 0xff}, Radius: vg.Points(4)}
				p.Add(s)
				if !marked {
					p.Legend.Add("rolled back (not in the box)", s)
					p.Legend.Top = true
					p.Legend.TextStyle.Font.Size = vg.Points(fontSize)
					marked = true
				}
			}
		}
		panels = append(panels, p)
	}
	return saveGrid(panels, base)
}

// panel is one rate's plot of group's cells, named by variant.
func panel(title string, group []cell) *plot.Plot {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s, %s msg/s", title, group[0].rate)
	p.Title.TextStyle.Font.Size = vg.Points(titleSize)
	p.X.Label.TextStyle.Font.Size, p.Y.Label.TextStyle.Font.Size = vg.Points(fontSize), vg.Points(fontSize)
	p.Y.Tick.Label.Font.Size = vg.Points(fontSize)
	names := make([]string, len(group))
	for i, c := range group {
		names[i] = c.variant
		if n := c.rolledBack(); n > 0 {
			names[i] += fmt.Sprintf(" (%d/%d rolled back)", n, len(c.runs))
		}
	}
	p.NominalX(names...)
	p.X.Tick.Label.Font.Size = vg.Points(fontSize)
	p.X.Tick.Label.Rotation, p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = 0.4, draw.XRight, draw.YCenter
	p.X.Min, p.X.Max = -0.6, float64(len(group))-0.4 // every box or bar whole
	return p
}

// phaseName folds a shadow migration's stages into the phase they are of,
// so that the breakdown has one colour per phase.
func phaseName(column string) string {
	return strings.TrimSuffix(strings.TrimSuffix(column, "_shadow"), "_final")
}

// phases draws, in one panel per rate, each cell's median phases stacked
// (seconds), one colour per phase.
func phases(cells []cell, base string) error {
	// Stacked in the order phases run; any other after them.
	order := []string{"preflight", "setup", "prepare", "stop", "checkpoint", "image", "detach", "restore", "adopt", "replay", "switchover", "cleanup"}
	seen := map[string]bool{}
	for _, c := range cells {
		for _, r := range c.runs {
			for _, name := range r.phaseOrder {
				seen[name] = true
				if !slices.Contains(order, name) {
					order = append(order, name)
				}
			}
		}
	}
	order = slices.DeleteFunc(order, func(name string) bool { return !seen[name] })
	top := 0.0
	sums := map[*cell]float64{}
	medians := map[*cell]map[string]float64{}
	for i := range cells {
		c := &cells[i]
		medians[c] = map[string]float64{}
		sum := 0.0
		for _, name := range order {
			var all []float64
			for _, r := range c.runs {
				if v, ok := r.phases[name]; ok && r.succeeded() { // a rolled-back run's phases are not a migration's
					all = append(all, v/1000)
				}
			}
			medians[c][name] = median(all)
			sum += medians[c][name]
		}
		sums[c] = sum
		top = max(top, sum)
	}
	// One legend, in the panel whose bars are lowest; every panel on one
	// scale, with room for the legend above those bars.
	groups := byRate(cells)
	legendIn, lowest, offset := 0, top, 0
	for g, group := range groups {
		highest := 0.0
		for i := range group {
			highest = max(highest, sums[&cells[offset+i]])
		}
		if highest < lowest {
			legendIn, lowest = g, highest
		}
		offset += len(group)
	}
	yMax := top * 1.05
	if lowest > top*0.45 {
		yMax = lowest * 2.2
	}
	var panels []*plot.Plot
	offset = 0
	for g, group := range groups {
		p := panel("Per-phase breakdown (medians)", group)
		p.Y.Label.Text = "seconds"
		p.Y.Min, p.Y.Max = 0, yMax
		var below *plotter.BarChart
		for k, name := range order {
			vs := make(plotter.Values, len(group))
			for i := range group {
				vs[i] = medians[&cells[offset+i]][name]
			}
			bars, err := plotter.NewBarChart(vs, vg.Points(16))
			if err != nil {
				return err
			}
			bars.Color = palette[k%len(palette)]
			bars.LineStyle.Width = 0
			if below != nil {
				bars.StackOn(below)
			}
			p.Add(bars)
			if g == legendIn {
				p.Legend.Add(name, bars)
			}
			below = bars
		}
		p.Legend.Top, p.Legend.Left = true, false
		p.Legend.TextStyle.Font.Size = vg.Points(fontSize)
		offset += len(group)
		panels = append(panels, p)
	}
	return saveGrid(panels, base)
}

// saveGrid saves panels two to a row in a figure about twice as wide as
// high, PNG and SVG.
func saveGrid(panels []*plot.Plot, base string) error {
	cols := min(2, len(panels))
	rows := (len(panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for r := range grid {
		grid[r] = make([]*plot.Plot, cols)
		for c := range cols {
			if i := r*cols + c; i < len(panels) {
				grid[r][c] = panels[i]
			}
		}
	}
	width := figureWidth
	height := vg.Length(max(3.2, 3.2*float64(rows))) * vg.Inch
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	png, svg := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(2*shownPPI)), vgsvg.New(width, height)
	for _, c := range []vg.CanvasSizer{png, svg} {
		dc := draw.New(c)
		dc.SetColor(color.White)
		dc.Fill(dc.Rectangle.Path())
		canvases := plot.Align(grid, tiles, dc)
		for r := range grid {
			for c, p := range grid[r] {
				if p != nil {
					p.Draw(canvases[r][c])
				}
			}
		}
	}
	for ext, w := range map[string]io.WriterTo{".png": vgimg.PngCanvas{Canvas: png}, ".svg": svg} {
		f, err := os.Create(base + ext)
		if err != nil {
			return err
		}
		_, err = w.WriteTo(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
