package accuracy

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// WriteTables writes the outcomes as one markdown table per store, in the
// order of their first rows.
func WriteTables(w io.Writer, outcomes []Outcome, stores map[string]Store) {
	var order []string
	byStore := map[string][]Outcome{}
	for _, o := range outcomes {
		if _, ok := byStore[o.Row.Store]; !ok {
			order = append(order, o.Row.Store)
		}
		byStore[o.Row.Store] = append(byStore[o.Row.Store], o)
	}
	for i, name := range order {
		if i > 0 {
			fmt.Fprintln(w)
		}
		title, unit := name, "store operations per 1,000 requests"
		if st, ok := stores[name]; ok {
			title, unit = st.Title(), st.OpsUnit()
		}
		fmt.Fprintf(w, "**%s**: %d nodes; ops/1k = %s\n\n", title, byStore[name][0].Nodes, unit)
		WriteTable(w, byStore[name])
	}
}

// WriteTable writes outcomes of one store as a markdown table.
func WriteTable(w io.Writer, outcomes []Outcome) {
	fmt.Fprintln(w, "| pattern | limit | sync_rate | sync_above | req/s sent (target) | admitted / limit, worst window | bound | kept | overshoot, in intervals | ops/1k | added latency p50 / p99 (ms) |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|")
	for _, o := range outcomes {
		kept := "yes"
		switch {
		case !o.Holds && o.Breach.Key != o.WorstKey:
			// Another key than the worst went past its own, lower bound.
			kept = fmt.Sprintf("**no** (key %d: %d > %.1f)", o.Breach.Key+1, o.Breach.Admitted, o.Breach.Allowed)
		case !o.Holds:
			kept = "**no**"
		}
		intervals := "–"
		if o.Testable() {
			intervals = fmt.Sprintf("%.2f", o.Intervals())
		}
		fmt.Fprintf(w, "| %s | %g | %s | %s | %.0f (%.0f) | %s | %s | %s | %s | %.0f | %s / %s |\n",
			o.Row.Pattern.Label, o.Limit, o.Row.SyncRateString(), o.Row.SyncAboveString(),
			o.SentRate, o.TargetRate, worst(o), bound(o), kept, intervals, o.OpsPer1k(),
			ms1(o.AddedP50()), ms1(o.AddedP99()))
	}
}

// worst formats the worst window's ratio, with the admitted count.
func worst(o Outcome) string {
	return fmt.Sprintf("%.3f (%d)", o.Worst, o.WorstAdmitted)
}

// bound formats the promise for the worst key: "1 (exact)", or the
// periodic ceiling.
func bound(o Outcome) string {
	if o.Claim.Exact {
		return "1 (exact)"
	}
	return fmt.Sprintf("%.3f", o.Bound())
}

// ms1 formats a duration in milliseconds with one decimal, keeping the
// sign of a negative difference.
func ms1(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}

// Find returns the outcome of a row with the given store, pattern,
// sync_rate and sync_above, if there is one.
func Find(outcomes []Outcome, store string, p Pattern, syncRate time.Duration, syncAbove float64) (Outcome, bool) {
	for _, o := range outcomes {
		r := o.Row
		if r.Store == store && r.Pattern.Name == p.Name && r.SyncRate == syncRate && r.SyncAbove == syncAbove {
			return o, true
		}
	}
	return Outcome{}, false
}

// MustShow returns a store's checks of the promise, as measured: with
// sync_above 0.8 at sync_rate 100ms and steady 2×, admitted / limit and
// the store's work against sync_rate 0's; and how many periodic rows
// without sync_above kept their bound.
func MustShow(outcomes []Outcome, store string) []string {
	var lines []string
	ref, okRef := Find(outcomes, store, Steady2x, 0, 0)
	above, okAbove := Find(outcomes, store, Steady2x, 100*time.Millisecond, 0.8)
	if okRef && okAbove {
		share := above.OpsPer1k() / ref.OpsPer1k()
		// The promise counts commands: Redis's. A PostgreSQL transaction
		// is a coarser unit (a synchronous hit is one, so is a push).
		unit, must := "commands", " (must be ≤ 25 %)"
		if store == "postgres" {
			unit, must = "transactions", ""
		}
		lines = append(lines, fmt.Sprintf(
			"%d nodes, sync_rate 100ms, sync_above 0.8, steady 2×: admitted / limit %.3f (must be ≤ 1.01), %.0f %s per 1,000 requests = %.1f %% of sync_rate 0's %.0f%s",
			above.Nodes, above.Worst, above.OpsPer1k(), unit, 100*share, ref.OpsPer1k(), must))
	}
	periodic, kept, testable, testableKept := 0, 0, 0, 0
	budgets, budgetsKept := 0, 0
	for _, o := range outcomes {
		if o.Row.Store == store && o.Row.Pattern.Units > 0 {
			budgets++
			if o.Holds {
				budgetsKept++
			}
			continue
		}
		if o.Row.Store == store && o.Row.Periodic() && o.Row.SyncAbove == 0 {
			periodic++
			if o.Holds {
				kept++
			}
			if o.Testable() {
				testable++
				if o.Holds {
					testableKept++
				}
			}
		}
	}
	if periodic > 0 {
		lines = append(lines, fmt.Sprintf(
			"periodic rows without sync_above within (N−1)·rate·interval: %d of %d; of those whose traffic can exceed it, %d of %d",
			kept, periodic, testableKept, testable))
	}
	if budgets > 0 {
		lines = append(lines, fmt.Sprintf(
			"budgets charged from the response (response_cost) within what the requests in flight cost: %d of %d rows",
			budgetsKept, budgets))
	}
	return lines
}

// Sanitize makes s safe in a file name.
func Sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, strings.ToLower(s))
}

// WriteSpreadTables writes the spread clients' outcomes as one markdown
// table per store: a line per fleet and limit, a cell per spacing and
// distribution, each the worst client's admitted / limit, with its count
// and bound, and whether every client kept its bound. ops/1k is the
// fleet's: its rows ran at once.
func WriteSpreadTables(w io.Writer, outcomes []SpreadOutcome, stores map[string]Store) {
	type line struct {
		key   fleetKey
		limit SpreadLimit
	}
	var stOrder []string
	lines := map[string][]line{}
	cells := map[line]map[string]SpreadOutcome{}
	var cols []string // distribution and spacing, in the order met
	for _, o := range outcomes {
		l := line{o.Row.fleet(), o.Row.Limit}
		if _, ok := lines[o.Row.Store]; !ok {
			stOrder = append(stOrder, o.Row.Store)
		}
		if cells[l] == nil {
			cells[l] = map[string]SpreadOutcome{}
			lines[o.Row.Store] = append(lines[o.Row.Store], l)
		}
		col := o.Row.Distribution() + ", every " + shortDuration(o.Row.Every)
		if !slices.Contains(cols, col) {
			cols = append(cols, col)
		}
		cells[l][col] = o
	}
	for i, name := range stOrder {
		if i > 0 {
			fmt.Fprintln(w)
		}
		title, unit := name, "store operations per 1,000 requests"
		if st, ok := stores[name]; ok {
			title, unit = st.Title(), st.OpsUnit()
		}
		fmt.Fprintf(w, "**%s**: %d clients a row; ops/1k = %s, of the whole fleet (its rows run at once)\n\n", title, SpreadClients, unit)
		fmt.Fprintf(w, "| nodes | sync_rate | sync_above | limit | %s | ops/1k (fleet) |\n", strings.Join(cols, " | "))
		fmt.Fprintf(w, "|--:|--:|--:|--:|%s--:|\n", strings.Repeat("--:|", len(cols)))
		for _, l := range lines[name] {
			var ops float64
			var parts []string
			for _, col := range cols {
				o, ok := cells[l][col]
				if !ok {
					parts = append(parts, "–")
					continue
				}
				ops = o.OpsPer1k()
				parts = append(parts, spreadCell(o))
			}
			setting := Row{SyncRate: l.key.SyncRate, SyncAbove: l.key.SyncAbove}
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %.0f |\n", l.key.Nodes, setting.SyncRateString(),
				setting.SyncAboveString(), l.limit.Label(), strings.Join(parts, " | "), ops)
		}
	}
}

// spreadCell formats a spread row in its table: the worst client's
// admitted / limit and count, its bound (count), and "**no**" when a
// client went past its own bound.
func spreadCell(o SpreadOutcome) string {
	s := fmt.Sprintf("%.2f (%d ≤ %d)", o.Ratio(), o.WorstAdmitted(), o.WorstBound())
	if !o.Holds {
		s = fmt.Sprintf("%.2f (%d, bound %d) **no**", o.Ratio(), o.WorstAdmitted(), o.WorstBound())
		if o.Breach != o.Worst {
			s += fmt.Sprintf(" (client %d: %d > %d)", o.Breach+1, o.Admitted[o.Breach], o.Bounds[o.Breach])
		}
	}
	return s
}
