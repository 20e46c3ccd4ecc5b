package sizing

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/accuracy"
	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
)

// Runner runs rows: for each, it starts the nodes, sends the load, reads
// the store a measuring window apart and stops the nodes.
type Runner struct {
	// Caddy is the Caddy binary built with the plugin.
	Caddy string
	// Dir holds each row's configs and node logs.
	Dir string
	// Warmup is how long the load runs before the window, Measure the
	// window's length (see measureFor).
	Warmup, Measure time.Duration
	// Stores are the stores, by name.
	Stores map[string]Store
	// Progress, when set, receives a line per row.
	Progress io.Writer
	// Save, when set, receives each row measured (see Run).
	Save io.Writer
}

// Run runs the rows in order. A row that fails (a node that does not
// start, requests that fail) is reported on Progress and left out, and the
// others still run; Run returns the rows measured and the first error.
// With Save set, each row measured is appended to it as a line of JSON as
// soon as it is, so that a run cut short keeps what it measured.
func (r *Runner) Run(ctx context.Context, rows []Row) ([]Measured, error) {
	var out []Measured
	var first error
	warm := map[string]bool{}
	for i, row := range rows {
		if ctx.Err() != nil {
			return out, errors.Join(first, ctx.Err())
		}
		if row.Store == "redis" && !warm[row.Store] {
			// The first row would find the server as it started: a Redis
			// that never held keys uses about 100 KiB less after a
			// FLUSHALL than one that did, so the first row's memory would
			// count what every later row's baseline holds. A short row,
			// not reported, brings it to where every row finds it.
			// (PostgreSQL's rows each measure tables of their own.)
			warm[row.Store] = true
			short := *r
			short.Warmup, short.Measure = time.Second, time.Second
			if _, err := short.RunRow(ctx, row); err != nil {
				first = cmp.Or(first, fmt.Errorf("warming %s up: %w", row.Store, err))
			}
		}
		m, err := r.RunRow(ctx, row)
		if err != nil {
			err = fmt.Errorf("row %d (%s): %w", i+1, row.ID(), err)
			if r.Progress != nil {
				fmt.Fprintf(r.Progress, "%3d/%d %-32s FAILED: %v\n", i+1, len(rows), row.ID(), err)
			}
			first = cmp.Or(first, err)
			continue
		}
		if r.Progress != nil {
			fmt.Fprintf(r.Progress, "%3d/%d %-32s sent %6.0f/s  %8.0f cmd/s  %7.0f trips/s  %6.1f%% CPU  %8.0f KiB  %3d conns\n",
				i+1, len(rows), row.ID(), m.Sent, m.Commands, m.Trips, m.CPU, m.Memory/1024, m.Conns)
		}
		if r.Save != nil {
			if err := json.NewEncoder(r.Save).Encode(m); err != nil {
				return out, err
			}
		}
		out = append(out, m)
	}
	return out, first
}

// Load reads the rows that Run saved, one JSON object a line.
func Load(rd io.Reader) ([]Measured, error) {
	var out []Measured
	dec := json.NewDecoder(rd)
	for {
		var m Measured
		err := dec.Decode(&m)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("reading saved rows: %w", err)
		}
		out = append(out, m)
	}
}

// PostgresPurge is how often each node's PostgreSQL store purges what
// expired (strategy/postgres's purgeEvery).
const PostgresPurge = 30 * time.Second

// measureFor returns the measuring window of a row of store, for a Measure
// of measure: measure, and for PostgreSQL at least PostgresPurge, so that
// every node's purge (a few transactions, one per table and chunk of
// 10,000 rows it deletes) falls in the window exactly once, where a
// shorter one would catch it in some rows and not in others.
func measureFor(store string, measure time.Duration) time.Duration {
	if store == "postgres" {
		return max(measure, PostgresPurge)
	}
	return measure
}

// limitless is the nodes' limit: far above any key's hits, so that every
// request is admitted and counted.
const limitless = 1e9

// RunRow runs one row.
func (r *Runner) RunRow(ctx context.Context, row Row) (m Measured, err error) {
	m.Row = row
	began := time.Now()
	defer func() { m.Took = time.Since(began) }()
	st, ok := r.Stores[row.Store]
	if !ok {
		return m, fmt.Errorf("no store %q", row.Store)
	}
	dir := filepath.Join(r.Dir, row.ID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return m, err
	}
	strategy, err := st.Prepare(ctx, row)
	if err != nil {
		return m, err
	}
	nodes, err := caddyproc.StartAll(ctx, r.Caddy, dir, row.Nodes, accuracy.BarePath, 1, func([]int) ([]byte, error) {
		return accuracy.NodeConfig{
			Listen: caddyproc.Listen(0), SyncRate: row.SyncRate, Strategy: strategy,
			Limit: limitless, ManyLimit: limitless,
		}.JSON()
	})
	if err != nil {
		return m, err
	}
	defer caddyproc.StopAll(nodes)

	prefix := row.ID() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	t := accuracy.Target{Path: accuracy.ManyPath, Keys: make([]string, row.Keys)}
	for k := range t.Keys {
		t.Keys[k] = prefix + strconv.Itoa(k)
	}
	for _, n := range nodes {
		t.Nodes = append(t.Nodes, n.URL(""))
	}
	client := accuracy.NewClient()
	defer client.CloseIdleConnections()
	for i := range nodes {
		res := accuracy.Send(ctx, client, t, time.Now(), []accuracy.Request{{Node: i, Key: i % row.Keys}})
		if res[0].Status != http.StatusOK {
			return m, fmt.Errorf("warm-up request to node %d: status %d, %v; its log:\n%s",
				i+1, res[0].Status, res[0].Err, nodes[i].Log(20))
		}
	}

	measure := measureFor(row.Store, r.Measure)
	reqs := Schedule(row, r.Warmup+measure+time.Second, 1)
	start := time.Now().Add(100 * time.Millisecond)
	done := make(chan []accuracy.Result, 1)
	go func() { done <- accuracy.Send(ctx, client, t, start, reqs) }()

	wait := func(until time.Time) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(until)):
			return nil
		}
	}
	var a, b Reading
	var memory []float64 // sampled between a and b
	err = wait(start.Add(r.Warmup))
	if err == nil {
		a, err = st.Read(ctx)
	}
	// Memory every second, to take the median, from a store that reads
	// it without a call the figures count.
	sampler, sampled := st.(MemorySampler)
	for next := a.At.Add(time.Second); sampled && err == nil && next.Before(a.At.Add(measure)); next = next.Add(time.Second) {
		var mem int64
		if err = wait(next); err == nil {
			mem, err = sampler.Memory(ctx)
			memory = append(memory, float64(mem))
		}
	}
	if err == nil {
		err = wait(a.At.Add(measure))
	}
	if err == nil {
		b, err = st.Read(ctx)
	}
	results := <-done // the load ends a second after the window
	if err != nil {
		return m, err
	}
	for i, n := range nodes {
		if !n.Running() {
			return m, fmt.Errorf("node %d exited during the load; its log:\n%s", i+1, n.Log(30))
		}
	}
	sent := 0
	for _, res := range results {
		if res.Status != http.StatusOK {
			m.Failed++
		}
		if !res.Sent.Before(a.At) && res.Sent.Before(b.At) {
			sent++
		}
	}
	secs := b.At.Sub(a.At).Seconds()
	m.Seconds = secs
	m.Sent = float64(sent) / secs
	m.Commands = float64(b.Commands-a.Commands) / secs
	m.Trips = float64(b.Trips-a.Trips) / secs
	m.Rows = float64(b.Rows-a.Rows) / secs
	m.CPU = (b.CPU - a.CPU).Seconds() / secs * 100
	m.Memory, m.MemoryElapsed = float64(b.Memory), b.At.Sub(start)
	if sampled {
		memory = append(memory, float64(a.Memory), float64(b.Memory))
		slices.Sort(memory)
		m.Memory, m.MemoryElapsed = memory[len(memory)/2], a.At.Add(b.At.Sub(a.At)/2).Sub(start)
	}
	m.Conns = b.Conns
	m.Elapsed = b.At.Sub(start)
	if m.Failed > 0 {
		return m, fmt.Errorf("%d of %d requests failed", m.Failed, len(results))
	}
	return m, nil
}

// Schedule returns a row's requests over length: Rate a second, evenly
// spaced, round-robin over the nodes, each key drawn uniformly from the
// row's keys with a fixed seed.
func Schedule(row Row, length time.Duration, seed uint64) []accuracy.Request {
	n := int(row.Rate * length.Seconds())
	rng := rand.New(rand.NewPCG(seed, 0x512e))
	reqs := make([]accuracy.Request, n)
	for i := range reqs {
		reqs[i] = accuracy.Request{
			At:   time.Duration(float64(i) / row.Rate * float64(time.Second)),
			Node: i % row.Nodes,
			Key:  rng.IntN(row.Keys),
		}
	}
	return reqs
}
