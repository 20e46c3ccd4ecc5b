package faults

import (
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"
)

// docTemplate is docs/faults.md, around the measured figures.
//
//go:embed doc.md.tmpl
var docTemplate string

// Report is what docs/faults.md is made of.
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

// WriteTable writes one markdown row per outcome.
func WriteTable(w io.Writer, outcomes []*Outcome) {
	fmt.Fprintln(w, "| fault | mode | hits admitted / in store | lost | counted twice | 5xx | no answer | latency during: p50 / p99 / max (ms) | ≥ 900 ms | admitted / limit, worst second: during / after | syncing again after the store serves (worst node) | max_concurrent: first admitted / most in flight at an admission, from every node syncing again | ban on every node after | failure log lines / min (worst node); stderr lines | goroutines before → after (per node) | store connections before → after | promises |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
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
		admitted := fmt.Sprintf("%g / %g", o.Admitted, o.InStore)
		if o.Unread > 0 {
			admitted += fmt.Sprintf(" (+%g of keys no node could read from the store)", o.Unread)
		}
		if o.Excluded > 0 {
			admitted += fmt.Sprintf(" (+%g sent before the store lost its data, not judged)", o.Excluded)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %g | %g | %d | %d | %.0f / %.0f / %.0f | %s | %.2f / %.2f | %s | %s | %s | %.1f; %d | %s | %d → %d | %s |\n",
			o.Title, o.Row.Mode(), admitted, o.Lost, o.Doubled, o.Status5xx, o.NoAnswer,
			msf(o.P50), msf(o.P99), msf(o.Max), pct(o.Slow), o.LimitDuring, o.LimitAfter,
			recoveryString(o), conc, ban, perMin, foreign, goroutines(o), o.ConnsBefore, o.ConnsAfter, checks(o))
	}
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

// checks formats the row's promises: ✅ held, ❌ not, with the figure.
func checks(o *Outcome) string {
	var parts []string
	for _, c := range o.Checks() {
		mark := "✅"
		if !c.Held {
			mark = "❌"
		}
		parts = append(parts, fmt.Sprintf("%s %s (%s)", mark, c.Promise, c.Figure))
	}
	return strings.Join(parts, "<br>")
}

// Shortfalls lists the promises that did not hold, one line each.
func (r *Report) Shortfalls() []string {
	var lines []string
	for _, o := range r.Outcomes {
		for _, c := range o.Checks() {
			if !c.Held {
				lines = append(lines, fmt.Sprintf("**%s, %s:** %s — measured %s.", o.Title, o.Row.Mode(), c.Promise, c.Figure))
			}
		}
	}
	return lines
}

// Notes lists each row's remarks.
func (r *Report) Notes() []string {
	var lines []string
	for _, o := range r.Outcomes {
		for _, n := range o.Notes {
			lines = append(lines, fmt.Sprintf("%s, %s: %s.", o.Title, o.Row.Mode(), n))
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
			lines = append(lines, fmt.Sprintf("%s, %s: caddy_rate_limit_dropped_diffs_total at the end: %s.", o.Title, o.Row.Mode(), strings.Join(dropped, ", ")))
		}
		if o.Row.Fault.Name == "reloads" {
			var loads []string
			for _, l := range o.Logs {
				loads = append(loads, fmt.Sprint(l.Loads))
			}
			lines = append(lines, fmt.Sprintf("%s, %s: reloads each node's log says it completed (\"load complete\"): %s.", o.Title, o.Row.Mode(), strings.Join(loads, ", ")))
		}
		if o.NoAnswer > 0 {
			lines = append(lines, fmt.Sprintf("%s, %s: %d requests got no answer; the first: %s.", o.Title, o.Row.Mode(), o.NoAnswer, o.NoAnswerErr))
		}
		if o.OnFailed.Keys+o.OnOthers.Keys > 0 {
			lines = append(lines, fmt.Sprintf("%s, %s: keys on the killed master's slots: %d keys, %g hits admitted, %g lost, %g counted twice; on the other masters' slots: %d keys, %g admitted, %g lost, %g counted twice.",
				o.Title, o.Row.Mode(), o.OnFailed.Keys, o.OnFailed.Admitted, o.OnFailed.Lost, o.OnFailed.Doubled,
				o.OnOthers.Keys, o.OnOthers.Admitted, o.OnOthers.Lost, o.OnOthers.Doubled))
		}
		if o.UnreadErr != "" {
			lines = append(lines, fmt.Sprintf("%s, %s: reading the store's counts through the nodes failed for %s: `%s`.", o.Title, o.Row.Mode(), secs1(ReadBudget), o.UnreadErr))
		}
		if o.Row.Fault.StoreLoses {
			lines = append(lines, fmt.Sprintf("%s, %s: the ban set off before the fault (the store lost it) still held on the live nodes: %v.", o.Title, o.Row.Mode(), o.BanKept))
		}
		if !o.Row.Fault.NodeFault {
			lines = append(lines, fmt.Sprintf("%s, %s: syncing again per node: %s.", o.Title, o.Row.Mode(), strings.Join(rec, ", ")))
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
				if len(ex) > 300 {
					ex = ex[:300] + "…"
				}
				lines = append(lines, fmt.Sprintf("%s, %s: node%d logged `%s`", o.Title, o.Row.Mode(), i+1, strings.ReplaceAll(ex, "`", "'")))
			}
		}
	}
	return lines
}

// Table returns the markdown table.
func (r *Report) Table() string {
	var b bytes.Buffer
	WriteTable(&b, r.Outcomes)
	return b.String()
}

// DateString formats the run's date.
func (r *Report) DateString() string { return r.Date.Format("2006-01-02 15:04 UTC") }

// ElapsedString formats how long the run took.
func (r *Report) ElapsedString() string { return r.Elapsed.Round(time.Second).String() }

// Titles lists the faults run, with their scaled durations, in order.
func (r *Report) Titles() []string {
	var ts []string
	seen := map[string]bool{}
	for _, o := range r.Outcomes {
		if !seen[o.Row.Fault.Name] {
			seen[o.Row.Fault.Name] = true
			ts = append(ts, fmt.Sprintf("`%s`: %s", o.Row.Fault.Name, o.Title))
		}
	}
	return ts
}

// Const exposes the harness's settings to the template.
func (r *Report) Const() map[string]any {
	return map[string]any{
		"PeriodicRate": PeriodicRate, "LimitPerSecond": LimitPerSecond, "BanLimit": BanLimit, "BanFor": BanFor,
		"MaxConcurrent": MaxConcurrent, "Hold": Hold, "ReadTimeout": ReadTimeout, "CountKeysPerSecond": CountKeysPerSecond,
		"Count": fmt.Sprintf("%.0f", r.Rates[Count]), "Limit": fmt.Sprintf("%.0f", r.Rates[Limit]),
		"Conc": fmt.Sprintf("%.0f", r.Rates[Conc]), "Total": fmt.Sprintf("%.0f", r.Rates.Total()),
	}
}

// WriteDoc writes docs/faults.md (or another path) from the template.
func (r *Report) WriteDoc(path string) error {
	tmpl, err := template.New("faults").Parse(docTemplate)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, r); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
