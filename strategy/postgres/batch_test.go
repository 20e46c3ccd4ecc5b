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

// The batch hit function is created by the first batch of several hits,
// apart from the counters' schema (as the slots' objects are): a role that
// may not create objects keeps its counters and single hits when it
// upgrades, and its batches work once a DBA has made the function (by
// sending a batch once, say).
func TestBatchSchemaApart(t *testing.T) {
	srv, dsn := startServer(t)
	owner := open(t, &Postgres{DSN: dsn})
	if err := hitBatch(t, owner, "k", 1); err != nil { // a batch of one is a Hit
		t.Fatal(err)
	}
	if n := count(t, srv, "SELECT count(*) FROM pg_proc WHERE proname = 'rate_limit_counters_hits'"); n != 0 {
		t.Fatalf("a batch of one hit created the batch hit function")
	}
	app := open(t, &Postgres{DSN: appRole(t, srv, dsn)})
	if err := hitBatch(t, app, "k", 2); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("a batch as a role that may not create the function: %v, want a permission error", err)
	}
	if err := hitBatch(t, app, "k", 1); err != nil {
		t.Fatalf("a single hit as that role: %v", err)
	}
	if err := hitBatch(t, owner, "k", 2); err != nil { // creates the function
		t.Fatal(err)
	}
	if err := hitBatch(t, app, "k", 3); err != nil {
		t.Fatalf("a batch as that role, once the function exists: %v", err)
	}
	if v, _ := fetchOne(t, owner, "ns", "k", time.Hour, time.Now()); v != 7 {
		t.Errorf("count %v, want 7", v)
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
