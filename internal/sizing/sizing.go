// Package sizing is the sizing harness: it measures what a fleet of Caddy
// nodes costs its store (commands a second, CPU, memory and connections)
// for a number of nodes, active keys and sync_rate, and compares each
// measurement with a formula derived from how the plugin talks to the
// store (Model).
//
// For each row it starts the nodes (the accuracy harness's config and
// internal/caddyproc), sends them an open-loop load of Rate requests a
// second on loopback, round-robin over the nodes, each request's key drawn
// uniformly from the row's active keys, and after a warm-up reads the
// store's counters twice, a measuring window apart. Its test
// TestSizingFull, run by scripts/bench-sizing.sh, starts the stores
// (internal/redistest, internal/pgtest), runs the rows and prints the
// table of docs/operations.md, which it can write into that page.
package sizing

import (
	"cmp"
	"fmt"
	"time"
)

// Row is one measurement: a store, a fleet, a key space and a sync_rate.
type Row struct {
	// Store is "redis" or "postgres".
	Store string
	// Nodes is the number of Caddy nodes.
	Nodes int
	// Keys is the number of active keys: the load draws every request's
	// key uniformly from this many.
	Keys int
	// SyncRate is the namespace's sync_rate: 0 is synchronous.
	SyncRate time.Duration
	// Rate is the load in requests a second, over the whole fleet.
	Rate float64
}

// SyncRateString is the row's sync_rate as a config writes it.
func (r Row) SyncRateString() string {
	if r.SyncRate == 0 {
		return "0"
	}
	return r.SyncRate.String()
}

// ID names the row in file names and filters: letters, digits and dashes.
func (r Row) ID() string {
	return fmt.Sprintf("%s-n%d-k%d-sync%s", r.Store, r.Nodes, r.Keys, r.SyncRateString())
}

// The dimensions of the full grid.
var (
	NodeCounts = []int{1, 3, 10}
	KeyCounts  = []int{1000, 10000, 100000}
	SyncRates  = []time.Duration{100 * time.Millisecond, time.Second, 0}
)

// RateFor is the load of a row of keys active keys: each key hit about
// once a second fleet-wide, up to maxRate requests a second, beyond which
// each key is hit once every keys/maxRate seconds.
func RateFor(keys int, maxRate float64) float64 {
	return min(float64(keys), maxRate)
}

// FullPlan returns the whole grid for the stores, in the order it runs:
// store, nodes, keys, sync_rate.
func FullPlan(stores []string, maxRate float64) []Row {
	var rows []Row
	for _, st := range stores {
		for _, n := range NodeCounts {
			for _, k := range KeyCounts {
				for _, s := range SyncRates {
					rows = append(rows, Row{Store: st, Nodes: n, Keys: k, SyncRate: s, Rate: RateFor(k, maxRate)})
				}
			}
		}
	}
	return rows
}

// Measured is what the harness read of the store over a row's measuring
// window.
type Measured struct {
	Row Row
	// Seconds is the measuring window's length.
	Seconds float64
	// Sent is the requests a second the load really sent in the window,
	// and Failed how many of the row's requests got no 200.
	Sent   float64
	Failed int
	// Commands is the store's commands a second: Redis's INFO
	// commandstats calls (script commands included), PostgreSQL's
	// transactions (pg_stat_database xact_commit + xact_rollback).
	Commands float64
	// Trips is the store's round trips a second where the store tells
	// them: Redis's script runs (EVALSHA and EVAL calls); 0 for
	// PostgreSQL, whose transactions are its round trips.
	Trips float64
	// Rows is the rows PostgreSQL wrote a second (tup_inserted +
	// tup_updated + tup_deleted); 0 for Redis.
	Rows float64
	// CPU is the store's CPU time per second of the window, in
	// percent of one core.
	CPU float64
	// Memory is what the store holds for the nodes, in bytes: Redis's
	// used_memory minus its value before the row, or PostgreSQL's table
	// and index sizes (pg_total_relation_size) at the window's end. For
	// Redis, the median of readings a second apart over the window, as
	// one reading may catch a client's buffers mid-call (see
	// MemorySampler). MemoryElapsed is how long the load had run when it
	// was: the window's end, or its middle, where a figure that grows
	// steadily has its median (0 in rows saved before it was kept: the
	// end).
	Memory        float64
	MemoryElapsed time.Duration
	// Conns is the store's client connections at the window's end,
	// the harness's own left out.
	Conns int
	// Elapsed is how long the load had run at the window's end: what
	// lives longer than it (markers) has not reached its steady state.
	Elapsed time.Duration
	// Took is the row's wall time, nodes' start and stop included.
	Took time.Duration
}

// memoryAt is how long the load had run when m's Memory was read.
func (m Measured) memoryAt() time.Duration { return cmp.Or(m.MemoryElapsed, m.Elapsed) }
