package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// sqlTracer records the SQL of the queries that a pool's connections
// send, and counts the batches (pipelines, one round trip each).
type sqlTracer struct {
	mu      sync.Mutex
	queries []string
	batches int
}

func (c *sqlTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queries = append(c.queries, d.SQL)
	return ctx
}

func (c *sqlTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *sqlTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	return ctx
}

func (c *sqlTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *sqlTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// since returns the queries sent and the batches started since a call
// that returned n and b, and the new n and b.
func (c *sqlTracer) since(n, b int) (queries []string, batches, n2, b2 int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.queries[n:]...), c.batches - b, len(c.queries), c.batches
}

// nearHour is a diff of the hour-long window of key that holds at, with
// a limit.
func nearHour(at time.Time, key string, value, limit float64) window.Diff {
	return window.Diff{Key: key, Size: time.Hour, Start: window.Start(at.UnixNano(), time.Hour), Value: value, Limit: limit}
}

// A push whose batch cannot mark (Near 0, or no diff with a Limit) is the
// statement a push was before the feed, one round trip, and creates none
// of the feed's tables; a push that may mark is one statement too, and so
// is a fetch with the marks, keys or none.
func TestNearPushStatements(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn, MaxConns: 1})
	tr := new(sqlTracer)
	s.config.ConnConfig.Tracer = tr // before the first use makes the pool
	ctx := ctxT(t)
	at := strategytest.SteadyNow(time.Minute)
	var id int
	push := func(near float64, rates []strategy.RateDiff, diffs ...window.Diff) error {
		id++
		return s.PushDiffs(ctx, strategy.Batch{ID: fmt.Sprint("b", id), Namespace: "ns", Diffs: diffs, Rates: rates, Near: near})
	}
	rate := []strategy.RateDiff{{Key: "r", Window: time.Minute, Increment: time.Second}}
	fetch := func(keys []string) error {
		_, _, _, err := s.GetCountersNear(ctx, "ns", keys, []time.Duration{time.Hour}, at, 0, nil)
		return err
	}
	n, b := 0, 0
	for _, tc := range []struct {
		name string
		call func(i int) error
		want string // the one statement sent, when not empty
	}{
		{"Near 0", func(i int) error { return push(0, nil, nearHour(at, fmt.Sprint("a", i), 100, 1)) }, s.sql.push},
		{"Near 0.5, no Limit", func(i int) error { return push(0.5, nil, nearHour(at, fmt.Sprint("z", i), 100, 0)) }, s.sql.push},
		{"Near 0.5, a negative diff", func(i int) error { return push(0.5, nil, nearHour(at, "n", -1, 1)) }, s.sql.push},
		{"Near 0 with rates", func(i int) error { return push(0, rate, nearHour(at, fmt.Sprint("a", i), 1, 1)) }, s.sql.pushRates},
		{"Near 0.5", func(i int) error { return push(0.5, nil, nearHour(at, fmt.Sprint("m", i), 1, 1)) }, s.sql.nearPush},
		{"Near 0.5 with rates", func(i int) error { return push(0.5, rate, nearHour(at, fmt.Sprint("q", i), 1, 1)) }, s.sql.nearPushRates},
		{"fetch of keys with the marks", func(int) error { return fetch([]string{"m0", "m1"}) }, ""},
		{"fetch of the marks alone", func(int) error { return fetch(nil) }, ""},
	} {
		if tc.want == s.sql.push || tc.want == s.sql.pushRates {
			if err := tc.call(0); err != nil { // creates the counters' schema and prepares
				t.Fatal(err)
			}
			if got := count(t, srv, "SELECT count(*) FROM pg_class WHERE relname LIKE 'rate_limit_counters_near%'"); got != 0 {
				t.Fatalf("%s: a push that cannot mark created %d of the feed's objects", tc.name, got)
			}
		} else if err := tc.call(0); err != nil {
			t.Fatal(err)
		}
		_, _, n, b = tr.since(n, b)
		if err := tc.call(1); err != nil {
			t.Fatal(err)
		}
		var queries []string
		var batches int
		queries, batches, n, b = tr.since(n, b)
		if len(queries)+batches != 1 {
			t.Errorf("%s: %d queries and %d pipelines, want one round trip", tc.name, len(queries), batches)
			continue
		}
		if tc.want != "" && queries[0] != tc.want {
			t.Errorf("%s: sent\n%s\nwant\n%s", tc.name, queries[0], tc.want)
		}
	}
	_, marks, v, err := s.GetCountersNear(ctx, "ns", nil, nil, at, 0, nil)
	if err != nil || len(marks) != 4 || v == 0 {
		t.Errorf("marks %v at version %d (%v), want those of m0, m1, q0 and q1", marks, v, err)
	}
}

// A node's first fetch makes the counters' part of the schema and the
// feed's in one statement, one transaction: the feed adds no round trip
// to a node's start.
func TestNearSchemaWithTheCounters(t *testing.T) {
	_, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn, MaxConns: 1})
	tr := new(sqlTracer)
	s.config.ConnConfig.Tracer = tr // before the first use makes the pool
	at := strategytest.SteadyNow(time.Minute)
	if _, _, _, err := s.GetCountersNear(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, at, 0, nil); err != nil {
		t.Fatal(err)
	}
	queries, batches, _, _ := tr.since(0, 0)
	if len(queries) != 1 || queries[0] != s.core.sql+s.nearPart.sql || batches != 1 {
		t.Errorf("a first fetch sent %d queries and %d pipelines, want the two parts of the schema in one and the fetch", len(queries), batches)
	}
	if !s.core.ready.Load() || !s.nearPart.ready.Load() {
		t.Errorf("after a first fetch: counters' part made %v, feed's %v", s.core.ready.Load(), s.nearPart.ready.Load())
	}
}

// The feed's tables are made apart from the counters': a database whose
// counters an older store made gets them from the first push that may
// mark or the first read of the marks, and a role that may not create
// them keeps working without a feed (its pushes mark nothing, its reads
// return the counts and no marks) until a DBA makes them, after which it
// takes them up within nearRetry.
func TestNearSchemaApart(t *testing.T) {
	srv, dsn := startServer(t)
	at := strategytest.SteadyNow(time.Minute)
	old := open(t, &Postgres{DSN: dsn})
	if err := old.PushDiffs(ctxT(t), strategy.Batch{ID: "old", Namespace: "ns", Diffs: []window.Diff{nearHour(at, "k", 1, 2)}}); err != nil {
		t.Fatal(err)
	}
	app := open(t, &Postgres{DSN: appRole(t, srv, dsn)})
	if err := app.PushDiffs(ctxT(t), strategy.Batch{ID: "app", Namespace: "ns", Diffs: []window.Diff{nearHour(at, "k", 1, 2)}, Near: 1}); err != nil {
		t.Fatalf("a push that may mark, as a role that may not create the feed's tables: %v, want it pushed without marks", err)
	}
	if !app.nearPart.ready.Load() && app.nearOffUntil.Load() == 0 {
		t.Fatal("the refused feed is neither made nor off")
	}
	counts, marks, v, err := app.GetCountersNear(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, at, 0, nil)
	if err != nil || len(counts) != 1 || counts[0].Value != 2 || len(marks) != 0 || v != 0 {
		t.Fatalf("as that role: counts %v, marks %v at version %d (%v); want 2 and no marks", counts, marks, v, err)
	}
	if _, err := app.Purge(ctxT(t)); err != nil {
		t.Fatalf("purging as that role: %v", err)
	}

	upgraded := open(t, &Postgres{DSN: dsn}) // a node of the new version
	if err := upgraded.PushDiffs(ctxT(t), strategy.Batch{ID: "new", Namespace: "ns", Diffs: []window.Diff{nearHour(at, "k", 1, 4)}, Near: 0.75}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Conn(t, testDB).Exec(ctxT(t), `GRANT SELECT, INSERT, UPDATE, DELETE
		ON rate_limit_counters_near, rate_limit_counters_nearver TO app`); err != nil {
		t.Fatal(err)
	}
	app.nearOffUntil.Store(0) // as nearRetry later
	counts, marks, v, err = app.GetCountersNear(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, at, 0, nil)
	if err != nil || len(counts) != 1 || counts[0].Value != 3 || len(marks) != 1 || marks[0].Key != "k" || v == 0 {
		t.Fatalf("as that role, once granted: counts %v, marks %v at version %d (%v); want 3 and k's mark", counts, marks, v, err)
	}
	if _, err := app.Purge(ctxT(t)); err != nil {
		t.Fatalf("purging as that role: %v", err)
	}
}

// Pushes that mark, from many connections at once, never let a reader
// that follows the version miss a mark or read one twice: each push
// numbers its marks after those of every push that committed before it.
// They share counters, and a purge runs among them: nothing deadlocks.
func TestNearConcurrentMarks(t *testing.T) {
	_, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn, MaxConns: 12})
	ctx := ctxT(t)
	at := strategytest.SteadyNow(time.Minute)
	const writers, pushes, perPush = 8, 40, 3
	var wg sync.WaitGroup
	errc := make(chan error, writers+1)
	stop := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			for p := range pushes {
				diffs := []window.Diff{
					// Counters every writer adds to, which never mark.
					nearHour(at, "shared-a", 1, 1e9), nearHour(at, "shared-b", 1, 1e9),
				}
				for k := range perPush {
					diffs = append(diffs, nearHour(at, fmt.Sprintf("w%d-p%d-k%d", w, p, k), 1, 1))
				}
				err := s.PushDiffs(ctx, strategy.Batch{ID: fmt.Sprintf("w%d-p%d", w, p), Namespace: "ns", Diffs: diffs, Near: 1})
				if err != nil {
					errc <- err
					return
				}
			}
		})
	}
	purged := make(chan struct{})
	go func() {
		defer close(purged)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Purge(ctx); err != nil {
				errc <- err
				return
			}
			time.Sleep(5 * time.Millisecond) // not a wait: the pace of the purges that race the pushes
		}
	}()
	seen := make(map[string]int)
	var known int64
	read := func() {
		_, marks, v, err := s.GetCountersNear(ctx, "ns", []string{"shared-a"}, []time.Duration{time.Hour}, at, known, nil)
		if err != nil {
			t.Fatal(err)
		}
		if v < known {
			t.Fatalf("the version went from %d back to %d", known, v)
		}
		known = v
		for _, m := range marks {
			seen[m.Key]++
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for reading := true; reading; {
		select {
		case <-done:
			reading = false
		default:
		}
		read()
	}
	read() // after the last push
	close(stop)
	<-purged
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for w := range writers {
		for p := range pushes {
			for k := range perPush {
				key := fmt.Sprintf("w%d-p%d-k%d", w, p, k)
				if seen[key] != 1 {
					t.Errorf("the reader read %s's mark %d times, want once", key, seen[key])
				}
			}
		}
	}
	if len(seen) != writers*pushes*perPush {
		t.Errorf("the reader read %d keys' marks, want %d", len(seen), writers*pushes*perPush)
	}
	if v, _ := fetchOne(t, s, "ns", "shared-a", time.Hour, at); v != writers*pushes {
		t.Errorf("shared count %v, want %d", v, writers*pushes)
	}
}

// Purge deletes the marks that ended and the version rows of namespaces
// whose marks all did, and nothing else.
func TestNearPurge(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	clock := fakeclock.New(strategytest.SteadyNow(time.Minute))
	s.now = clock.Now
	ctx := ctxT(t)
	short := window.Diff{Key: "short", Size: time.Second, Start: window.Start(clock.UnixNano(), time.Second), Value: 1, Limit: 1}
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "short", Namespace: "gone", Diffs: []window.Diff{short}, Near: 1}); err != nil {
		t.Fatal(err)
	}
	long := nearHour(clock.Now(), "long", 1, 1)
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "long", Namespace: "kept", Diffs: []window.Diff{long, short}, Near: 1}); err != nil {
		t.Fatal(err)
	}
	marks := func() int { return count(t, srv, "SELECT count(*) FROM rate_limit_counters_near") }
	versions := func() int { return count(t, srv, "SELECT count(*) FROM rate_limit_counters_nearver") }
	if _, err := s.Purge(ctx); err != nil || marks() != 3 || versions() != 2 {
		t.Fatalf("purging before any mark ended: %d marks and %d versions left (%v), want 3 and 2", marks(), versions(), err)
	}
	clock.Advance(10 * time.Second) // the short marks ended, past the margin
	if _, err := s.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if marks() != 1 || versions() != 1 {
		t.Errorf("%d marks and %d versions left, want kept's long mark and version", marks(), versions())
	}
	if _, got, v, err := s.GetCountersNear(ctx, "kept", nil, nil, clock.Now(), 0, nil); err != nil || len(got) != 1 || got[0].Key != "long" || v == 0 {
		t.Errorf("kept's marks %v at version %d (%v), want long's", got, v, err)
	}
}
