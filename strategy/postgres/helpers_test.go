package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

// testDB is the database the tests' stores use on their servers.
const testDB = "ratelimit"

// startServer starts a PostgreSQL server that the test owns, with an empty
// database testDB, and returns it and the database's DSN.
func startServer(t testing.TB) (*pgtest.Server, string) {
	t.Helper()
	srv := pgtest.Start(t)
	return srv, srv.CreateDB(t, testDB)
}

// open opens a store of p's settings and closes it when the test ends.
func open(t testing.TB, p *Postgres) *Store {
	t.Helper()
	return strategytest.Open(t, p.Open)
}

// counters purges s's expired rows and returns how many counters of a
// namespace its table holds.
func counters(t testing.TB, srv *pgtest.Server, s *Store, namespace string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Purge(ctx); err != nil {
		t.Fatalf("purging: %v", err)
	}
	return count(t, srv, "SELECT count(*) FROM "+s.names.counters+" WHERE namespace = $1", stored(namespace, maxStoredNamespace))
}

// slotRows purges s's expired rows and returns how many slots of a
// namespace its table holds.
func slotRows(t testing.TB, s *Store, namespace string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Purge(ctx); err != nil {
		t.Fatalf("purging: %v", err)
	}
	n, err := s.Slots(ctx, namespace)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// count runs a query of one integer in testDB, as the superuser.
func count(t testing.TB, srv *pgtest.Server, query string, args ...any) int {
	t.Helper()
	conn := srv.Conn(t, testDB)
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// appRole creates the role app in testDB, which may log in and read and
// write the counters' tables that exist (a DBA made them) but create
// nothing, and returns the DSN of dsn's database as that role.
func appRole(t testing.TB, srv *pgtest.Server, dsn string) string {
	t.Helper()
	if _, err := srv.Conn(t, testDB).Exec(ctxT(t), `CREATE ROLE app LOGIN;
		GRANT SELECT, INSERT, UPDATE, DELETE ON rate_limit_counters, rate_limit_counters_ids TO app`); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(dsn, "postgres://postgres@", "postgres://app@", 1)
}

// ctxT returns a context for a test's calls, cancelled when it ends.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// asHitter is s as the strategy.Hitter the app sees.
func asHitter(s *Store) strategy.Hitter { return s }
