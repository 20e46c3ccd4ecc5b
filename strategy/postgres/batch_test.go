package postgres

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// hitBatch applies n hits of key, each of one hour window with no limit,
// in one HitBatch, and returns the first hit's error.
func hitBatch(t *testing.T, s *Store, key string, n int) error {
	t.Helper()
	ws := []strategy.WindowHit{{Size: time.Hour, Start: window.Start(time.Now().UnixNano(), time.Hour), Value: 1, Max: math.Inf(1)}}
	hits := make([]strategy.HitRequest, n)
	for i := range hits {
		hits[i] = strategy.HitRequest{Key: key, Windows: ws}
	}
	results := make([]strategy.HitResult, n)
	s.HitBatch(ctxT(t), "ns", fmt.Sprint("batch-", time.Now().UnixNano()), hits, results)
	return results[0].Err
}

// The batch hit function is created by the first synchronous hit, apart
// from the counters' schema (as the slots' objects are): a role that may
// not create objects keeps its counters when it upgrades, and its
// synchronous hits work once a DBA has made the function (by sending a
// hit once, say).
func TestBatchSchemaApart(t *testing.T) {
	srv, dsn := startServer(t)
	owner := open(t, &Postgres{DSN: dsn})
	push := func(s *Store, id string) error {
		return s.PushDiffs(ctxT(t), strategy.Batch{ID: id, Namespace: "ns", Diffs: []window.Diff{
			{Key: "k", Size: time.Hour, Start: window.Start(time.Now().UnixNano(), time.Hour), Value: 1}}})
	}
	if err := push(owner, "p1"); err != nil {
		t.Fatal(err)
	}
	if n := count(t, srv, "SELECT count(*) FROM pg_proc WHERE proname = 'rate_limit_counters_hits'"); n != 0 {
		t.Fatalf("a push created the batch hit function")
	}
	app := open(t, &Postgres{DSN: appRole(t, srv, dsn)})
	if err := push(app, "p2"); err != nil {
		t.Fatalf("a push as a role that may not create objects: %v", err)
	}
	if err := hitBatch(t, app, "k", 1); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("a hit as a role that may not create the function: %v, want a permission error", err)
	}
	if err := hitBatch(t, owner, "k", 1); err != nil { // creates the function
		t.Fatal(err)
	}
	if err := hitBatch(t, app, "k", 3); err != nil {
		t.Fatalf("a batch as that role, once the function exists: %v", err)
	}
	if v, _ := fetchOne(t, owner, "ns", "k", time.Hour, time.Now()); v != 6 {
		t.Errorf("count %v, want 6", v)
	}
}

// Dropping the batch hit function under a store in use fails the next
// batch, and the one after it creates it again; with the longest table
// name, the function's name fits.
func TestBatchSchemaRecreated(t *testing.T) {
	srv, dsn := startServer(t)
	table := strings.Repeat("t", 55)
	s := open(t, &Postgres{DSN: dsn, Table: table})
	if err := hitBatch(t, s, "k", 2); err != nil {
		t.Fatal(err)
	}
	if n := count(t, srv, "SELECT count(*) FROM pg_proc WHERE proname = $1", table+"_hits"); n != 1 {
		t.Fatalf("%d functions %s_hits, want 1", n, table)
	}
	conn := srv.Conn(t, testDB)
	if _, err := conn.Exec(ctxT(t), "DROP FUNCTION "+table+"_hits"); err != nil {
		t.Fatal(err)
	}
	if err := hitBatch(t, s, "k", 2); err == nil {
		t.Fatal("a batch succeeded with the function dropped")
	}
	if err := hitBatch(t, s, "k", 2); err != nil {
		t.Fatalf("the batch after: %v", err)
	}
	if v, _ := fetchOne(t, s, "ns", "k", time.Hour, time.Now()); v != 4 {
		t.Errorf("count %v, want 4", v)
	}
}
