package faults

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/template"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/docgen"
)

// resultsTemplate is the part of docs/faults.md the harness writes: the
// latest run's figures.
//
//go:embed results.md.tmpl
var resultsTemplate string

// DocCommand is the script that runs the harness; it names the markers
// around the part of docs/faults.md it writes.
const DocCommand = "./scripts/bench-faults.sh"

// Report is the latest run, as docs/faults.md shows it.
type Report struct {
	Date time.Time
	// MachineAt and MachineEnd describe the machine, with its load
	// average at the start and at the end of the run.
	MachineAt, MachineEnd string
	Command               string
	Source                string // what Caddy was built from
	Go                    string
	Versions              []string
	Scale                 float64
	Rates                 Rates
	Nodes                 int
	Elapsed               time.Duration
	Outcomes              []*Outcome
	Errors                []string // rows that could not run
}

// WriteCountsTable writes one markdown row per outcome: the hits admitted
// against the store's counts, the errors, the latency during the fault
// and the limit's worst second.
func WriteCountsTable(w io.Writer, outcomes []*Outcome) {
	fmt.Fprintln(w, "| fault | mode | hits admitted / in store | lost | counted twice | 5xx | no answer | latency during: p50 / p99 / max (ms) | ≥ 900 ms | admitted / limit, worst second: during / after |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, o := range outcomes {
		admitted := fmt.Sprintf("%g / %g", o.Admitted, o.InStore)
		if o.Unread > 0 {
			admitted += fmt.Sprintf(" (+%g of keys no node could read from the store)", o.Unread)
		}
		if o.Excluded > 0 {
			admitted += fmt.Sprintf(" (+%g sent before the store lost its data, not judged)", o.Excluded)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %g | %g | %d | %d | %.0f / %.0f / %.0f | %s | %.2f / %.2f |\n",
			o.Title, o.Row.Mode(), admitted, o.Lost, o.Doubled, o.Status5xx, o.NoAnswer,
			msf(o.P50), msf(o.P99), msf(o.Max), pct(o.Slow), o.LimitDuring, o.LimitAfter)
	}
}

// WriteRatesTable writes one markdown row per outcome whose load had
// rates: the turns admitted against the store's TATs, how they were
// decided, and RatePath's latency during the fault.
func WriteRatesTable(w io.Writer, outcomes []*Outcome) {
	fmt.Fprintln(w, "| fault | turns admitted / counted in the store | admitted after a timeout (in doubt) | decided by a node alone, not counted | lost | counted twice | no answer (counted) | latency during: p50 / p99 / max (ms) | ≥ 900 ms |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, o := range outcomes {
		if !o.hasRates() {
			continue
		}
		t := &o.Turns
		admitted := fmt.Sprintf("%d / %d", t.Admitted, t.Counted)
		if t.Unread > 0 {
			admitted += fmt.Sprintf(" (+%d of keys whose TAT could not be read)", t.Unread)
		}
		if t.Excluded > 0 {
			admitted += fmt.Sprintf(" (+%d sent before the store lost its data, not judged)", t.Excluded)
		}
		l := t.Latency
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d (%d) | %.0f / %.0f / %.0f | %s |\n",
			o.Title, admitted, t.InDoubt, t.Alone, t.Lost, t.Doubled, t.Unanswered, t.UnansweredCounted,
			msf(l.P50), msf(l.P99), msf(l.Max), pct(l.Slow))
	}
}

// WriteRecoveryTable writes one markdown row per outcome: how soon the
// nodes sync again, max_concurrent and bans after the fault, what the
// nodes logged, goroutines and store connections, and how many of the
// row's promises held.
func WriteRecoveryTable(w io.Writer, outcomes []*Outcome) {
	fmt.Fprintln(w, "| fault | mode | syncing again (worst node) | max_concurrent: first admitted / most in flight at an admission, from every node syncing again | ban on every node | failure log lines / min (worst node); stderr lines | goroutines before → after (per node) | store connections before → after | promises held |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|")
	for _, o := range outcomes {
		perMin, foreign := o.LogPerMinute()
		conc := "–"
		if !o.Row.Fault.NodeFault {
			first := "none"
			if o.ConcFirst >= 0 {
				first = secs1(o.ConcFirst)
			}
			from := "+" + secs1(o.ConcFrom)
			if !o.ConcFromSync {
				from += " (served + 1 s)"
			}
			conc = fmt.Sprintf("%s / %d from %s (before: %d)", first, o.Conc.Worst, from, o.ConcBefore.Worst)
			if o.Conc.Over > 0 {
				conc += fmt.Sprintf(", %d of %d over the cap", o.Conc.Over, o.Conc.N)
			}
		}
		ban := "not in 20 s"
		if o.BanLag >= 0 {
			ban = secs1(o.BanLag)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.1f; %d | %s | %d → %d | %s |\n",
			o.Title, o.Row.Mode(), recoveryString(o), conc, ban, perMin, foreign, goroutines(o),
			o.ConnsBefore, o.ConnsAfter, held(o))
	}
}

// WriteTable writes both tables, one after the other.
func WriteTable(w io.Writer, outcomes []*Outcome) {
	WriteCountsTable(w, outcomes)
	fmt.Fprintln(w)
	WriteRecoveryTable(w, outcomes)
}

// held formats how many of the row's promises held: ✅ all of them, or ❌.
func held(o *Outcome) string {
	cs := o.Checks()
	n := 0
	for _, c := range cs {
		if c.Held {
			n++
		}
	}
	mark := "✅"
	if n < len(cs) {
		mark = "❌"
	}
	return fmt.Sprintf("%s %d of %d", mark, n, len(cs))
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// goroutines formats the per-node goroutine counts.
func goroutines(o *Outcome) string {
	var parts []string
	for i := range o.GoroutinesBefore {
		after := "killed"
		if i < len(o.GoroutinesAfter) && o.GoroutinesAfter[i] >= 0 {
			after = fmt.Sprint(o.GoroutinesAfter[i])
		} else if i == o.KilledNode && o.Row.Fault.Name == "node-stop" {
			after = "stopped"
		}
		parts = append(parts, fmt.Sprintf("%d → %s", o.GoroutinesBefore[i], after))
	}
	return strings.Join(parts, ", ")
}

// WritePromisesTable writes one markdown row per promise, in the order
// the rows first check them: in how many rows it was checked, and in how
// many it held.
func WritePromisesTable(w io.Writer, outcomes []*Outcome) {
	type tally struct{ checked, held int }
	var order []string
	tallies := map[string]*tally{}
	for _, o := range outcomes {
		for _, c := range o.Checks() {
			t, ok := tallies[c.Promise]
			if !ok {
				t = &tally{}
				tallies[c.Promise] = t
				order = append(order, c.Promise)
			}
			t.checked++
			if c.Held {
				t.held++
			}
		}
	}
	fmt.Fprintln(w, "| promise | rows checked | held |")
	fmt.Fprintln(w, "|---|--:|--:|")
	for _, p := range order {
		t := tallies[p]
		mark := "✅"
		if t.held < t.checked {
			mark = "❌"
		}
		fmt.Fprintf(w, "| %s | %d | %s %d |\n", p, t.checked, mark, t.held)
	}
}

// Shortfalls lists the promises that did not hold, one item of a
// Markdown list each.
func (r *Report) Shortfalls() []string {
	var lines []string
	for _, o := range r.Outcomes {
		for _, c := range o.Checks() {
			if !c.Held {
				lines = append(lines, docgen.WrapItem(fmt.Sprintf("**%s, %s:** %s — measured %s.", o.Title, o.Row.Mode(), c.Promise, c.Figure)))
			}
		}
	}
	return lines
}

// Notes lists each row's remarks, as items of a Markdown list: one per
// row that has some, which names the row, with a nested item per remark.
func (r *Report) Notes() []string {
	var items []string
	for _, o := range r.Outcomes {
		var lines []string
		for _, n := range o.Notes {
			lines = append(lines, n+".")
		}
		var rec []string
		for i, d := range o.Recovery {
			switch {
			case i == o.KilledNode:
			case d < 0:
				rec = append(rec, fmt.Sprintf("node%d never", i+1))
			case !o.Failed[i]:
				rec = append(rec, fmt.Sprintf("node%d saw no failure", i+1))
			default:
				rec = append(rec, fmt.Sprintf("node%d %s", i+1, secs1(d)))
			}
		}
		var dropped []string
		for i, ss := range o.Samples {
			if len(ss) > 0 && ss[len(ss)-1].Dropped > 0 {
				dropped = append(dropped, fmt.Sprintf("node%d %g", i+1, ss[len(ss)-1].Dropped))
			}
		}
		if len(dropped) > 0 {
			lines = append(lines, fmt.Sprintf("caddy_rate_limit_dropped_diffs_total at the end: %s.", strings.Join(dropped, ", ")))
		}
		if strings.HasPrefix(o.Row.Fault.Name, "reloads") {
			var loads []string
			for _, l := range o.Logs {
				loads = append(loads, fmt.Sprint(l.Loads))
			}
			lines = append(lines, fmt.Sprintf("reloads each node's log says it completed (\"load complete\"): %s.", strings.Join(loads, ", ")))
		}
		if o.NoAnswer > 0 {
			lines = append(lines, fmt.Sprintf("%d requests got no answer; the first: %s.", o.NoAnswer, o.NoAnswerErr))
		}
		if o.OnFailed.Keys+o.OnOthers.Keys > 0 {
			lines = append(lines, fmt.Sprintf("keys on the killed master's slots: %d keys, %g hits admitted, %g lost, %g counted twice; on the other masters' slots: %d keys, %g admitted, %g lost, %g counted twice.",
				o.OnFailed.Keys, o.OnFailed.Admitted, o.OnFailed.Lost, o.OnFailed.Doubled,
				o.OnOthers.Keys, o.OnOthers.Admitted, o.OnOthers.Lost, o.OnOthers.Doubled))
		}
		if o.UnreadErr != "" {
			lines = append(lines, fmt.Sprintf("reading the store's counts through the nodes failed for %s: `%s`.", secs1(ReadBudget), o.UnreadErr))
		}
		if o.Turns.UnreadErr != "" {
			lines = append(lines, fmt.Sprintf("reading the rates' TATs from the store failed for %s: `%s`.", secs1(ReadBudget), o.Turns.UnreadErr))
		}
		if o.Row.Fault.StoreLoses {
			lines = append(lines, fmt.Sprintf("the ban set off before the fault (the store lost it) still held on the live nodes: %v.", o.BanKept))
		}
		if !o.Row.Fault.NodeFault {
			lines = append(lines, fmt.Sprintf("syncing again per node: %s.", strings.Join(rec, ", ")))
		}
		// Examples of what was logged: one line of each kind (Caddy's
		// JSON, or a dependency's), from the first node that wrote one.
		shown := map[bool]bool{}
		for i, l := range o.Logs {
			for _, ex := range l.Examples {
				foreign := !strings.HasPrefix(ex, "{")
				if shown[foreign] {
					continue
				}
				shown[foreign] = true
				lines = append(lines, fmt.Sprintf("node%d logged %s", i+1, logExample(ex)))
			}
		}
		if len(lines) == 0 {
			continue
		}
		item := fmt.Sprintf("- **%s, %s:**", o.Title, o.Row.Mode())
		for _, l := range lines {
			item += "\n" + docgen.Wrap(l, docgen.Width, "  - ", "    ")
		}
		items = append(items, item)
	}
	return items
}

// logExample shortens a log line for the notes: of Caddy's JSON, its
// level, message and error; of another line, its start.
func logExample(line string) string {
	var entry struct{ Level, Msg, Error string }
	if err := json.Unmarshal([]byte(line), &entry); err == nil && entry.Msg != "" {
		s := fmt.Sprintf("at %s: %s", entry.Level, code(entry.Msg, 200))
		if entry.Error != "" {
			s += ": " + code(entry.Error, 120)
		}
		return s
	}
	return code(line, 160)
}

// code quotes s as Markdown code, cut to at most max characters.
func code(s string, max int) string {
	if r := []rune(s); len(r) > max {
		s = string(r[:max]) + "…"
	}
	return "`" + strings.ReplaceAll(s, "`", "'") + "`"
}

// CountsTable is the markdown of WriteCountsTable.
func (r *Report) CountsTable() string {
	var b bytes.Buffer
	WriteCountsTable(&b, r.Outcomes)
	return b.String()
}

// HasRates reports whether a row's load had rates.
func (r *Report) HasRates() bool {
	return slices.ContainsFunc(r.Outcomes, (*Outcome).hasRates)
}

// RatesTable is the markdown of WriteRatesTable.
func (r *Report) RatesTable() string {
	var b bytes.Buffer
	WriteRatesTable(&b, r.Outcomes)
	return b.String()
}

// RecoveryTable is the markdown of WriteRecoveryTable.
func (r *Report) RecoveryTable() string {
	var b bytes.Buffer
	WriteRecoveryTable(&b, r.Outcomes)
	return b.String()
}

// PromisesTable is the markdown of WritePromisesTable.
func (r *Report) PromisesTable() string {
	var b bytes.Buffer
	WritePromisesTable(&b, r.Outcomes)
	return b.String()
}

// RunLines describe the run, one wrapped item of a Markdown list each:
// when, where, how, with what load and versions.
func (r *Report) RunLines() []string {
	lines := []string{
		"**Date:** " + r.Date.Format("2006-01-02 15:04 UTC"),
		"**Machine:** " + r.MachineAt + " at the start; " + r.MachineEnd +
			" at the end. The nodes, the stores and the load generator share it, and so did other busy work.",
		fmt.Sprintf("**Command:** `%s` (took %v)", r.Command, r.Elapsed.Round(time.Second)),
		fmt.Sprintf("**Scale:** %g (of the fault durations and the phases around them)", r.Scale),
		fmt.Sprintf("**Fleet:** %d nodes, `sync_rate %v` (periodic) or `sync_rate 0` (synchronous)", r.Nodes, PeriodicRate),
		r.loadLine(),
		"**Plugin:** " + r.Source,
		"**Go:** " + r.Go,
	}
	lines = append(lines, r.Versions...)
	items := make([]string, len(lines))
	for i, l := range lines {
		items[i] = docgen.WrapItem(l)
	}
	return items
}

// loadLine describes the load.
func (r *Report) loadLine() string {
	rates := ""
	if r.Rates[Rate] > 0 {
		rates = fmt.Sprintf(", %.0f to `/rate` (`%s`, a new key per request; a periodic row, which refuses a rate, sends them to `/count`)",
			r.Rates[Rate], RateLine)
	}
	return fmt.Sprintf("**Load:** %.0f requests per second: %.0f to `/count` (%d new keys a second), "+
		"%.0f to `/limit` (%d per second on one key), %.0f to `/conc` (`max_concurrent %d`, the upstream holding each %v)%s; "+
		"`/ban` limits %d per minute with `ban %v`; `read_timeout` %v",
		r.Rates.Total(), r.Rates[Count], CountKeysPerSecond, r.Rates[Limit], LimitPerSecond,
		r.Rates[Conc], MaxConcurrent, Hold, rates, BanLimit, BanFor, ReadTimeout)
}

// ErrorLines are the rows that could not run, as items of a Markdown list.
func (r *Report) ErrorLines() []string {
	var items []string
	for _, e := range r.Errors {
		items = append(items, docgen.WrapItem(e))
	}
	return items
}

// Titles lists the faults run, with their scaled durations, in order, as
// items of a Markdown list.
func (r *Report) Titles() []string {
	var ts []string
	seen := map[string]bool{}
	for _, o := range r.Outcomes {
		if !seen[o.Row.Fault.Name] {
			seen[o.Row.Fault.Name] = true
			ts = append(ts, docgen.WrapItem(fmt.Sprintf("`%s`: %s", o.Row.Fault.Name, o.Title)))
		}
	}
	return ts
}

// Markdown is the latest run as docs/faults.md holds it, between the
// markers of DocCommand: the run, the two tables of figures, the
// promises, those that did not hold, and each row's notes. The harness
// prints it, and WriteDoc writes it into the page.
func (r *Report) Markdown() (string, error) {
	tmpl, err := template.New("results").Parse(resultsTemplate)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, r); err != nil {
		return "", err
	}
	return b.String(), nil
}

// WriteDoc replaces the generated part of the page at path (see
// Markdown), keeping the prose around it.
func (r *Report) WriteDoc(path string) error {
	md, err := r.Markdown()
	if err != nil {
		return err
	}
	return docgen.ReplaceFile(path, DocCommand, md)
}
