package sizing

import (
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Window is the limit's window in the harness's config (the accuracy
// harness's: one fixed window of a second), which sets how many counters
// a key makes and how long they live.
const Window = time.Second

// counterLife is how long a counter lives after its window starts: two
// windows and a second (strategy/redis's expiry, and PostgreSQL's).
const counterLife = 2*Window + time.Second

// scriptRun is the most counters one Redis script run pushes, and
// mgetKeys the most keys one fetch MGET reads (two counters a key and
// window size, 512 counters).
const (
	scriptRun = 256
	mgetKeys  = 256
)

// Distinct is the expected number of distinct keys among draws drawn
// uniformly from keys: keys × (1 − e^(−draws/keys)).
func Distinct(draws, keys float64) float64 {
	if draws <= 0 || keys <= 0 {
		return 0
	}
	return keys * -math.Expm1(-draws/keys)
}

// Constants are the formula's fitted constants: what the code cannot say,
// the store's CPU per unit of work and its bytes per item held.
type Constants struct {
	// CPUPerCommand and CPUPerTrip are the store's CPU, in microseconds,
	// per command and per round trip (Redis: script run; PostgreSQL:
	// transaction, and a command is then a row written).
	CPUPerCommand, CPUPerTrip float64
	// CPUIdle is the store's CPU, in percent of a core, that is no
	// call's: Redis's timers, PostgreSQL's background processes.
	CPUIdle float64
	// CPUPerConn is the store's CPU, in percent of a core, per client
	// connection: PostgreSQL's backends cost some even when idle.
	CPUPerConn float64
	// CPUPerBeat is the store's CPU, in microseconds, per beat of a
	// periodic fleet: its nodes' runs fall on multiples of sync_rate, so
	// the store wakes to them once a sync_rate, whatever the number of
	// nodes, and does per wake-up what a wake-up costs beyond its calls.
	CPUPerBeat float64
	// BytesPerCounter and BytesPerMarker are the memory of one counter
	// and of one dedupe marker (or batch ID row) held.
	BytesPerCounter, BytesPerMarker float64
	// BytesPerConn is the memory of one client connection (Redis's
	// buffers; 0 for PostgreSQL, whose tables alone are measured).
	BytesPerConn float64
	// BytesPerUpdate is the memory a PostgreSQL update of a counter row
	// leaves until a vacuum: the row's old version.
	BytesPerUpdate float64
	// BytesEmpty is the size of PostgreSQL's tables and indexes before
	// they hold a row (0 for Redis, measured above its empty state).
	BytesEmpty float64
	// TripLatency is how long a synchronous round trip keeps a node's
	// next hits waiting, in microseconds: hits that arrive meanwhile share
	// the next round trip.
	TripLatency float64
	// PurgeTrips is how many transactions a node's PostgreSQL purge
	// costs, every PostgresPurge: one per table and chunk of 10,000 rows
	// it deletes, or one that finds another node purging (0 for Redis).
	PurgeTrips float64
	// ConnsPeriodic is the connections one periodic node holds to the
	// store.
	ConnsPeriodic float64
	// ConnsOverlap is how many of a synchronous node's calls a second
	// other than its round trips (its runs, its reads of stale keys) may
	// start while a round trip is out: each that does has the client's
	// pool open a second connection, which it keeps. So a node holds
	// 2 − e^(−ConnsOverlap × r × L × elapsed) connections after elapsed,
	// r × L the share of time its round trip is out (L the TripLatency):
	// one at first, two in the long run.
	ConnsOverlap float64
}

// Prediction is what the formula predicts for a row, per second unless
// said otherwise.
type Prediction struct {
	Commands float64 // Redis commands, or PostgreSQL transactions
	Trips    float64 // Redis script runs, or PostgreSQL transactions
	Rows     float64 // PostgreSQL rows written (0 for Redis)
	CPU      float64 // percent of one core
	Memory   float64 // bytes
	Conns    float64
	// Calls is every round trip a second, a periodic fetch's included
	// (Trips counts only what the store tells apart: script runs).
	Calls float64
	// Beats are the times a second the fleet's runs reach the store
	// together: once a sync_rate when periodic (see CPUPerBeat), 0 at
	// sync_rate 0.
	Beats float64
	// Counters and Markers are the counters and markers (Redis) or
	// batch ID rows (PostgreSQL) the store holds at the window's end; for
	// PostgreSQL, Counters are the counter rows inserted and Updates the
	// row versions that updates left.
	Counters, Markers, Updates float64
}

// periodicWork returns one node's expected diffs per sync run (distinct
// key-window counters it touched) and the keys its fetch reads (those
// touched in its last two runs). Runs are aligned to multiples of the
// sync_rate and windows to multiples of their size, so a run spans a
// window's start only when neither divides the other; then a key hit on
// both sides has a counter, a diff, in each.
func periodicWork(perNode float64, keys int, syncRate time.Duration) (diffs, fetched float64) {
	t := syncRate.Seconds()
	w := Window.Seconds()
	// Average over the runs of a long span: the pattern repeats.
	const runs = 64
	for i := range runs {
		start := float64(i) * t
		end := start + t
		for a := start; a < end-1e-9; {
			b := min(end, (math.Floor(a/w+1e-9)+1)*w)
			diffs += Distinct(perNode*(b-a), float64(keys))
			a = b
		}
	}
	diffs /= runs
	fetched = Distinct(perNode*2*t, float64(keys))
	return diffs, fetched
}

// Predict returns the formula's prediction for a row whose load has run
// for elapsed at the measuring window's end.
func Predict(r Row, c Constants, elapsed time.Duration) Prediction {
	var p Prediction
	var ids float64 // PostgreSQL's batch and hit ID rows a second
	n := float64(r.Nodes)
	perNode := r.Rate / n
	// Counters alive: every key-window counter of the windows started in
	// the last counterLife; the current window's is partly filled.
	life := counterLife.Seconds() / Window.Seconds()
	full := Distinct(r.Rate*Window.Seconds(), float64(r.Keys))
	p.Counters = full * (life - 0.5)
	if r.SyncRate > 0 {
		runs := n / r.SyncRate.Seconds() // sync runs a second, fleet-wide
		p.Beats = 1 / r.SyncRate.Seconds()
		diffs, fetched := periodicWork(perNode, r.Keys, r.SyncRate)
		pushRuns := math.Ceil(diffs / scriptRun)
		// A run with nothing to push or fetch asks nothing.
		busy := -math.Expm1(-perNode * r.SyncRate.Seconds())
		switch r.Store {
		case "postgres":
			// One statement pushes the batch (its ID row and its upserts),
			// one query fetches: each its own transaction.
			p.Trips = runs * (busy + (-math.Expm1(-perNode * 2 * r.SyncRate.Seconds())))
			p.Commands = p.Trips
			ids = runs * busy
			p.Rows = runs*diffs + ids
			p.Calls = p.Trips
		default:
			// Per script run: EVALSHA, its marker's SET, one MGET; then a
			// write per diff. A fetch: one MGET per 256 keys.
			p.Trips = runs * pushRuns
			p.Commands = runs * (diffs + 3*pushRuns + math.Ceil(fetched/mgetKeys))
			// A push's marker lives as long as its counters, and at
			// least strategy.MinBatchIDLife: the longer here.
			p.Markers = p.Trips * max(counterLife, strategy.MinBatchIDLife).Seconds()
			// A fetch's MGETs ride in one pipeline, a round trip.
			p.Calls = p.Trips + runs*(-math.Expm1(-perNode*2*r.SyncRate.Seconds()))
		}
		p.Conns = n * c.ConnsPeriodic
	} else {
		// Hits that arrive while a node's round trip is out share the
		// next one: trips = r / (1 + r·latency) per node.
		trips := n * perNode / (1 + perNode*c.TripLatency/1e6)
		p.Trips, p.Calls = trips, trips
		hitsPerTrip := r.Rate / trips
		// Writes: one per counter a trip changes, a key's hits of one trip
		// sharing theirs.
		writes := trips * Distinct(hitsPerTrip, float64(r.Keys))
		switch r.Store {
		case "postgres":
			// One call of the hit function per trip, one transaction: its
			// ID row, and an upsert per counter.
			p.Commands = trips
			ids = trips
			p.Rows = ids + writes
		default:
			// EVALSHA, the marker's SET NX, then an INCRBYFLOAT per counter
			// (a key's hits of one trip share theirs); but a key's first
			// hit on a node in a window reads its counters first (MGET)
			// and makes them (SET NX PXAT): one more command per key,
			// window and node.
			firsts := n * Distinct(perNode*Window.Seconds(), float64(r.Keys)) / Window.Seconds()
			p.Commands = 2*trips + writes + firsts
		}
		// A synchronous trip's marker lives a minute or two: none has
		// expired within the first minute.
		p.Markers = trips * math.Min(elapsed.Seconds(), 90)
		p.Conns = n * syncConns(perNode, c, elapsed)
	}
	if r.Store == "postgres" {
		purges := n * c.PurgeTrips / PostgresPurge.Seconds()
		p.Commands += purges
		p.Trips += purges
		p.Calls += purges
	}
	units := p.Commands
	if r.Store == "postgres" {
		units = p.Rows
		// PostgreSQL keeps every row version it wrote until a purge (every
		// 30 s, first at a random point) deletes the expired counters and
		// a vacuum frees their space: within a row's first half minute,
		// its tables hold all it wrote. Markers are the batch and hit ID
		// rows, one a transaction that writes.
		// A counter row is inserted once per key and window, and updated
		// by the rest of its writes.
		inserts := full / Window.Seconds()
		p.Counters = inserts * elapsed.Seconds()
		p.Updates = max(p.Rows-ids-inserts, 0) * elapsed.Seconds()
		p.Markers = ids * elapsed.Seconds()
	}
	p.CPU = (c.CPUPerCommand*units+c.CPUPerTrip*p.Calls+c.CPUPerBeat*p.Beats)/1e6*100 + c.CPUIdle + c.CPUPerConn*p.Conns
	p.Memory = c.BytesPerCounter*p.Counters + c.BytesPerMarker*p.Markers + c.BytesPerUpdate*p.Updates +
		c.BytesPerConn*p.Conns + c.BytesEmpty
	return p
}

// PredictMemory returns the formula's memory for a measured row, at the
// time its Memory was read (MemoryElapsed, or Elapsed in older rows).
func PredictMemory(m Measured, c Constants) float64 {
	return Predict(m.Row, c, m.memoryAt()).Memory
}

// syncConns returns the connections a synchronous node that takes r
// hits a second holds after elapsed (see Constants.ConnsOverlap).
func syncConns(r float64, c Constants, elapsed time.Duration) float64 {
	out := min(r*c.TripLatency/1e6, 1) // the share of time a round trip is out
	return 2 - math.Exp(-c.ConnsOverlap*out*elapsed.Seconds())
}

// Error is the relative error of a prediction against a measurement, as
// a fraction (−0.1: predicted 10 % below); 0 when both are 0.
func Error(predicted, measured float64) float64 {
	if measured == 0 {
		if predicted == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return predicted/measured - 1
}
