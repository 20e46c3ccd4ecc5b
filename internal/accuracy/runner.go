package accuracy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/benchhttp"
	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
)

// Runner runs rows: for each, it starts the nodes, sends the pattern's
// traffic, stops the nodes and sums up what happened.
type Runner struct {
	// Caddy is the Caddy binary built with the plugin.
	Caddy string
	// Dir holds each row's configs and node logs.
	Dir string
	// Nodes is the fleet's size.
	Nodes int
	// Limit is the limit per Window of the one-key patterns.
	Limit float64
	// Duration is how long a pattern's traffic lasts, unless the pattern
	// sets its own: a whole number of windows.
	Duration time.Duration
	// Stores are the stores, by name.
	Stores map[string]Store
	// Progress, when set, receives a line per row; with Verbose, also how
	// the worst window of a row over the limit went.
	Progress io.Writer
	Verbose  bool
}

// Run runs the rows in order. It stops at the first row that fails: a
// node that does not start, or a store that cannot be read.
func (r *Runner) Run(ctx context.Context, rows []Row) ([]Outcome, error) {
	var out []Outcome
	for i, row := range rows {
		o, err := r.RunRow(ctx, row)
		if err != nil {
			return out, fmt.Errorf("row %d (%s): %w", i+1, row, err)
		}
		if r.Progress != nil {
			fmt.Fprintf(r.Progress, "%3d/%d %-62s worst %.3f (bound %.3f, %.2f intervals) %s %7.1f ops/1k  added p50 %s p99 %s  sent %.0f/%.0f req/s\n",
				i+1, len(rows), row.String(), o.Worst, o.Bound(), o.Intervals(), holds(o.Holds), o.OpsPer1k(),
				ms(o.AddedP50()), ms(o.AddedP99()), o.SentRate, o.TargetRate)
		}
		if r.Progress != nil && r.Verbose && o.Commands != "" {
			fmt.Fprintf(r.Progress, "        commands: %s\n", o.Commands)
		}
		if r.Progress != nil && o.Worst > 1 && r.Verbose {
			fmt.Fprintf(r.Progress, "        worst window: %s\n", o.WorstDetail)
		}
		if r.Progress != nil && r.Verbose && o.LagChecked > 0 {
			fmt.Fprintf(r.Progress, "        admissions past the limit: %d, unexplained by the others' unseen hits: %d\n", o.LagChecked, len(o.Unexplained))
			for j, u := range o.Unexplained {
				if j == 5 {
					fmt.Fprintf(r.Progress, "          and %d more\n", len(o.Unexplained)-j)
					break
				}
				fmt.Fprintf(r.Progress, "          %s\n", u)
			}
		}
		out = append(out, o)
	}
	return out, nil
}

func holds(ok bool) string {
	if ok {
		return "holds"
	}
	return "EXCEEDED"
}

// RunRow runs one row.
func (r *Runner) RunRow(ctx context.Context, row Row) (Outcome, error) {
	st, ok := r.Stores[row.Store]
	if !ok {
		return Outcome{}, fmt.Errorf("no store %q", row.Store)
	}
	p := row.Pattern
	limit := r.Limit
	if p.LimitDiv > 0 {
		limit /= p.LimitDiv
	}
	dir := filepath.Join(r.Dir, row.ID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Outcome{}, err
	}
	if err := st.Prepare(ctx); err != nil {
		return Outcome{}, err
	}
	before, err := st.Ops(ctx)
	if err != nil {
		return Outcome{}, err
	}
	cc, _ := st.(CommandCounter)
	var commandsBefore benchhttp.CommandStats
	if cc != nil && r.Verbose {
		if commandsBefore, err = cc.Commands(ctx); err != nil {
			return Outcome{}, err
		}
	}

	nodes, err := caddyproc.StartAll(ctx, r.Caddy, dir, r.Nodes, BarePath, 1, func([]int) ([]byte, error) {
		return NodeConfig{
			Listen: caddyproc.Listen(0), SyncRate: row.SyncRate, SyncAbove: row.SyncAbove, Strategy: st.Strategy(),
			Limit: r.Limit, ManyLimit: r.Limit / max(p.LimitDiv, 1), Units: p.Units > 0,
		}.JSON()
	})
	if err != nil {
		return Outcome{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			caddyproc.StopAll(nodes)
		}
	}()

	// Keys of this row only: nothing an earlier row counted can count.
	prefix := row.ID() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	t := Target{Path: OnePath, Keys: []string{prefix + "k0"}}
	if p.Units > 0 {
		t.Path = UnitsPath
	}
	if p.Keys > 1 {
		t.Path = ManyPath
		t.Keys = make([]string, p.Keys)
		for k := range t.Keys {
			t.Keys[k] = prefix + "k" + strconv.Itoa(k)
		}
	}
	for _, n := range nodes {
		t.Nodes = append(t.Nodes, n.URL(""))
	}
	client := NewClient()
	defer client.CloseIdleConnections()

	// A warm-up request per node, on a key of its own: each node connects
	// to the store (and PostgreSQL checks its tables) before the load.
	for i := range nodes {
		warm := Target{Nodes: t.Nodes, Path: t.Path, Keys: []string{prefix + "warm"}}
		res := Send(ctx, client, warm, time.Now(), []Request{{Node: i}})
		if res[0].Status != http.StatusOK {
			return Outcome{}, fmt.Errorf("warm-up request to node %d: status %d, %v; its log:\n%s",
				i+1, res[0].Status, res[0].Err, nodes[i].Log(20))
		}
	}

	// The traffic starts at a window's start, at least 200 ms away.
	now := time.Now()
	start := now.Truncate(Window).Add(Window)
	if start.Sub(now) < 200*time.Millisecond {
		start = start.Add(Window)
	}
	// The pattern's rate is a multiple of the one-key limit's rate, also
	// for the many keys pattern, whose keys each have a smaller limit.
	reqs := Schedule(p, r.Nodes, r.Limit, r.Duration, 1)
	results := Send(ctx, client, t, start, reqs)
	if err := ctx.Err(); err != nil {
		return Outcome{}, err
	}
	client.CloseIdleConnections()
	for i, n := range nodes {
		if !n.Running() {
			return Outcome{}, fmt.Errorf("node %d exited during the load; its log:\n%s", i+1, n.Log(30))
		}
	}
	caddyproc.StopAll(nodes)
	stopped = true
	if err := st.Settle(ctx); err != nil {
		return Outcome{}, err
	}
	after, err := st.Ops(ctx)
	if err != nil {
		return Outcome{}, err
	}
	var commands string
	if commandsBefore != nil {
		commandsAfter, err := cc.Commands(ctx)
		if err != nil {
			return Outcome{}, err
		}
		commands = commandsRan(commandsBefore, commandsAfter)
	}

	o := Analyze(row, r.Nodes, limit, p.Rate*r.Limit/Window.Seconds()/p.MeanUnits(), start, results)
	o.Ops = after - before
	o.Commands = commands
	o.OpsRequests = o.Limited + len(nodes)
	if o.Failed > 0 {
		return o, fmt.Errorf("%d of %d limited requests failed, the first: %s", o.Failed, o.Limited, o.FirstError)
	}
	if o.Admitted == 0 {
		return o, errors.New("no request was admitted")
	}
	return o, nil
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// commandsRan returns the calls of each command between two counts, most
// first, as "evalsha 52, get 3": the harness's own INFO left out.
func commandsRan(before, after benchhttp.CommandStats) string {
	type ran struct {
		name  string
		calls int64
	}
	var rs []ran
	for name, n := range after {
		if d := n - before[name]; d > 0 && name != "info" {
			rs = append(rs, ran{name, d})
		}
	}
	slices.SortFunc(rs, func(a, b ran) int { return cmp.Or(cmp.Compare(b.calls, a.calls), strings.Compare(a.name, b.name)) })
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s %d", r.name, r.calls)
	}
	return strings.Join(parts, ", ")
}
