package sizing

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/docgen"
)

// Command is the script that runs the harness, whose name the page's
// markers carry.
const Command = "./scripts/bench-sizing.sh"

// Report is a run of the harness, as the page shows it.
type Report struct {
	// Date is when the report was made, Machine what it ran on
	// (machine.Describe), Command how it was run, Source what the nodes
	// ran, and Versions those of Caddy and the stores.
	Date     time.Time
	Machine  string
	Command  string
	Source   string
	Versions []string
	// Warmup, Measure and MaxRate are the runner's settings, Elapsed the
	// machine time the rows took.
	Warmup  time.Duration
	Measure time.Duration
	MaxRate float64
	Elapsed time.Duration
	// Rows are the rows measured, in the table's order.
	Rows []Measured
	// Constants are the fitted constants, by store name.
	Constants map[string]Constants
	// Titles are the stores' names in prose, by store name.
	Titles map[string]string
}

// Errors are a row's prediction errors, as fractions.
type Errors struct {
	Commands, CPU, Memory, Conns float64
}

// RowErrors returns the prediction and its errors for row m.
func (r Report) RowErrors(m Measured) (Prediction, Errors) {
	p := Predict(m.Row, r.Constants[m.Row.Store], m.Elapsed)
	p.Memory = PredictMemory(m, r.Constants[m.Row.Store])
	return p, Errors{
		Commands: Error(p.Commands, m.Commands),
		CPU:      Error(p.CPU, m.CPU),
		Memory:   Error(p.Memory, m.Memory),
		Conns:    Error(p.Conns, float64(m.Conns)),
	}
}

// Worst returns the error of largest magnitude of each figure over the
// rows, with its sign.
func (r Report) Worst() Errors {
	var w Errors
	worse := func(w *float64, e float64) {
		if math.Abs(e) > math.Abs(*w) {
			*w = e
		}
	}
	for _, m := range r.Rows {
		_, e := r.RowErrors(m)
		worse(&w.Commands, e.Commands)
		worse(&w.CPU, e.CPU)
		worse(&w.Memory, e.Memory)
		worse(&w.Conns, e.Conns)
	}
	return w
}

// Markdown returns the generated part of the page: how the run was made,
// the fitted constants, the table and the worst errors.
func (r Report) Markdown() string {
	var b strings.Builder
	window := r.Measure.String()
	if pg := measureFor("postgres", r.Measure); pg != r.Measure {
		window += fmt.Sprintf(" (PostgreSQL's rows: %s, the interval of the purge each node runs)", pg)
	}
	b.WriteString(docgen.Wrap(fmt.Sprintf("Measured on %s, %s (%s), with %s, by `%s`: %d rows in %s; per row %s of load before a "+
		"window of %s, at most %s requests a second.",
		r.Date.Format("2006-01-02"), r.Machine, strings.Join(r.Versions, ", "), r.Source, r.Command, len(r.Rows),
		r.Elapsed.Round(time.Second), r.Warmup, window, Thousands(r.MaxRate)), docgen.Width, "", ""))
	b.WriteString("\n\nFitted constants:\n\n")
	stores := make([]string, 0, len(r.Constants))
	for name := range r.Constants {
		stores = append(stores, name)
	}
	slices.Sort(stores)
	for _, name := range stores {
		c := r.Constants[name]
		unit, mem := "command", fmt.Sprintf("%.0f per connection", c.BytesPerConn)
		if name == "postgres" {
			unit, mem = "row written", fmt.Sprintf("%.0f per row version an update leaves, empty tables %s; %.1f transactions "+
				"per node's purge", c.BytesPerUpdate, Bytes(c.BytesEmpty), c.PurgeTrips)
		}
		b.WriteString(docgen.WrapItem(fmt.Sprintf("%s: %.1f µs of CPU per %s, %.1f per round trip and %.0f per beat, plus %.2f %% of a core "+
			"and %.2f %% per connection; %.0f bytes per counter, %.0f per marker, %s; a synchronous "+
			"round trip holds a node's next hits %.0f µs; %.2f connections per node when periodic, and at sync_rate 0 "+
			"a second one as %.2f calls a second find a round trip out.",
			r.title(name), c.CPUPerCommand, unit, c.CPUPerTrip, c.CPUPerBeat, c.CPUIdle, c.CPUPerConn, c.BytesPerCounter,
			c.BytesPerMarker, mem, c.TripLatency, c.ConnsPeriodic, c.ConnsOverlap)))
		b.WriteString("\n")
	}
	b.WriteString("\nEach cell: measured, then the formula's prediction and its error.\n\n")
	b.WriteString("| store | nodes | keys | sync_rate | req/s | commands/s | round trips/s | CPU % of a core | memory | connections |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- |\n")
	for _, m := range r.Rows {
		p, e := r.RowErrors(m)
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s (%s, %s) | %s (%s) | %.1f (%.1f, %s) | %s (%s, %s) | %d (%.0f, %s) |\n",
			r.title(m.Row.Store), m.Row.Nodes, Thousands(float64(m.Row.Keys)), m.Row.SyncRateString(), Thousands(m.Sent),
			Thousands(m.Commands), Thousands(p.Commands), Percent(e.Commands),
			Thousands(m.Trips), Thousands(p.Trips),
			m.CPU, p.CPU, Percent(e.CPU),
			Bytes(m.Memory), Bytes(p.Memory), Percent(e.Memory),
			m.Conns, p.Conns, Percent(e.Conns))
	}
	b.WriteString("\n")
	b.WriteString(docgen.Wrap("What the formula predicts, with these constants, beyond the rows measured: 10 nodes, each of "+
		"K keys hit once a second fleet-wide (R = K).", docgen.Width, "", ""))
	b.WriteString("\n\n| store | nodes | keys | req/s | sync_rate | commands/s | round trips/s | CPU % of a core | connections |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, name := range stores {
		for _, row := range Examples(name) {
			p := Predict(row, r.Constants[name], time.Minute)
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %.0f | %.0f |\n", r.title(name), row.Nodes,
				Thousands(float64(row.Keys)), Thousands(row.Rate), row.SyncRateString(), Thousands(p.Commands),
				Thousands(p.Calls), p.CPU, p.Conns)
		}
	}
	w := r.Worst()
	b.WriteString("\n")
	b.WriteString(docgen.Wrap(fmt.Sprintf("Worst error over the rows: commands %s, CPU %s, memory %s, connections %s.",
		Percent(w.Commands), Percent(w.CPU), Percent(w.Memory), Percent(w.Conns)), docgen.Width, "", ""))
	b.WriteString("\n")
	return b.String()
}

func (r Report) title(name string) string {
	if t, ok := r.Titles[name]; ok {
		return t
	}
	return name
}

// WriteDoc writes the Markdown into the page at path, between its markers.
func (r Report) WriteDoc(path string) error {
	return docgen.ReplaceFile(path, Command, r.Markdown())
}

// Thousands formats x rounded to a whole number, with commas: 12,345.
func Thousands(x float64) string {
	neg := x < 0
	s := fmt.Sprintf("%.0f", math.Abs(x))
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg && s != "0" {
		return "−" + b.String()
	}
	return b.String()
}

// Percent formats an error fraction as a signed whole percentage: +12 %,
// −3 %, or "—" when it has none (measured 0, predicted more).
func Percent(e float64) string {
	if math.IsInf(e, 0) || math.IsNaN(e) {
		return "—"
	}
	v := math.Round(e * 100)
	switch {
	case v > 0:
		return fmt.Sprintf("+%.0f %%", v)
	case v < 0:
		return fmt.Sprintf("−%.0f %%", -v)
	}
	return "0 %"
}

// Bytes formats a size in KiB or MiB.
func Bytes(n float64) string {
	switch {
	case math.Abs(n) >= 10<<20:
		return fmt.Sprintf("%.0f MiB", n/(1<<20))
	case math.Abs(n) >= 1<<20:
		return fmt.Sprintf("%.1f MiB", n/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", n/1024)
}

// Examples are the rows the page extrapolates to: 10 nodes, 10,000 and
// 100,000 keys each hit once a second, in every sync mode.
func Examples(store string) []Row {
	var rows []Row
	for _, k := range []int{10000, 100000} {
		for _, s := range SyncRates {
			rows = append(rows, Row{Store: store, Nodes: 10, Keys: k, SyncRate: s, Rate: float64(k)})
		}
	}
	return rows
}
