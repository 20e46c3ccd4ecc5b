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
	"sync"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
)

// SpreadRunner runs the spread clients' family: for each fleet (a store,
// a size and a sync setting), it starts the nodes, sends the clients of
// every row of the fleet at once, stops the nodes and sums up each row.
// Fleets of the same size and setting on different stores run side by
// side: each store counts only its own fleet's work, and the clients are
// slow, so the load stays light but for the fast requests, which are
// staggered. That halves the family's time.
type SpreadRunner struct {
	// Caddy is the Caddy binary built with the plugin.
	Caddy string
	// Dir holds each fleet's configs and node logs.
	Dir string
	// Stores are the stores, by name.
	Stores map[string]Store
	// Progress, when set, receives a line per row; with Verbose, also
	// each client's admitted count.
	Progress io.Writer
	Verbose  bool
}

// spreadFleet is the rows that run on one fleet, with their indexes in
// the plan.
type spreadFleet struct {
	key  fleetKey
	rows []SpreadRow
	at   []int
}

// fleetID names a fleet in file names and keys.
func (f spreadFleet) ID() string {
	return Row{Store: f.key.Store, Pattern: Pattern{Name: fmt.Sprintf("spread%d", f.key.Nodes)},
		SyncRate: f.key.SyncRate, SyncAbove: f.key.SyncAbove}.ID()
}

// groupFleets returns the rows' fleets, in the order of their first rows.
func groupFleets(rows []SpreadRow) []spreadFleet {
	var fleets []spreadFleet
	index := map[fleetKey]int{}
	for i, r := range rows {
		k := r.fleet()
		j, ok := index[k]
		if !ok {
			j = len(fleets)
			index[k] = j
			fleets = append(fleets, spreadFleet{key: k})
		}
		fleets[j].rows = append(fleets[j].rows, r)
		fleets[j].at = append(fleets[j].at, i)
	}
	return fleets
}

// Run runs the rows and returns their outcomes in the rows' order. It
// stops at the first fleet that fails.
func (r *SpreadRunner) Run(ctx context.Context, rows []SpreadRow) ([]SpreadOutcome, error) {
	out := make([]SpreadOutcome, len(rows))
	fleets := groupFleets(rows)
	done := make([]bool, len(fleets))
	var mu sync.Mutex // Progress
	finished := 0
	for i, f := range fleets {
		if done[i] {
			continue
		}
		// This fleet and those of the other stores with its size and
		// setting, side by side.
		var batch []int
		for j := i; j < len(fleets); j++ {
			g := fleets[j].key
			if !done[j] && g.Nodes == f.key.Nodes && g.SyncRate == f.key.SyncRate && g.SyncAbove == f.key.SyncAbove {
				batch = append(batch, j)
				done[j] = true
			}
		}
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for b, j := range batch {
			wg.Go(func() {
				fl := fleets[j]
				outs, err := r.runFleet(ctx, fl)
				if err != nil {
					errs[b] = fmt.Errorf("fleet %s: %w", fl.ID(), err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				for k, o := range outs {
					out[fl.at[k]] = o
					finished++
					r.progress(finished, len(rows), o)
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return out, err
		}
	}
	return out, nil
}

// progress writes a row's line.
func (r *SpreadRunner) progress(i, n int, o SpreadOutcome) {
	if r.Progress == nil {
		return
	}
	fmt.Fprintf(r.Progress, "%3d/%d %-78s worst %d of %d (bound %d) %s, %d of %d clients past the limit, %7.1f ops/1k (fleet), late p99 %s ms\n",
		i, n, o.Row.String(), o.WorstAdmitted(), o.Row.Limit.Count, o.WorstBound(), holds(o.Holds),
		o.Past, len(o.Admitted), o.OpsPer1k(), ms(o.LateP99))
	if r.Verbose {
		fmt.Fprintf(r.Progress, "        admitted per client %v, bounds %v\n", o.Admitted, o.Bounds)
		if len(o.BreachRequests) > 0 {
			first := o.BreachRequests[0].Sent
			fmt.Fprintf(r.Progress, "        client %d's requests (sent after its first, node, status, latency):", o.Breach)
			for _, q := range o.BreachRequests {
				fmt.Fprintf(r.Progress, " %s@%d:%d/%s", q.Sent.Sub(first).Round(time.Millisecond), q.Node, q.Status, ms(q.Latency))
			}
			fmt.Fprintln(r.Progress)
		}
	}
}

// runFleet runs the rows of one fleet at once.
func (r *SpreadRunner) runFleet(ctx context.Context, f spreadFleet) ([]SpreadOutcome, error) {
	st, ok := r.Stores[f.key.Store]
	if !ok {
		return nil, fmt.Errorf("no store %q", f.key.Store)
	}
	dir := filepath.Join(r.Dir, f.ID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var limits []SpreadLimit
	for _, row := range f.rows {
		if !containsLimit(limits, row.Limit) {
			limits = append(limits, row.Limit)
		}
	}
	if err := st.Prepare(ctx); err != nil {
		return nil, err
	}
	before, err := st.Ops(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := caddyproc.StartAll(ctx, r.Caddy, dir, f.key.Nodes, BarePath, 1, func([]int) ([]byte, error) {
		cfg := NodeConfig{Listen: caddyproc.Listen(0), SyncRate: f.key.SyncRate, SyncAbove: f.key.SyncAbove,
			Strategy: st.Strategy(), Limit: 1, ManyLimit: 1}
		for _, l := range limits {
			cfg.Routes = append(cfg.Routes, LimitRoute{Path: l.Path(), Limit: float64(l.Count), Window: l.Window, Sliding: true})
		}
		return cfg.JSON()
	})
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			caddyproc.StopAll(nodes)
		}
	}()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL(""))
	}
	client := NewClient()
	defer client.CloseIdleConnections()

	// Keys of this fleet only: nothing an earlier fleet counted can count.
	prefix := f.ID() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	for i := range nodes {
		warm := Target{Nodes: urls, Path: limits[0].Path(), Keys: []string{prefix + "warm-" + strconv.Itoa(i)}}
		res := Send(ctx, client, warm, time.Now(), []Request{{Node: i}})
		if res[0].Status != http.StatusOK {
			return nil, fmt.Errorf("warm-up request to node %d: status %d, %v; its log:\n%s",
				i+1, res[0].Status, res[0].Err, nodes[i].Log(20))
		}
	}

	// Every client of every row, placed in time (planStarts).
	var clients []*spreadClient
	for ri, row := range f.rows {
		for c := range SpreadClients {
			clients = append(clients, &spreadClient{row: ri, index: c, reqs: SpreadSchedule(row, c),
				window: row.Limit.Window, phase: time.Duration(c) * max(row.SyncRate, 100*time.Millisecond) / SpreadClients})
		}
	}
	base := time.Now().Add(300 * time.Millisecond)
	planStarts(clients, base)

	// One open loop per route, at once: a route's requests, in time order.
	type route struct {
		target  Target
		reqs    []Request
		clients []*spreadClient // by Request.Key
	}
	routes := make([]*route, len(limits))
	for i, l := range limits {
		routes[i] = &route{target: Target{Nodes: urls, Path: l.Path()}}
	}
	for _, c := range clients {
		rt := routes[indexLimit(limits, f.rows[c.row].Limit)]
		key := len(rt.clients)
		rt.clients = append(rt.clients, c)
		rt.target.Keys = append(rt.target.Keys, prefix+f.rows[c.row].ID()+"-c"+strconv.Itoa(c.index))
		for _, q := range c.reqs {
			rt.reqs = append(rt.reqs, Request{At: c.start.Sub(base) + q.At, Node: q.Node, Key: key})
		}
	}
	results := make([][]Result, len(routes))
	var wg sync.WaitGroup
	for i, rt := range routes {
		sortRequests(rt.reqs)
		wg.Go(func() { results[i] = Send(ctx, client, rt.target, base, rt.reqs) })
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	took := time.Since(base)
	client.CloseIdleConnections()
	for i, n := range nodes {
		if !n.Running() {
			return nil, fmt.Errorf("node %d exited during the load; its log:\n%s", i+1, n.Log(30))
		}
	}
	caddyproc.StopAll(nodes)
	stopped = true
	if err := st.Settle(ctx); err != nil {
		return nil, err
	}
	after, err := st.Ops(ctx)
	if err != nil {
		return nil, err
	}

	// Each row's results, keyed by its clients' numbers.
	perRow := make([][]Result, len(f.rows))
	limited := len(nodes)
	for i, rt := range routes {
		for _, res := range results[i] {
			c := rt.clients[res.Key]
			res.Key = c.index
			perRow[c.row] = append(perRow[c.row], res)
			limited++
		}
	}
	outcomes := make([]SpreadOutcome, len(f.rows))
	for i, row := range f.rows {
		o := AnalyzeSpread(row, SpreadClients, base, perRow[i])
		o.FleetOps, o.FleetRequests, o.FleetTook = after-before, limited, took
		if o.Failed > 0 {
			return nil, fmt.Errorf("%s: %d of %d requests failed, the first: %s", row, o.Failed, o.Limited, o.FirstError)
		}
		outcomes[i] = o
	}
	return outcomes, nil
}

// sortRequests sorts requests by their send times, keeping the order of
// those at the same time.
func sortRequests(reqs []Request) {
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
}

func containsLimit(ls []SpreadLimit, l SpreadLimit) bool { return indexLimit(ls, l) >= 0 }

func indexLimit(ls []SpreadLimit, l SpreadLimit) int {
	for i, x := range ls {
		if x == l {
			return i
		}
	}
	return -1
}
