package accuracy

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// Plot is a chart of admitted requests over time: for each series, the
// fleet's admitted count within the current window, against the limit.
type Plot struct {
	Title string
	// Limit draws a horizontal line.
	Limit float64
	// Length is the time axis's extent, from the run's start.
	Length time.Duration
	Series []PlotSeries
}

// PlotSeries is one line of a plot.
type PlotSeries struct {
	Label  string
	Points []Point
}

// The plot's geometry, in SVG user units, and its line colours (a
// palette that stays apart for the colour-blind: Okabe and Ito's).
const (
	plotW, plotH                         = 760, 340
	marginL, marginR, marginT, marginB   = 56, 190, 34, 44
	plotFont                             = `font-family="sans-serif" font-size="12"`
	limitColor                           = "#000000"
	gridColor                            = "#dddddd"
	axisColor                            = "#444444"
	windowLabel                          = "admitted in the current window"
	timeLabel                            = "time since the traffic started (s); a fixed window per second"
	maxPointsPerSeries                   = 4000
	legendLineLen, legendGap, legendStep = 22, 6, 18
)

var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9"}

// SVG renders the plot as a standalone SVG document.
func (p Plot) SVG() []byte {
	var b strings.Builder
	innerW := float64(plotW - marginL - marginR)
	innerH := float64(plotH - marginT - marginB)
	length := p.Length.Seconds()
	if length <= 0 {
		length = 1
	}
	yMax := p.Limit
	// Points past the time axis (a request sent at the end of the last
	// window and answered in the next) are left out.
	series := make([]PlotSeries, len(p.Series))
	for i, s := range p.Series {
		series[i].Label = s.Label
		for _, pt := range s.Points {
			if pt.T >= 0 && pt.T.Seconds() < length {
				series[i].Points = append(series[i].Points, pt)
				yMax = math.Max(yMax, float64(pt.Admitted))
			}
		}
	}
	yMax = niceCeil(yMax * 1.08)
	x := func(t time.Duration) float64 {
		v := math.Min(math.Max(t.Seconds()/length, 0), 1)
		return float64(marginL) + v*innerW
	}
	y := func(n float64) float64 { return float64(marginT) + innerH - n/yMax*innerH }

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n",
		plotW, plotH, plotW, plotH, plotFont)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", marginL, html.EscapeString(p.Title))

	// Grid: a vertical line per window boundary, horizontal ticks.
	for s := 0.0; s <= length+1e-9; s++ {
		xx := x(time.Duration(s * float64(time.Second)))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", xx, marginT, xx, float64(marginT)+innerH, gridColor)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%g</text>`+"\n", xx, float64(marginT)+innerH+16, s)
	}
	step := niceStep(yMax / 5)
	for v := 0.0; v <= yMax+1e-9; v += step {
		yy := y(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", marginL, yy, float64(marginL)+innerW, yy, gridColor)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g</text>`+"\n", marginL-6, yy+4, v)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="%s"/>`+"\n", marginL, marginT, innerW, innerH, axisColor)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(marginL)+innerW/2, plotH-6, timeLabel)
	fmt.Fprintf(&b, `<text transform="translate(14 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(marginT)+innerH/2, windowLabel)

	// The limit.
	ly := y(p.Limit)
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n",
		marginL, ly, float64(marginL)+innerW, ly, limitColor)

	// The series, as steps: a count holds until the next admitted request,
	// and until its window's end, where it falls back to 0. The first
	// series is drawn widest and the last narrowest, so that lines that
	// coincide (exact rows all stop at the limit) stay visible.
	for i, s := range series {
		color := palette[i%len(palette)]
		width := seriesWidth(i, len(series))
		pts := thin(s.Points, maxPointsPerSeries)
		var path strings.Builder
		window := time.Duration(-1)
		for _, pt := range pts {
			// The run starts at a window's start.
			if w := pt.T.Truncate(Window); w != window {
				if path.Len() > 0 {
					fmt.Fprintf(&path, "H%.1f V%.1f ", x(window+Window), y(0))
				}
				fmt.Fprintf(&path, "M%.1f %.1f ", x(pt.T), y(0))
				window = w
			}
			fmt.Fprintf(&path, "H%.1f V%.1f ", x(pt.T), y(float64(pt.Admitted)))
		}
		if path.Len() > 0 {
			fmt.Fprintf(&path, "H%.1f V%.1f", x(window+Window), y(0))
			fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="%.1f" stroke-opacity="0.9" stroke-linejoin="round"/>`+"\n",
				path.String(), color, width)
		}
	}

	// The legend, right of the plot.
	lx := float64(plotW - marginR + 14)
	ly0 := float64(marginT + 8)
	fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1.5" stroke-dasharray="6 4"/>`+"\n",
		lx, ly0, lx+legendLineLen, ly0, limitColor)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">limit %g</text>`+"\n", lx+legendLineLen+legendGap, ly0+4, p.Limit)
	for i, s := range p.Series {
		yy := ly0 + float64(i+1)*legendStep
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`+"\n",
			lx, yy, lx+legendLineLen, yy, palette[i%len(palette)], seriesWidth(i, len(p.Series)))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+legendLineLen+legendGap, yy+4, html.EscapeString(s.Label))
	}
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

// seriesWidth is the line width of series i of n: the first widest.
func seriesWidth(i, n int) float64 { return 1.5 + 1.1*float64(n-1-i) }

// thin keeps at most n points, always keeping the last of each window
// (its peak), so that a long series stays a small file.
func thin(pts []Point, n int) []Point {
	if len(pts) <= n {
		return pts
	}
	every := (len(pts) + n - 1) / n
	var out []Point
	for i, pt := range pts {
		peak := i+1 == len(pts) || pts[i+1].Admitted < pt.Admitted
		if i%every == 0 || peak {
			out = append(out, pt)
		}
	}
	return out
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, or a multiple
// of the step niceStep picks.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	step := niceStep(v / 5)
	return math.Ceil(v/step) * step
}

// niceStep returns 1, 2 or 5 times a power of ten, at least v.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
