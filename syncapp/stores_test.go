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
	var (
		mu   sync.Mutex
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
			time.Sleep(200 * time.Microsecond)
		}
	}()
	for range 50 {
		next := start(t, pool, cfg)
		mu.Lock()
		old := cur
		cur = next
		mu.Unlock()
		old.stop()
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	<-done
	cur.stop()
	if got := connectionsReceived() - before; got > poolSize {
		t.Errorf("50 reloads opened %d connections, want at most one pool's %d", got, poolSize)
	}
	pool.Range(func(k, _ any) bool {
		t.Errorf("%v still pooled after the last config stopped", k)
		return true
	})
	poll.Until(t, 10*time.Second, fmt.Sprintf("goroutines back to %d", baseline), func() bool {
		return runtime.NumGoroutine() <= baseline
	})
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != float64(hits) {
		t.Fatalf("store holds %v, want every one of the %d hits, once", got, hits)
	}
}
