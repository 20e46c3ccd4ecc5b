package accuracy

import (
	_ "embed"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/docgen"
)

// resultsTemplate is the part of docs/accuracy.md the harness writes:
// the latest run's figures.
//
//go:embed results.md.tmpl
var resultsTemplate string

// DocCommand is the script that runs the harness; it names the markers
// around the part of docs/accuracy.md it writes.
const DocCommand = "./scripts/bench-accuracy.sh"

// Report is the latest run, as docs/accuracy.md shows it.
type Report struct {
	Date     time.Time
	Machine  string
	Command  string
	Source   string // what Caddy was built from
	Go       string
	Versions []string // of the servers, one line each
	Nodes    int
	Limit    float64
	Duration time.Duration
	Elapsed  time.Duration
	Outcomes []Outcome
	// Spread are the spread clients' rows.
	Spread []SpreadOutcome
	Stores map[string]Store
}

// PlotSpec selects rows to draw together: one pattern and store, one
// series per sync setting.
type PlotSpec struct {
	File    string // under the doc's directory
	Title   string
	Store   string
	Pattern Pattern
	Series  []Setting
}

// Setting is a sync setting: a plotted series.
type Setting struct {
	SyncRate  time.Duration
	SyncAbove float64
}

// DocPlots are the plots of docs/accuracy.md.
func DocPlots() []PlotSpec {
	ms100 := 100 * time.Millisecond
	aboves := []Setting{{0, 0}, {ms100, 0}, {ms100, 0.9}, {ms100, 0.8}}
	rates := []Setting{{0, 0}, {time.Second, 0}, {ms100, 0}, {10 * time.Millisecond, 0}}
	return []PlotSpec{
		{File: "accuracy-redis-steady2x.svg", Title: "Redis, steady 2×: sync_above at sync_rate 100ms", Store: "redis", Pattern: Steady2x, Series: aboves},
		{File: "accuracy-redis-steady2x-rates.svg", Title: "Redis, steady 2×: sync_rate, without sync_above", Store: "redis", Pattern: Steady2x, Series: rates},
		{File: "accuracy-redis-steady5x.svg", Title: "Redis, steady 5×: sync_above at sync_rate 100ms", Store: "redis", Pattern: Steady5x, Series: aboves},
		{File: "accuracy-redis-burst10x.svg", Title: "Redis, burst 10× for 1 s: sync_above at sync_rate 100ms", Store: "redis", Pattern: Burst10x, Series: aboves},
		{File: "accuracy-redis-zipf.svg", Title: "Redis, 100 keys (Zipf), the hottest key: sync_rate 100ms", Store: "redis", Pattern: ManyKeys, Series: aboves},
		{File: "accuracy-postgres-steady2x.svg", Title: "PostgreSQL, steady 2×: sync_above at sync_rate 100ms", Store: "postgres", Pattern: Steady2x, Series: aboves},
	}
}

// docPlot is a plot the doc embeds.
type docPlot struct {
	File, Title string
	plot        Plot
}

// plots returns the plots of the rows that ran.
func (r Report) plots() []docPlot {
	var plots []docPlot
	for _, spec := range DocPlots() {
		p := Plot{Title: spec.Title}
		for _, s := range spec.Series {
			o, ok := Find(r.Outcomes, spec.Store, spec.Pattern, s.SyncRate, s.SyncAbove)
			if !ok {
				continue
			}
			p.Limit = o.Limit
			length := r.Duration
			if spec.Pattern.Length > 0 {
				length = spec.Pattern.Start + spec.Pattern.Length
			}
			// Whole windows: a burst's last one too.
			p.Length = (length + Window - 1).Truncate(Window)
			p.Series = append(p.Series, PlotSeries{Label: seriesLabel(o.Row), Points: o.Series})
		}
		if len(p.Series) > 0 {
			plots = append(plots, docPlot{File: spec.File, Title: spec.Title, plot: p})
		}
	}
	return plots
}

// Markdown is the latest run as docs/accuracy.md holds it, between the
// markers of DocCommand: the run, the promise's checks, the overshoot,
// the design's check, the sync_above table, every row's figures and the
// plots. The harness prints it, and WriteDoc writes it into the page.
func (r Report) Markdown() (string, error) {
	tmpl, err := template.New("results").Parse(resultsTemplate)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	if err := tmpl.Execute(&b, docData{Report: r, Plots: r.plots()}); err != nil {
		return "", err
	}
	return b.String(), nil
}

// WriteDoc replaces the generated part of the page at path (see
// Markdown) and writes the plots as SVG files next to it. Plots of rows
// that did not run are left out.
func (r Report) WriteDoc(path string) error {
	dir := filepath.Dir(path)
	for _, p := range r.plots() {
		if err := os.WriteFile(filepath.Join(dir, p.File), p.plot.SVG(), 0o644); err != nil {
			return err
		}
	}
	md, err := r.Markdown()
	if err != nil {
		return err
	}
	return docgen.ReplaceFile(path, DocCommand, md)
}

// seriesLabel names a row's sync setting in a legend.
func seriesLabel(r Row) string {
	switch {
	case !r.Periodic():
		return "sync_rate 0"
	case r.SyncAbove > 0:
		return fmt.Sprintf("%v, sync_above %g", r.SyncRate, r.SyncAbove)
	}
	return fmt.Sprintf("%v, sync_above off", r.SyncRate)
}

// docData is what the template sees.
type docData struct {
	Report
	Plots []docPlot
}

// DateString is the report's date.
func (d docData) DateString() string { return d.Date.Format("2006-01-02 15:04 MST") }

// RunLines describe the run, one wrapped item of a Markdown list each:
// when, where, how, with what settings and versions.
func (d docData) RunLines() []string {
	items := []string{
		"**Date:** " + d.DateString(),
		"**Machine:** " + d.Machine + ". The nodes, the store and the load generator share it.",
		fmt.Sprintf("**Command:** `%s` (took %v)", d.Command, d.Elapsed.Round(time.Second)),
		fmt.Sprintf("**Settings:** %d nodes; a limit of %g per %v window; %v of traffic per row; "+
			"one bare request for every %d limited ones; a fetch counts as back %v after it starts",
			d.Nodes, d.Limit, Window, d.Duration, BareEvery, FetchAllowance),
		"**Plugin:** " + d.Source,
		"**Go:** " + d.Go,
	}
	items = append(items, d.Versions...)
	return wrapItems(items)
}

// wrapItems wraps each line as an item of a Markdown list.
func wrapItems(lines []string) []string {
	items := make([]string, len(lines))
	for i, l := range lines {
		items[i] = docgen.WrapItem(l)
	}
	return items
}

// Tables is the markdown of the result tables.
func (d docData) Tables() string {
	var b strings.Builder
	WriteTables(&b, d.Outcomes, d.Stores)
	return b.String()
}

// SpreadTables is the markdown of the spread clients' tables.
func (d docData) SpreadTables() string {
	var b strings.Builder
	WriteSpreadTables(&b, d.Spread, d.Stores)
	return b.String()
}

// MustShowLines are the promise's checks, per store, as items of a
// Markdown list.
func (d docData) MustShowLines() []string {
	var lines []string
	for _, name := range d.storeOrder() {
		title := d.title(name)
		for _, l := range MustShow(d.Outcomes, name) {
			lines = append(lines, title+": "+l)
		}
	}
	return wrapItems(lines)
}

// title is how the page names a store.
func (d docData) title(store string) string {
	if st, ok := d.Stores[store]; ok {
		return st.Title()
	}
	return store
}

func (d docData) storeOrder() []string {
	var order []string
	seen := map[string]bool{}
	for _, o := range d.Outcomes {
		if !seen[o.Row.Store] {
			seen[o.Row.Store] = true
			order = append(order, o.Row.Store)
		}
	}
	return order
}

// ExactTable is the markdown table that puts the sync_above condition
// next to the measured worst windows: for each store, pattern and
// periodic sync_rate, the hits the other nodes admit of the hottest key
// within one interval, (1 − s) × limit, and the worst window at each
// sync_above.
func (d docData) ExactTable() string {
	var b strings.Builder
	fmt.Fprintln(&b, "| store | pattern | limit | sync_rate | others' hits per interval | worst, off | worst, 0.9 (exact if others < 0.1 × limit) | worst, 0.8 (exact if others < 0.2 × limit) |")
	fmt.Fprintln(&b, "|---|---|--:|--:|--:|--:|--:|--:|")
	rows := 0
	for _, store := range d.storeOrder() {
		title := d.title(store)
		for _, p := range Patterns {
			if p.Units > 0 {
				continue // a budget is never exact: see MustShow
			}
			for _, rate := range SyncRates {
				off, ok := Find(d.Outcomes, store, p, rate, 0)
				if !ok {
					continue
				}
				c := ClaimFor(off.Row, off.Nodes, off.Limit, off.TargetRate*KeyShare(p, 0))
				cell := func(above float64) string {
					o, ok := Find(d.Outcomes, store, p, rate, above)
					if !ok {
						return "–"
					}
					mark := "not promised"
					if c.Others < (1-above)*o.Limit {
						mark = "promised"
						if o.Worst > 1+ExactTolerance {
							mark = "promised, **missed**"
						}
					}
					return fmt.Sprintf("%.3f (%s)", o.Worst, mark)
				}
				fmt.Fprintf(&b, "| %s | %s | %g | %v | %.1f | %.3f | %s | %s |\n",
					title, p.Label, off.Limit, rate, c.Others, off.Worst, cell(0.9), cell(0.8))
				rows++
			}
		}
	}
	if rows == 0 {
		return ""
	}
	return b.String()
}

// IntervalsLines sum up, per store and sync_rate, the overshoot in
// intervals of the rows without sync_above whose traffic can show it, as
// items of a Markdown list.
func (d docData) IntervalsLines() []string {
	var lines []string
	for _, store := range d.storeOrder() {
		title := d.title(store)
		var parts []string
		for _, rate := range SyncRates {
			lo, hi, n := math.Inf(1), math.Inf(-1), 0
			for _, o := range d.Outcomes {
				if o.Row.Store == store && o.Row.SyncRate == rate && o.Row.SyncAbove == 0 && o.Testable() {
					lo, hi, n = math.Min(lo, o.Intervals()), math.Max(hi, o.Intervals()), n+1
				}
			}
			if n > 0 {
				rows := "rows"
				if n == 1 {
					rows = "row"
				}
				parts = append(parts, fmt.Sprintf("%v: %.2f–%.2f (%d %s)", rate, lo, hi, n, rows))
			}
		}
		if len(parts) > 0 {
			lines = append(lines, title+": "+strings.Join(parts, "; "))
		}
	}
	return wrapItems(lines)
}

// LagLines sum up, per store, the lag check of the periodic rows: how
// many admissions past the limit there were, and which of them the other
// nodes' unseen hits do not explain, as items of a Markdown list, with a
// nested item per row that had some.
func (d docData) LagLines() []string {
	var lines []string
	for _, store := range d.storeOrder() {
		title := d.title(store)
		checked, rows, unexplained := 0, 0, 0
		var bad []string
		for _, o := range d.Outcomes {
			if o.Row.Store != store || !o.Row.Periodic() {
				continue
			}
			rows++
			checked += o.LagChecked
			unexplained += len(o.Unexplained)
			if len(o.Unexplained) > 0 {
				// The row, how many, and the first as an example.
				bad = append(bad, fmt.Sprintf("%s, sync_rate %v, sync_above %s: %d (%s)",
					o.Row.Pattern.Label, o.Row.SyncRate, o.Row.SyncAboveString(), len(o.Unexplained), o.Unexplained[0]))
			}
		}
		if rows == 0 {
			continue
		}
		line := docgen.WrapItem(fmt.Sprintf("%s: %d admissions past the limit in %d periodic rows, %d of them unexplained", title, checked, rows, unexplained))
		if len(bad) > 0 {
			line += ", in:"
			for _, b := range bad {
				line += "\n" + docgen.Wrap(b, docgen.Width, "  - ", "    ")
			}
		}
		lines = append(lines, line)
	}
	return lines
}
