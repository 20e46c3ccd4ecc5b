package syncapp

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/caddy-ratelimit/window"
)

// spreadFleet is a periodic fleet that a balancer spreads clients over:
// each client's requests go to the next node in turn.
type spreadFleet struct {
	nodes []*Namespace
}

// startSpreadFleet starts n periodic nodes of namespace api on the store,
// at sync_rate 100ms with sync_above above (0: off), each connected and
// synced once.
func startSpreadFleet(t *testing.T, s fleetStore, n int, above float64) spreadFleet {
	syncAbove := ""
	if above > 0 {
		syncAbove = fmt.Sprintf(`, "sync_above": %v`, above)
	}
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "100ms"%s, "window_sizes": ["1m"], "strategy": %s}}}`, syncAbove, s.strategy)
	var f spreadFleet
	for range n {
		ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
		ns.Increment(context.Background(), "warm-up", time.Minute, 1)
		if err := ns.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.nodes = append(f.nodes, ns)
	}
	return f
}

// admitted sends the requests of clients (keys client-0 and on), each
// every interval for length, client i starting at node i and going on to
// the next node each time, against limit 5 per minute (sliding), and
// returns how many of each client's requests were admitted.
func (f spreadFleet) admitted(clients int, every, length time.Duration) []int {
	limits := []Limit{{Size: time.Minute, Max: 5}}
	got := make([]int, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			key := fmt.Sprintf("client-%d", c)
			out := make([]window.Sample, 1)
			// The clients start apart, so that their requests fall at
			// different points of the nodes' runs.
			time.Sleep(time.Duration(c) * every / time.Duration(clients)) // a client's start, not a wait
			for i := range int(length / every) {
				ns := f.nodes[(c+i)%len(f.nodes)]
				if ns.Hit(context.Background(), key, limits, 1, false, false, out) < 0 {
					got[c]++
				}
				time.Sleep(every) // a client's pace, not a wait
			}
		})
	}
	wg.Wait()
	return got
}

// TestFleetSpreadClientsKeepTheirLimit spreads eight clients of limit 5
// per minute over six and ten periodic nodes at sync_rate 100ms, a
// request every 250ms each, to the next node each time, so that each
// node sees a client every 1.5 s or 2.5 s: far less often than its runs
// fetch a key. With sync_above 0.5 each client is admitted exactly 5
// times; without, at most 6 (the requests within one interval of the
// fleet's count reaching the limit). The store's feed of keys near their
// limits is what tells each node: without one, every node admits a
// client it has not seen lately on its own counts (7 and 11 of 5 with
// sync_above, over six and ten nodes). On the memory store, and six
// nodes on Redis and PostgreSQL.
func TestFleetSpreadClientsKeepTheirLimit(t *testing.T) {
	stores := map[string]func(t *testing.T) fleetStore{"memory": memoryStore}
	for name, start := range fleetStores(t) {
		stores[name] = start
	}
	for name, open := range stores {
		for _, nodes := range []int{6, 10} {
			if nodes == 10 && name != "memory" {
				continue // the fleet harness's rows cover more nodes on the servers
			}
			for _, above := range []float64{0.5, 0} {
				t.Run(fmt.Sprintf("%s, %d nodes, sync_above %v", name, nodes, above), func(t *testing.T) {
					t.Parallel()
					f := startSpreadFleet(t, open(t), nodes, above)
					got := f.admitted(8, 250*time.Millisecond, 6*time.Second)
					most := 6
					if above > 0 {
						most = 5
					}
					for c, n := range got {
						if n > most || n < 5 {
							t.Errorf("client %d admitted %d times of limit 5, want 5 to %d (all: %v)", c, n, most, got)
						}
					}
					t.Logf("admitted per client: %v", got)
				})
			}
		}
	}
}

// TestNearKeysMetric has one node bring a key near its limit: another
// node reads the store's mark with its next run, and reports it in
// caddy_rate_limit_near_keys.
func TestNearKeysMetric(t *testing.T) {
	cfg := fmt.Sprintf(`{"namespaces": {"near-metric": {"sync_rate": "1h", "window_sizes": ["1m"], "strategy": %s}}}`, memoryStore(t).strategy)
	a := start(t, caddy.NewUsagePool(), cfg).ns("near-metric")
	b := start(t, defaultPool, cfg).ns("near-metric") // the pool the collector reports
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	series := `caddy_rate_limit_near_keys{namespace="near-metric"}`
	ctx := context.Background()
	out := make([]window.Sample, 1)
	for range 2 { // 2 of 4: half the limit, where the store marks the key
		a.Hit(ctx, "client", []Limit{{Size: time.Minute, Max: 4}}, 1, false, false, out)
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := gathered(t, reg, series); got != 0 {
		t.Fatalf("%s = %v before a pushed, want 0", series, got)
	}
	for _, ns := range []*Namespace{a, b} {
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := gathered(t, reg, series); got != 1 {
		t.Fatalf("%s = %v once a pushed 2 hits of a limit of 4, want 1", series, got)
	}
}
