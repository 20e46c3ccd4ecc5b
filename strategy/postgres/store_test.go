package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// diffs returns n diffs of distinct keys, of one window.
func diffs(n int, prefix string, size time.Duration, start int64, value float64) []window.Diff {
	ds := make([]window.Diff, n)
	for i := range ds {
		ds[i] = window.Diff{Key: fmt.Sprintf("%s%d", prefix, i), Size: size, Start: start, Value: value}
	}
	return ds
}

// fetchOne returns the store's count of one counter, and whether it holds
// it.
func fetchOne(t *testing.T, s *Store, namespace, key string, size time.Duration, now time.Time) (float64, bool) {
	t.Helper()
	counts, err := s.GetCounters(ctxT(t), namespace, []string{key}, []time.Duration{size}, now)
	if err != nil {
		t.Fatalf("fetching: %v", err)
	}
	start := window.Start(now.UnixNano(), size)
	for _, c := range counts {
		if c.Key == key && c.Size == size && c.Start == start {
			return c.Value, true
		}
	}
	return 0, false
}

// TestSchemaQualifiedTable uses a table of another schema, whose name is
// folded to lower case, and checks that everything lands there.
func TestSchemaQualifiedTable(t *testing.T) {
	srv, dsn := startServer(t)
	conn := srv.Conn(t, testDB)
	if _, err := conn.Exec(ctxT(t), "CREATE SCHEMA edge"); err != nil {
		t.Fatal(err)
	}
	s := open(t, &Postgres{DSN: dsn, Table: "Edge.RL_Counters"})
	now := time.Now()
	d := window.Diff{Key: "k", Size: time.Hour, Start: window.Start(now.UnixNano(), time.Hour), Value: 1}
	if err := s.PushDiffs(ctxT(t), strategy.Batch{ID: "b", Namespace: "ns", Diffs: []window.Diff{d}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Hit(ctxT(t), "ns", "k", "h", []strategy.WindowHit{{Size: time.Hour, Start: d.Start, Value: 1, Max: 10}}, false); err != nil {
		t.Fatal(err)
	}
	if n := count(t, srv, "SELECT count(*) FROM edge.rl_counters"); n != 1 {
		t.Errorf("edge.rl_counters holds %d rows, want 1", n)
	}
	if n := count(t, srv, "SELECT count(*) FROM edge.rl_counters_ids"); n != 2 {
		t.Errorf("edge.rl_counters_ids holds %d rows, want 2", n)
	}
	if n := count(t, srv, "SELECT count(*) FROM pg_class WHERE relname LIKE 'rate_limit_counters%'"); n != 0 {
		t.Errorf("%d relations of the default table exist", n)
	}
}

// TestConcurrentFirstUse starts three stores (three nodes) on a new table
// at once: each creates the schema, and all succeed.
func TestConcurrentFirstUse(t *testing.T) {
	srv, dsn := startServer(t)
	at := time.Now().UnixNano()
	start := window.Start(at, time.Hour)
	for round := range 3 {
		table := fmt.Sprintf("first_use_%d", round)
		var stores []*Store
		for range 3 {
			stores = append(stores, open(t, &Postgres{DSN: dsn, Table: table}))
		}
		var wg sync.WaitGroup
		ready := make(chan struct{})
		for i, s := range stores {
			wg.Go(func() {
				<-ready
				var err error
				if i%2 == 0 {
					_, _, err = s.Hit(ctxT(t), "ns", "k", "", []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 100}}, false)
				} else {
					err = s.PushDiffs(ctxT(t), strategy.Batch{ID: fmt.Sprint("b", i), Namespace: "ns",
						Diffs: []window.Diff{{Key: "k", Size: time.Hour, Start: start, Value: 1}}})
				}
				if err != nil {
					t.Errorf("round %d, store %d: first use: %v", round, i, err)
				}
			})
		}
		close(ready)
		wg.Wait()
		if v, _ := fetchOne(t, stores[0], "ns", "k", time.Hour, time.Unix(0, at)); v != 3 {
			t.Errorf("round %d: count %v, want 3", round, v)
		}
	}
	if n := count(t, srv, "SELECT count(*) FROM pg_proc WHERE proname LIKE 'first_use_%_hits'"); n != 3 {
		t.Errorf("%d batch hit functions, want 3", n)
	}
}

// TestServerDown checks that a store whose server is down fails every call
// with an error that wraps strategy.ErrNotSent, and connects once it is
// back, creating the tables then.
func TestServerDown(t *testing.T) {
	srv, dsn := startServer(t)
	srv.Stop()
	s := open(t, &Postgres{DSN: dsn})
	now := time.Now()
	start := window.Start(now.UnixNano(), time.Hour)
	b := strategy.Batch{ID: "b", Namespace: "ns", Diffs: []window.Diff{{Key: "k", Size: time.Hour, Start: start, Value: 1}}}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, strategy.ErrNotSent) {
			t.Errorf("%s with the server down: got %v, want an error that wraps ErrNotSent", what, err)
		}
	}
	check("PushDiffs", s.PushDiffs(ctxT(t), b))
	_, err := s.GetCounters(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, now)
	check("GetCounters", err)
	check("Reset", s.Reset(ctxT(t), "ns", "k", []time.Duration{time.Hour}, now))
	_, _, err = s.Hit(ctxT(t), "ns", "k", "h", []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 10}}, false)
	check("Hit", err)
	_, err = s.Purge(ctxT(t))
	check("Purge", err)

	srv.Start()
	if err := s.PushDiffs(ctxT(t), b); err != nil {
		t.Fatalf("pushing once the server is up: %v", err)
	}
	if v, _ := fetchOne(t, s, "ns", "k", time.Hour, now); v != 1 {
		t.Errorf("count %v, want 1", v)
	}
}

// TestServerRestart stops (or kills) the server under a store in use: its
// calls fail, the last ones with errors that wrap strategy.ErrNotSent once
// no connection can be made, and it recovers when the server is back, with
// the data kept and a failed batch pushed again counted once.
func TestServerRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		stop func(*pgtest.Server)
	}{
		{"stop", (*pgtest.Server).Stop},
		{"kill", (*pgtest.Server).Kill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, dsn := startServer(t)
			s := open(t, &Postgres{DSN: dsn, MaxConns: 3})
			now := time.Now()
			start := window.Start(now.UnixNano(), time.Hour)
			batch := func(id string, v float64) strategy.Batch {
				return strategy.Batch{ID: id, Namespace: "ns", Diffs: []window.Diff{{Key: "k", Size: time.Hour, Start: start, Value: v}}}
			}
			if err := s.PushDiffs(ctxT(t), batch("before", 1)); err != nil {
				t.Fatal(err)
			}
			// Put several connections in the pool, for the outage to break.
			var wg sync.WaitGroup
			for range 3 {
				wg.Go(func() {
					if _, err := s.GetCounters(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, now); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()

			tc.stop(srv)
			var err error
			for i := range 10 {
				if err = s.PushDiffs(ctxT(t), batch("during", 2)); err == nil {
					t.Fatalf("push %d with the server down succeeded", i)
				}
			}
			if !errors.Is(err, strategy.ErrNotSent) {
				t.Errorf("pushing with the server down, again and again: %v, want an error that wraps ErrNotSent", err)
			}
			_, _, err = s.Hit(ctxT(t), "ns", "k", "", []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 10}}, false)
			if !errors.Is(err, strategy.ErrNotSent) {
				t.Errorf("hitting with the server down: %v, want an error that wraps ErrNotSent", err)
			}

			srv.Start()
			poll.Until(t, 10*time.Second, "the store to recover", func() bool {
				return s.PushDiffs(ctxT(t), batch("during", 2)) == nil
			})
			if err := s.PushDiffs(ctxT(t), batch("during", 2)); err != nil {
				t.Fatal(err)
			}
			if v, _ := fetchOne(t, s, "ns", "k", time.Hour, now); v != 3 {
				t.Errorf("count %v after the restart, want 3: the push before it, and the failed batch once", v)
			}
		})
	}
}

// TestClosedAfterUse closes a store in use: later calls fail with errors
// that wrap strategy.ErrNotSent, and its goroutines end.
func TestClosedAfterUse(t *testing.T) {
	srv, dsn := startServer(t)
	goroutines := runtime.NumGoroutine()
	s, err := (&Postgres{DSN: dsn}).Open()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := s.GetCounters(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("closing again: %v", err)
	}
	if _, err := s.GetCounters(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, now); !errors.Is(err, strategy.ErrNotSent) {
		t.Errorf("fetching after Close: %v, want an error that wraps ErrNotSent", err)
	}
	if _, err := s.Purge(ctxT(t)); !errors.Is(err, strategy.ErrNotSent) {
		t.Errorf("purging after Close: %v, want an error that wraps ErrNotSent", err)
	}
	poll.Until(t, 5*time.Second, "the store's goroutines to end", func() bool {
		return runtime.NumGoroutine() <= goroutines
	})
	poll.Until(t, 5*time.Second, "the store's connections to close", func() bool {
		return srv.Connections(t, testDB) == 0
	})
}

// TestFetchUsesThePrimaryKey checks that the fetch query looks up the keys
// it is asked for through the primary key, so that it costs in proportion
// to the keys asked, never to the table: on a table of 20,000 counters,
// before and after ANALYZE, as a custom plan and as the generic plan that
// a prepared statement may switch to, asked for 10 keys or 5,000.
func TestFetchUsesThePrimaryKey(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	now := time.Now()
	size := time.Hour
	cur := window.Start(now.UnixNano(), size)
	ds := append(diffs(10000, "key-", size, cur, 1), diffs(10000, "key-", size, cur-int64(size), 1)...)
	if err := s.PushDiffs(ctxT(t), strategy.Batch{ID: "fill", Namespace: "ns", Diffs: ds}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, srv, "SELECT count(*) FROM rate_limit_counters"); n != 20000 {
		t.Fatalf("%d counters, want 20,000", n)
	}
	conn := srv.Conn(t, testDB)
	ctx := ctxT(t)
	exec := func(query string) {
		t.Helper()
		if _, err := conn.Exec(ctx, query); err != nil {
			t.Fatal(err)
		}
	}
	exec("SET jit = off")
	plan := func(query string, args ...any) string {
		t.Helper()
		rows, err := conn.Query(ctx, query, args...)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(lines, "\n")
	}
	lookup := regexp.MustCompile(`Index Scan using rate_limit_counters_pkey on rate_limit_counters t .*\n\s*Index Cond: \(\(namespace = [^)]*\) AND \(key = k\.key\)`)
	buffers := regexp.MustCompile(`Buffers: shared hit=(\d+)`)
	check := func(what string, keys int, plan string) {
		t.Helper()
		if !lookup.MatchString(plan) || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s, %d keys: the fetch does not look keys up by primary key:\n%s", what, keys, plan)
		}
		// Measured: the pages read grow with the keys asked (about 3 a key:
		// the index's levels and the heap), not with the table's 20,000 rows.
		if m := buffers.FindStringSubmatch(plan); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > 4*keys+20 {
				t.Errorf("%s, %d keys: the fetch read %d pages:\n%s", what, keys, n, plan)
			}
		}
	}
	args := func(n int) []any {
		keys := make([][]byte, n)
		for i := range keys {
			keys[i] = []byte(fmt.Sprint("key-", i*(10000/n)))
		}
		return []any{[]byte("ns"), keys, []int64{size.Milliseconds(), size.Milliseconds()},
			[]int64{cur / 1e6, (cur - int64(size)) / 1e6}}
	}
	for _, stats := range []string{"fresh statistics", "after ANALYZE"} {
		if stats == "after ANALYZE" {
			exec("ANALYZE rate_limit_counters")
		}
		for _, n := range []int{10, 5000} {
			check("custom plan, "+stats, n, plan("EXPLAIN (ANALYZE, BUFFERS) "+s.sql.fetch, args(n)...))
		}
	}

	exec("PREPARE fetch_counters(bytea, bytea[], bigint[], bigint[]) AS " + s.sql.fetch)
	exec("SET plan_cache_mode = force_generic_plan")
	// EXECUTE takes no parameters: the test's own values as literals.
	var lits []string
	for _, k := range args(10)[1].([][]byte) {
		lits = append(lits, "'"+string(k)+"'::bytea")
	}
	check("generic plan", 10, plan(fmt.Sprintf("EXPLAIN (ANALYZE, BUFFERS) EXECUTE fetch_counters('ns', ARRAY[%s], ARRAY[%d, %d], ARRAY[%d, %d])",
		strings.Join(lits, ", "), size.Milliseconds(), size.Milliseconds(), cur/1e6, (cur-int64(size))/1e6)))

	// And the answer is right.
	counts, err := s.GetCounters(ctx, "ns", []string{"key-0", "key-9999", "absent"}, []time.Duration{size}, now)
	if err != nil || len(counts) != 4 {
		t.Fatalf("fetched %v, %v: want 4 counters", counts, err)
	}
}

// countingTracer counts the queries that a pool's connections send, and
// the batches (pipelines of queries, one round trip each).
type countingTracer struct{ queries, batches atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.batches.Add(1)
	return ctx
}

func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// roundTrips returns how many queries and batches the pool sent.
func (c *countingTracer) roundTrips() int64 { return c.queries.Load() + c.batches.Load() }

// TestOneStatementPerCall checks that every call of a store is one query:
// one round trip, once the statement is prepared on the connection.
func TestOneStatementPerCall(t *testing.T) {
	_, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn, MaxConns: 1})
	tr := new(countingTracer)
	s.config.ConnConfig.Tracer = tr // before the first use makes the pool
	now := time.Now()
	start := window.Start(now.UnixNano(), time.Minute)
	ctx := ctxT(t)
	hit := []strategy.WindowHit{{Size: time.Minute, Start: start, Value: 1, Max: 1e9}, {Size: time.Hour, Start: window.Start(now.UnixNano(), time.Hour), Value: 1, Max: 1e9}}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"push of 5,000 diffs", func() error {
			return s.PushDiffs(ctx, strategy.Batch{ID: fmt.Sprint(time.Now().UnixNano()), Namespace: "ns", Diffs: diffs(5000, "k", time.Minute, start, 1)})
		}},
		{"fetch of 5,000 keys", func() error {
			_, err := s.GetCounters(ctx, "ns", []string{"k1", "k2"}, []time.Duration{time.Minute, time.Hour}, now)
			return err
		}},
		{"reset", func() error { return s.Reset(ctx, "ns", "k1", []time.Duration{time.Minute, time.Hour}, now) }},
		{"hit of two windows", func() error {
			_, _, err := s.Hit(ctx, "ns", "k1", fmt.Sprint(time.Now().UnixNano()), hit, true)
			return err
		}},
		{"batch of 100 hits of 10 keys", func() error {
			hits := make([]strategy.HitRequest, 100)
			for i := range hits {
				hits[i] = strategy.HitRequest{Key: fmt.Sprint("k", i%10), Windows: hit}
			}
			results := make([]strategy.HitResult, len(hits))
			s.HitBatch(ctx, "ns", fmt.Sprint(time.Now().UnixNano()), hits, results)
			return results[0].Err
		}},
		{"batch of 10 hits and 10 slots", func() error {
			var hits []strategy.HitRequest
			for i := range 10 {
				hits = append(hits, strategy.HitRequest{Key: fmt.Sprint("k", i), Windows: hit},
					strategy.HitRequest{Key: fmt.Sprint("k", i), Slot: &strategy.SlotRequest{ID: fmt.Sprint("s", i), Max: 5, Lease: time.Minute}})
			}
			results := make([]strategy.HitResult, len(hits))
			s.HitBatch(ctx, "ns", fmt.Sprint(time.Now().UnixNano()), hits, results)
			return errors.Join(results[0].Err, results[1].Err)
		}},
	} {
		if err := tc.call(); err != nil { // creates the schema, prepares
			t.Fatal(err)
		}
		before := tr.roundTrips()
		if err := tc.call(); err != nil {
			t.Fatal(err)
		}
		if n := tr.roundTrips() - before; n != 1 {
			t.Errorf("%s: %d round trips (queries and pipelines), want 1", tc.name, n)
		}
	}
}

// TestPurge checks that Purge deletes the expired counters and ID records,
// in chunks, and nothing else.
func TestPurge(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	// The clock moves 10 s: the hour-long window must not end meanwhile.
	clock := fakeclock.New(strategytest.SteadyNow(time.Minute))
	s.now = clock.Now
	at := clock.Now().UnixNano()
	short, long := time.Second, time.Hour
	ctx := ctxT(t)
	old := diffs(25000, "old-", short, window.Start(at, short), 1)
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "old", Namespace: "ns", Diffs: old}); err != nil {
		t.Fatal(err)
	}
	live := []window.Diff{{Key: "live", Size: long, Start: window.Start(at, long), Value: 1}}
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "live", Namespace: "ns", Diffs: live}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("purging before anything expired: %d rows, %v", n, err)
	}
	clock.Advance(10 * time.Second) // the short windows and the "old" ID expired
	n, err := s.Purge(ctx)
	if err != nil || n != 25001 {
		t.Fatalf("purging: %d rows, %v; want the 25,000 old counters and the old batch's ID", n, err)
	}
	if n := count(t, srv, "SELECT count(*) FROM rate_limit_counters"); n != 1 {
		t.Errorf("%d counters left, want 1", n)
	}
	if n := count(t, srv, "SELECT count(*) FROM rate_limit_counters_ids"); n != 1 {
		t.Errorf("%d IDs left, want 1", n)
	}
	// The live batch's ID outlives its counters' use: a retry of it still
	// applies nothing.
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "live", Namespace: "ns", Diffs: live}); err != nil {
		t.Fatal(err)
	}
	if v, _ := fetchOne(t, s, "ns", "live", long, clock.Now()); v != 1 {
		t.Errorf("live count %v, want 1", v)
	}
}

// pushSecond pushes batch id: a hit of each of 100 keys in the 1 s window
// of clock's now, which expires 3 s after that window starts.
func pushSecond(t *testing.T, s *Store, clock *fakeclock.Clock, id string) {
	t.Helper()
	ds := diffs(100, id, time.Second, window.Start(clock.Now().UnixNano(), time.Second), 1)
	if err := s.PushDiffs(ctxT(t), strategy.Batch{ID: id, Namespace: "ns", Diffs: ds}); err != nil {
		t.Fatal(err)
	}
}

// TestPurgeLoop checks that a store in use purges on its own, and that it
// skips its turn while another node purges.
func TestPurgeLoop(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	clock := fakeclock.New(time.Now())
	// Each turn of the purge loop reads the clock once before it tries the
	// purge lock, so reads count the turns while the test itself is idle.
	var reads atomic.Int64
	now := func() time.Time {
		reads.Add(1)
		return clock.Now()
	}
	s.now, s.purgeEvery = now, 20*time.Millisecond
	push := func(id string) { pushSecond(t, s, clock, id) }
	rows := func() int { return count(t, srv, "SELECT count(*) FROM rate_limit_counters") }

	push("first")
	clock.Advance(10 * time.Second)
	poll.Until(t, 10*time.Second, "the expired counters to be purged", func() bool { return rows() == 0 })

	// Another node is purging: this one skips its turns.
	other := srv.Conn(t, testDB)
	if _, err := other.Exec(ctxT(t), "SELECT pg_advisory_lock($1)", s.names.purgeLock); err != nil {
		t.Fatal(err)
	}
	push("second")
	clock.Advance(10 * time.Second)
	turns := reads.Load()
	poll.Until(t, 30*time.Second, "ten turns of the purge loop", func() bool { return reads.Load() > turns+10 })
	if n := rows(); n != 100 {
		t.Errorf("%d counters while another node holds the purge lock, want 100", n)
	}
	if _, err := other.Exec(ctxT(t), "SELECT pg_advisory_unlock($1)", s.names.purgeLock); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the expired counters to be purged", func() bool { return rows() == 0 })
}

// TestMaintainPurgesWhenDue checks that a run's Maintain purges when a
// purge is due, and not again before the next is.
func TestMaintainPurgesWhenDue(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	clock := fakeclock.New(time.Now())
	s.now, s.purgeEvery = clock.Now, time.Hour // the purge loop waits it out
	push := func(id string) { pushSecond(t, s, clock, id) }
	rows := func() int { return count(t, srv, "SELECT count(*) FROM rate_limit_counters") }

	push("first")
	clock.Advance(10 * time.Second)
	s.nextPurge.Store(time.Now().Add(time.Hour).UnixNano())
	s.Maintain(ctxT(t))
	if n := rows(); n != 100 {
		t.Fatalf("%d counters after Maintain before a purge was due, want 100", n)
	}
	s.nextPurge.Store(time.Now().Add(-time.Millisecond).UnixNano())
	s.Maintain(ctxT(t))
	if n := rows(); n != 0 {
		t.Fatalf("%d expired counters after Maintain with a purge due, want 0", n)
	}
	push("second")
	clock.Advance(10 * time.Second)
	s.Maintain(ctxT(t)) // the next purge is an hour away
	if n := rows(); n != 100 {
		t.Errorf("%d counters after Maintain right after a purge, want 100", n)
	}
}

// TestLongValues checks that namespaces, keys and IDs longer than a B-tree
// entry may be are stored, stay distinct and dedupe as short ones do.
func TestLongValues(t *testing.T) {
	_, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	ctx := ctxT(t)
	now := time.Now()
	start := window.Start(now.UnixNano(), time.Hour)
	long := strings.Repeat("n", 5000)
	id := strings.Repeat("i", 5000)
	for i, ns := range []string{long + "a", long + "b"} {
		for range 2 { // the same ID twice: applied once
			b := strategy.Batch{ID: id, Namespace: ns, Diffs: []window.Diff{{Key: long + "k", Size: time.Hour, Start: start, Value: float64(i + 1)}}}
			if err := s.PushDiffs(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		// Another long ID, with the same first bytes, applies.
		b := strategy.Batch{ID: id + "x", Namespace: ns, Diffs: []window.Diff{{Key: long + "k", Size: time.Hour, Start: start, Value: 10}}}
		if err := s.PushDiffs(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	for i, ns := range []string{long + "a", long + "b"} {
		if v, _ := fetchOne(t, s, ns, long+"k", time.Hour, now); v != float64(i+11) {
			t.Errorf("namespace %d: count %v, want %v", i, v, i+11)
		}
	}
	// A hit's ID is bounded as in the other stores.
	_, _, err := s.Hit(ctx, "ns", "k", strings.Repeat("i", 257), []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 10}}, false)
	if !errors.Is(err, strategy.ErrRejected) {
		t.Errorf("a hit with an ID of 257 bytes: %v, want an error that wraps ErrRejected", err)
	}
	if s := asHitter(s); s == nil {
		t.Fatal("not a Hitter")
	}
}

func TestStored(t *testing.T) {
	if got := stored("", 4); got == nil || len(got) != 0 {
		t.Errorf("stored(\"\") = %#v, want an empty, non-nil slice", got)
	}
	if got := string(stored("abcd", 4)); got != "abcd" {
		t.Errorf("stored(abcd, 4) = %q", got)
	}
	a, b := stored(strings.Repeat("a", 100)+"1", 40), stored(strings.Repeat("a", 100)+"2", 40)
	if len(a) != 41 || len(b) != 41 || string(a) == string(b) {
		t.Errorf("long values: %q, %q: want 41 bytes each, distinct", a, b)
	}
}

// TestSchemaRecreated drops the tables and the function under a store in
// use: the next call fails, and the one after it creates them again.
func TestSchemaRecreated(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	now := time.Now()
	start := window.Start(now.UnixNano(), time.Hour)
	hit := func() error {
		_, _, err := s.Hit(ctxT(t), "ns", "k", "", []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 10}}, false)
		return err
	}
	if err := hit(); err != nil {
		t.Fatal(err)
	}
	conn := srv.Conn(t, testDB)
	if _, err := conn.Exec(ctxT(t), `DROP TABLE rate_limit_counters, rate_limit_counters_ids;
		DROP FUNCTION rate_limit_counters_hits`); err != nil {
		t.Fatal(err)
	}
	if err := hit(); err == nil {
		t.Fatal("a hit succeeded with the function dropped")
	}
	if err := hit(); err != nil {
		t.Fatalf("the hit after: %v", err)
	}
	if v, _ := fetchOne(t, s, "ns", "k", time.Hour, now); v != 1 {
		t.Errorf("count %v, want 1", v)
	}
}

// TestRoleWithoutCreateRights uses tables and a function that another
// role made (a DBA, say), as a role that may only read and write them:
// the schema check finds them and creates nothing.
func TestRoleWithoutCreateRights(t *testing.T) {
	srv, dsn := startServer(t)
	owner := open(t, &Postgres{DSN: dsn})
	if _, _, err := owner.Hit(ctxT(t), "ns", "made-by-the-dba", "", []strategy.WindowHit{
		{Size: time.Hour, Start: window.Start(time.Now().UnixNano(), time.Hour), Value: 1, Max: 10}}, false); err != nil {
		t.Fatal(err)
	}
	appDSN := appRole(t, srv, dsn)
	s := open(t, &Postgres{DSN: appDSN})
	now := time.Now()
	start := window.Start(now.UnixNano(), time.Hour)
	if err := s.PushDiffs(ctxT(t), strategy.Batch{ID: "b", Namespace: "ns", Diffs: []window.Diff{{Key: "k", Size: time.Hour, Start: start, Value: 1}}}); err != nil {
		t.Fatalf("pushing as a role that may not create: %v", err)
	}
	if _, _, err := s.Hit(ctxT(t), "ns", "k", "h", []strategy.WindowHit{{Size: time.Hour, Start: start, Value: 1, Max: 10}}, false); err != nil {
		t.Fatalf("hitting as a role that may not create: %v", err)
	}
	if _, err := s.Purge(ctxT(t)); err != nil {
		t.Fatalf("purging as a role that may not create: %v", err)
	}
	if v, _ := fetchOne(t, s, "ns", "k", time.Hour, now); v != 2 {
		t.Errorf("count %v, want 2", v)
	}
	// The same role cannot create them where they are missing, and says so.
	other := open(t, &Postgres{DSN: appDSN, Table: "elsewhere"})
	err := other.PushDiffs(ctxT(t), strategy.Batch{ID: "b", Namespace: "ns", Diffs: []window.Diff{{Key: "k", Size: time.Hour, Start: start, Value: 1}}})
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("pushing to a table the role may not create: %v, want a permission error", err)
	}
}

// TestBanVersionsOfAnOlderVersion: a store made by a version whose
// ban_versions table had no lifted_until_ms gains the column with its
// first ban call, and a lift then keeps a version as on a new store.
func TestBanVersionsOfAnOlderVersion(t *testing.T) {
	srv, dsn := startServer(t)
	conn := srv.Conn(t, testDB)
	if _, err := conn.Exec(ctxT(t), `CREATE TABLE rate_limit_counters_banver (namespace bytea PRIMARY KEY, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	s := open(t, &Postgres{DSN: dsn})
	until := time.Now().Add(time.Hour)
	if err := s.SetBans(ctxT(t), "ns", []strategy.Ban{{Key: "k", Until: until}}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetBans(ctxT(t), "ns", []strategy.Ban{{Key: "k"}}); err != nil {
		t.Fatal(err)
	}
	if bans, v, err := s.GetBans(ctxT(t), "ns", -1, time.Now()); err != nil || len(bans) != 0 || v == 0 {
		t.Fatalf("after the lift: %v, version %d, %v; want no ban and a version other than 0", bans, v, err)
	}
	if n := count(t, srv, `SELECT count(*) FROM pg_attribute WHERE attrelid = 'rate_limit_counters_banver'::regclass AND attname = 'lifted_until_ms'`); n != 1 {
		t.Fatalf("the older table has %d lifted_until_ms columns, want 1", n)
	}
}
