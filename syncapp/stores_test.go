package syncapp

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// connectionCounter returns a function that tells how many connections a
// Redis server has accepted since it started, through one connection of
// its own, made here.
func connectionCounter(t *testing.T, srv *redistest.Server) func() int {
	client := srv.Client("")
	count := func() int {
		t.Helper()
		info, err := client.Info(context.Background(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.Atoi(statLine(info, "total_connections_received"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	count()
	return count
}

// TestNamespacesShareAStore gives two namespaces the same Redis settings:
// they share one store, whose client's connections serve both, while a
// namespace with other settings has a store of its own.
func TestNamespacesShareAStore(t *testing.T) {
	srv := redistest.Start(t)
	strategy := fmt.Sprintf(`{"module": "redis", "addresses": [%q]}`, srv.Addr)
	cfg := fmt.Sprintf(`{"namespaces": {
		"api": {"sync_rate": "1h", "window_sizes": ["1h"], "strategy": %s},
		"web": {"sync_rate": "1h", "window_sizes": ["1h"], "strategy": %s},
		"other": {"sync_rate": "1h", "window_sizes": ["1h"], "strategy": {"module": "redis", "addresses": [%q], "key_prefix": "other"}}}}`,
		strategy, strategy, srv.Addr)
	n := start(t, caddy.NewUsagePool(), cfg)
	if n.ns("api").store != n.ns("web").store {
		t.Fatal("namespaces with the same store settings have stores of their own")
	}
	if n.ns("api").store == n.ns("other").store {
		t.Fatal("namespaces with different store settings share a store")
	}
	ctx := context.Background()
	connectionsReceived := connectionCounter(t, srv)
	sync := func(name string) {
		t.Helper()
		n.ns(name).Increment(ctx, "k", time.Hour, 1)
		if err := n.ns(name).Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	sync("api") // the store's client dials
	before := connectionsReceived()
	sync("web")
	if got := connectionsReceived() - before; got != 0 {
		t.Fatalf("the second namespace on the same store opened %d connections, want none", got)
	}
	sync("other")
	if got := connectionsReceived() - before; got == 0 {
		t.Fatal("a namespace with a store of its own opened no connection")
	}
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 1 {
		t.Fatalf("store holds %v for namespace api, want its one hit", got)
	}
}

// reloadUnderLoad starts cfg in pool, then replaces it with a config of
// the same JSON reloads times, as Caddy's reloads do (the new config
// starts, then the old one stops), while a goroutine hits key "k" of
// namespace "api" in 1h windows. afterReload, if set, runs after each old
// config stopped. It stops the last config and returns the hits counted.
func reloadUnderLoad(t *testing.T, pool *caddy.UsagePool, cfg string, reloads int, afterReload func()) int {
	t.Helper()
	var (
		mu   sync.Mutex // held while a hit counts on the current config
		cur  = start(t, pool, cfg)
		hits int
		stop = make(chan struct{})
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			cur.ns("api").Increment(context.Background(), "k", time.Hour, 1)
			hits++
			mu.Unlock()
			time.Sleep(200 * time.Microsecond) // not a wait: a client's pace, which leaves the reloads room
		}
	}()
	counted := func() int {
		mu.Lock()
		defer mu.Unlock()
		return hits
	}
	for range reloads {
		next := start(t, pool, cfg)
		mu.Lock()
		old := cur
		cur = next
		mu.Unlock()
		old.stop()
		if afterReload != nil {
			afterReload()
		}
		before := counted()
		poll.Until(t, 10*time.Second, "a hit on the new config", func() bool { return counted() > before })
	}
	close(stop)
	<-done
	cur.stop()
	return hits
}

// checkAllReleased checks that the last config gave back everything it
// pooled, and that the goroutines are back to baseline.
func checkAllReleased(t *testing.T, pool *caddy.UsagePool, baseline int) {
	t.Helper()
	pool.Range(func(k, _ any) bool {
		t.Errorf("%v still pooled after the last config stopped", k)
		return true
	})
	poll.Until(t, 10*time.Second, fmt.Sprintf("goroutines back to %d", baseline), func() bool {
		return runtime.NumGoroutine() <= baseline
	})
}

// TestReloadsUnderLoadShareTheStore reloads fifty times while hits go on:
// every config uses the first one's store, so the server sees no more
// connections than one pool holds, and no goroutine is left at the end.
func TestReloadsUnderLoadShareTheStore(t *testing.T) {
	srv := redistest.Start(t)
	const poolSize = 4
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "10ms", "window_sizes": ["1h"],
		"strategy": {"module": "redis", "addresses": [%q], "pool_size": %d}}}}`, srv.Addr, poolSize)
	connectionsReceived := connectionCounter(t, srv)
	baseline := runtime.NumGoroutine()
	before := connectionsReceived()
	pool := caddy.NewUsagePool()
	hits := reloadUnderLoad(t, pool, cfg, 50, nil)
	if got := connectionsReceived() - before; got > poolSize {
		t.Errorf("50 reloads opened %d connections, want at most one pool's %d", got, poolSize)
	}
	checkAllReleased(t, pool, baseline)
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != float64(hits) {
		t.Fatalf("store holds %v, want every one of the %d hits, once", got, hits)
	}
}

// backendPIDs returns a function that adds to seen the process IDs of the
// client connections to database db of a PostgreSQL server: one process
// per connection, so the set grows with every connection opened.
func backendPIDs(t *testing.T, srv *pgtest.Server, db string) (sample func(), seen map[int32]bool) {
	conn := srv.Conn(t, "postgres")
	seen = make(map[int32]bool)
	sample = func() {
		t.Helper()
		rows, err := conn.Query(context.Background(),
			`SELECT pid FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'`, db)
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pids {
			seen[p] = true
		}
	}
	return sample, seen
}

// TestPostgresNamespacesShareAPool gives two namespaces the same
// PostgreSQL settings: one connection pool serves both.
func TestPostgresNamespacesShareAPool(t *testing.T) {
	srv := pgtest.Start(t)
	dsn := srv.CreateDB(t, "rl")
	cfg := fmt.Sprintf(`{"namespaces": {
		"api": {"sync_rate": "1h", "window_sizes": ["1h"], "strategy": {"module": "postgres", "dsn": %q}},
		"web": {"sync_rate": "1h", "window_sizes": ["1h"], "strategy": {"module": "postgres", "dsn": %q}}}}`, dsn, dsn)
	n := start(t, caddy.NewUsagePool(), cfg)
	if n.ns("api").store != n.ns("web").store {
		t.Fatal("namespaces with the same store settings have stores of their own")
	}
	sample, seen := backendPIDs(t, srv, "rl")
	ctx := context.Background()
	for _, name := range []string{"api", "web", "api", "web"} {
		n.ns(name).Increment(ctx, "k", time.Hour, 1)
		if err := n.ns(name).Sync(ctx); err != nil {
			t.Fatal(err)
		}
		sample()
	}
	if len(seen) != 1 {
		t.Fatalf("two namespaces syncing one after the other used %d connections, want 1", len(seen))
	}
}

// TestPostgresReloadsUnderLoadShareThePool reloads fifty times while hits
// go on: every config uses the first one's pool, so the server never sees
// more connections than max_conns, and no goroutine is left at the end.
func TestPostgresReloadsUnderLoadShareThePool(t *testing.T) {
	srv := pgtest.Start(t)
	const maxConns = 3
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "10ms", "window_sizes": ["1h"],
		"strategy": {"module": "postgres", "dsn": %q, "max_conns": %d}}}}`, srv.CreateDB(t, "rl"), maxConns)
	sample, seen := backendPIDs(t, srv, "rl")
	baseline := runtime.NumGoroutine()
	pool := caddy.NewUsagePool()
	hits := reloadUnderLoad(t, pool, cfg, 50, sample)
	if len(seen) == 0 || len(seen) > maxConns {
		t.Errorf("50 reloads used %d connections, want 1 to max_conns (%d)", len(seen), maxConns)
	}
	checkAllReleased(t, pool, baseline)
	if got := (fleetStore{strategy: fmt.Sprintf(`{"module": "postgres", "dsn": %q}`, srv.DSN("rl"))}).total(t, "k", time.Hour); got != float64(hits) {
		t.Fatalf("store holds %v, want every one of the %d hits, once", got, hits)
	}
}

// TestPostgresValidateNeverConnects provisions and cleans up a config with
// a postgres namespace, as caddy validate does: the server sees no
// connection, no table is created and no goroutine is left.
func TestPostgresValidateNeverConnects(t *testing.T) {
	srv := pgtest.Start(t)
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "0", "window_sizes": ["1m"],
		"strategy": {"module": "postgres", "dsn": %q}}}}`, srv.CreateDB(t, "rl"))
	sample, seen := backendPIDs(t, srv, "rl")
	goroutines := runtime.NumGoroutine()
	n, err := provision(t, caddy.NewUsagePool(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sample()
	n.cleanup()
	sample()
	if len(seen) != 0 {
		t.Fatalf("validating a config connected to PostgreSQL %d times", len(seen))
	}
	// A connection that came and went would have created the table.
	var table *string
	if err := srv.Conn(t, "rl").QueryRow(context.Background(), `SELECT to_regclass('rate_limit_counters')::text`).Scan(&table); err != nil {
		t.Fatal(err)
	}
	if table != nil {
		t.Fatalf("validating a config created the table %s", *table)
	}
	poll.Until(t, 10*time.Second, fmt.Sprintf("goroutines back to %d", goroutines), func() bool {
		return runtime.NumGoroutine() <= goroutines
	})
}
