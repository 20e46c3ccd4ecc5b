package postgres

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

// A slot expires by the server's clock: the node's clock (s.now, which
// dates counters and ID records) plays no part.
func TestSlotsIgnoreTheNodeClock(t *testing.T) {
	_, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	strategytest.SlotsIgnoreTheNodeClock(t, s, func(now func() time.Time) { s.now = now })
}

// Each slot call is one query: one round trip, once the statement is
// prepared on the connection.
func TestSlotCallsAreOneStatement(t *testing.T) {
	_, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn, MaxConns: 1})
	tr := new(countingTracer)
	s.config.ConnConfig.Tracer = tr // before the first use makes the pool
	ctx := ctxT(t)
	var seq int
	slots := func() []strategy.Slot {
		return []strategy.Slot{{Key: "k1", ID: fmt.Sprint("a", seq)}, {Key: "k2", ID: "b"}, {Key: "k1", ID: "c"}}
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"acquisition", func() error {
			seq++
			_, _, err := s.AcquireSlot(ctx, "ns", "k1", fmt.Sprint("a", seq), 10, time.Minute)
			return err
		}},
		{"refused acquisition", func() error {
			_, ok, err := s.AcquireSlot(ctx, "ns", "k1", "late", 1, time.Minute)
			if ok {
				return errors.New("a slot of a full key was taken")
			}
			return err
		}},
		{"renewal of slots of two keys", func() error { return s.RenewSlots(ctx, "ns", slots(), time.Minute) }},
		{"release of slots of two keys", func() error { return s.ReleaseSlots(ctx, "ns", slots()) }},
	} {
		if err := tc.call(); err != nil { // creates the schema, prepares
			t.Fatal(err)
		}
		before := tr.queries.Load()
		if err := tc.call(); err != nil {
			t.Fatal(err)
		}
		if n := tr.queries.Load() - before; n != 1 {
			t.Errorf("%s: %d queries, want 1", tc.name, n)
		}
	}
}

// The slots' functions refuse to count under repeatable read or
// serializable, whose snapshot would miss the slots taken while they
// waited for the key's lock; the store's connections ask for read
// committed, whatever the server's, the database's or the role's default.
func TestSlotsNeedReadCommitted(t *testing.T) {
	srv, dsn := startServer(t)
	conn := srv.Conn(t, testDB)
	if _, err := conn.Exec(ctxT(t), "ALTER DATABASE "+testDB+" SET default_transaction_isolation = 'serializable'"); err != nil {
		t.Fatal(err)
	}
	s := open(t, &Postgres{DSN: dsn})
	strategytest.AcquireOK(t, s, "ns", "k", "a", 1, time.Minute, 1)

	// A DSN that asks for another level gets an error, never a slot
	// counted on a stale snapshot.
	rr := open(t, &Postgres{DSN: dsn + "&default_transaction_isolation=repeatable%20read"})
	_, ok, err := rr.AcquireSlot(ctxT(t), "ns", "k", "b", 1, time.Minute)
	if err == nil || ok || !strings.Contains(err.Error(), "read committed") {
		t.Errorf("acquiring under repeatable read: got ok %v and error %v, want an error that asks for read committed", ok, err)
	}
}

// Acquisitions, renewals and releases of the same slots, in every order,
// from many goroutines at once, never deadlock: every call locks the keys
// it touches, sorted, before any row.
func TestSlotWritersNeverDeadlock(t *testing.T) {
	_, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn, MaxConns: 8})
	const keys, rounds = 12, 30
	var all []strategy.Slot
	for i := range keys {
		key := fmt.Sprint("k", i)
		for _, id := range []string{"a", "b"} {
			strategytest.AcquireOK(t, s, "ns", key, id, 2, time.Minute, len(all)%2+1)
			all = append(all, strategy.Slot{Key: key, ID: id})
		}
	}
	ctx := ctxT(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range rounds {
				mine := append([]strategy.Slot(nil), all...)
				rng.Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
				mine = mine[:1+rng.IntN(len(mine))]
				var err error
				switch g % 3 {
				case 0:
					err = s.RenewSlots(ctx, "ns", mine, time.Minute)
				case 1:
					if err = s.ReleaseSlots(ctx, "ns", mine); err == nil {
						for _, sl := range mine {
							if _, _, err = s.AcquireSlot(ctx, "ns", sl.Key, sl.ID, 2, time.Minute); err != nil {
								break
							}
						}
					}
				case 2:
					_, err = s.Purge(ctx)
				}
				if err != nil {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// The slots' table and functions are created by the first slot call, apart
// from the counters' schema: a role that may not create objects keeps its
// counters when it upgrades, and its slot calls fail until a DBA creates
// the slots' objects (by using slots once, say) and grants it their table.
func TestSlotSchemaApart(t *testing.T) {
	srv, dsn := startServer(t)
	owner := open(t, &Postgres{DSN: dsn})
	if _, err := owner.GetCounters(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Hour}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := count(t, srv, "SELECT count(*) FROM pg_class WHERE relname = 'rate_limit_counters_slots'"); n != 0 {
		t.Fatalf("the counters' first use created the slots' table")
	}
	app := open(t, &Postgres{DSN: appRole(t, srv, dsn)})
	_, ok, err := app.AcquireSlot(ctxT(t), "ns", "k", "a", 1, time.Minute)
	if err == nil || ok || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("acquiring a slot as a role that may not create its table: ok %v, error %v, want a permission error", ok, err)
	}
	if _, err := app.Purge(ctxT(t)); err != nil {
		t.Fatalf("purging as that role: %v", err)
	}

	strategytest.AcquireOK(t, owner, "ns", "k", "a", 2, time.Minute, 1) // creates the slots' objects
	if _, err := srv.Conn(t, testDB).Exec(ctxT(t), `GRANT SELECT, INSERT, UPDATE, DELETE ON rate_limit_counters_slots TO app`); err != nil {
		t.Fatal(err)
	}
	strategytest.AcquireOK(t, app, "ns", "k", "b", 2, time.Minute, 2)
	if err := app.RenewSlots(ctxT(t), "ns", []strategy.Slot{{Key: "k", ID: "b"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := app.ReleaseSlots(ctxT(t), "ns", []strategy.Slot{{Key: "k", ID: "b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Purge(ctxT(t)); err != nil {
		t.Fatalf("purging as that role: %v", err)
	}
}

// Dropping the slots' table and functions under a store in use fails the
// next slot call, and the one after it creates them again.
func TestSlotSchemaRecreated(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	strategytest.AcquireOK(t, s, "ns", "k", "a", 1, time.Minute, 1)
	conn := srv.Conn(t, testDB)
	if _, err := conn.Exec(ctxT(t), `DROP TABLE rate_limit_counters_slots;
		DROP FUNCTION rate_limit_counters_acquire, rate_limit_counters_renew, rate_limit_counters_release`); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.AcquireSlot(ctxT(t), "ns", "k", "a", 1, time.Minute); err == nil {
		t.Fatal("an acquisition succeeded with the slots' objects dropped")
	}
	strategytest.AcquireOK(t, s, "ns", "k", "b", 1, time.Minute, 1)
}

// The longest table name leaves room for the slots' objects' names.
func TestSlotsOfTheLongestTable(t *testing.T) {
	srv, dsn := startServer(t)
	table := strings.Repeat("t", 55)
	s := open(t, &Postgres{DSN: dsn, Table: table})
	strategytest.AcquireOK(t, s, "ns", "k", "a", 1, time.Minute, 1)
	if err := s.RenewSlots(ctxT(t), "ns", []strategy.Slot{{Key: "k", ID: "a"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseSlots(ctxT(t), "ns", []strategy.Slot{{Key: "k", ID: "a"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{table + "_slots", table + "_slotexp", table + "_acquire", table + "_renew", table + "_release"} {
		if n := count(t, srv, "SELECT count(*) FROM pg_class WHERE relname = $1 UNION ALL SELECT count(*) FROM pg_proc WHERE proname = $1 ORDER BY 1 DESC LIMIT 1", name); n != 1 {
			t.Errorf("%s: %d objects, want 1", name, n)
		}
	}
}

// A slot call on a server that is down fails with an error that wraps
// strategy.ErrNotSent, and works once it is back. (A call that a stopping
// server breaks off may not wrap it: see TestServerRestart.)
func TestSlotsServerDown(t *testing.T) {
	srv, dsn := startServer(t)
	s := open(t, &Postgres{DSN: dsn})
	srv.Stop()
	_, ok, err := s.AcquireSlot(ctxT(t), "ns", "k", "b", 2, time.Minute)
	if !errors.Is(err, strategy.ErrNotSent) || ok {
		t.Errorf("acquiring with the server down: ok %v, error %v, want one that wraps ErrNotSent", ok, err)
	}
	for what, err := range map[string]error{
		"renewing":  s.RenewSlots(ctxT(t), "ns", []strategy.Slot{{Key: "k", ID: "a"}}, time.Minute),
		"releasing": s.ReleaseSlots(ctxT(t), "ns", []strategy.Slot{{Key: "k", ID: "a"}}),
	} {
		if !errors.Is(err, strategy.ErrNotSent) {
			t.Errorf("%s with the server down: %v, want an error that wraps ErrNotSent", what, err)
		}
	}
	srv.Start()
	strategytest.AcquireOK(t, s, "ns", "k", "b", 2, time.Minute, 1)
}
