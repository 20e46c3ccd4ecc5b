package syncapp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratesync/caddy-ratelimit/window"
)

// spreadFleet is a periodic fleet that a balancer spreads clients over:
// each client's requests go to the next node in turn.
type spreadFleet struct {
	nodes []*Namespace
}

// startSpreadFleet starts n periodic nodes of namespace name on the
// store, at sync_rate 100ms with sync_above above (0: off), each connected
// and synced once. Their hits never see the store stalled: the fleet is
// exact only while the store answers, and a loaded machine can hold a
// round trip past stallAfter (hitqueue_test.go checks stalls).
func startSpreadFleet(t *testing.T, s fleetStore, name string, n int, above float64) spreadFleet {
	syncAbove := ""
	if above > 0 {
		syncAbove = fmt.Sprintf(`, "sync_above": %v`, above)
	}
	cfg := fmt.Sprintf(`{"namespaces": {%q: {"sync_rate": "100ms"%s, "window_sizes": ["1m"], "strategy": %s}}}`, name, syncAbove, s.strategy)
	var f spreadFleet
	for range n {
		ns := start(t, caddy.NewUsagePool(), cfg).ns(name)
		if ns.road != nil {
			neverStall(ns.road.hits)
		}
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
// per minute over six and ten periodic nodes at sync_rate 100ms, each
// client sending to the next node each time: a request every 250ms for
// 6 s, and every 1 s for 8 s, so that each node sees a client every 1.5
// to 10 s, far less often than its runs fetch a key. With sync_above 0.5
// each client is admitted exactly 5 times; without, at most 6 (the
// requests within one interval of the fleet's count reaching the limit).
// The store's feed of keys near their limits is what tells each node:
// without one, every node admits a client it has not seen lately on its
// own counts (7 and 11 of 5 with sync_above, over six and ten nodes). On
// the memory store, Redis and PostgreSQL. The accuracy harness's spread
// family adds clients every 10 s and hourly limits, placed within one
// window (docs/accuracy.md).
func TestFleetSpreadClientsKeepTheirLimit(t *testing.T) {
	stores := map[string]func(t *testing.T) fleetStore{"memory": memoryStore}
	for name, start := range fleetStores(t) {
		stores[name] = start
	}
	type fleetCase struct {
		nodes         int
		every, length time.Duration
		above         float64
	}
	var cases []fleetCase
	for _, nodes := range []int{6, 10} {
		for _, pace := range []struct{ every, length time.Duration }{
			{250 * time.Millisecond, 6 * time.Second},
			{time.Second, 8 * time.Second},
		} {
			for _, above := range []float64{0.5, 0} {
				cases = append(cases, fleetCase{nodes, pace.every, pace.length, above})
			}
		}
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// The fleets of a store share its server, each in a
			// namespace of its own, and run half at a time: they mostly
			// wait, but all eight at once (64 nodes syncing every 100ms)
			// slowed PostgreSQL's answers past an interval when the whole
			// suite ran beside them.
			s := open(t)
			fleets := make([]spreadFleet, len(cases))
			for i, c := range cases {
				fleets[i] = startSpreadFleet(t, s, fmt.Sprintf("spread-%s-%d", name, i), c.nodes, c.above)
			}
			got := make([][]int, len(cases))
			for half := range 2 {
				var wg sync.WaitGroup
				for i, c := range cases {
					if i%2 == half {
						wg.Go(func() { got[i] = fleets[i].admitted(8, c.every, c.length) })
					}
				}
				wg.Wait()
			}
			for i, c := range cases {
				most := 6
				if c.above > 0 {
					most = 5
				}
				// The bounds hold while the store answers. A store that
				// failed a call (a timeout on a loaded machine) had the
				// nodes decide on their own counts meanwhile, as allow
				// does: up to one admission per node.
				if failed := syncErrors(t, fmt.Sprintf("spread-%s-%d", name, i)); failed > 0 {
					t.Logf("%d nodes, every %v, sync_above %v: the store failed %v calls: judged as allow, at most %d", c.nodes, c.every, c.above, failed, c.nodes)
					most = c.nodes
				}
				for client, n := range got[i] {
					if n > most || n < 5 {
						t.Errorf("%d nodes, every %v, sync_above %v: client %d admitted %d times of limit 5, want 5 to %d (all: %v)",
							c.nodes, c.every, c.above, client, n, most, got[i])
					}
				}
				t.Logf("%d nodes, every %v, sync_above %v: admitted per client %v", c.nodes, c.every, c.above, got[i])
			}
		})
	}
}

// syncErrors returns caddy_rate_limit_sync_errors_total of a namespace.
func syncErrors(t *testing.T, namespace string) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.syncErrors.WithLabelValues(namespace).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestFleetMarksKeysItsStoreHitsBringNear has one node of three bring a
// client near its limit by itself, so that sync_above sends its third hit
// to the store, which applies it without a push: the node's next run
// marks the key all the same, and a node that never saw the client
// rejects its sixth request.
func TestFleetMarksKeysItsStoreHitsBringNear(t *testing.T) {
	stores := map[string]func(t *testing.T) fleetStore{"memory": memoryStore}
	for name, start := range fleetStores(t) {
		stores[name] = start
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := startSpreadFleet(t, open(t), "alone", 3, 0.5)
			ctx := context.Background()
			limits := []Limit{{Size: time.Minute, Max: 5}}
			out := make([]window.Sample, 1)
			hit := func(i, node int, admit bool) {
				t.Helper()
				if got := f.nodes[node].Hit(ctx, "client", limits, 1, false, false, out) < 0; got != admit {
					t.Fatalf("request %d, on node %d: admitted %v, want %v (%+v)", i, node, got, admit, out[0])
				}
			}
			sync := func() {
				t.Helper()
				for _, ns := range f.nodes {
					if err := ns.Sync(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			for i := range 3 {
				hit(i+1, 1, true)
			}
			sync()
			hit(4, 2, true)
			hit(5, 2, true)
			sync()
			hit(6, 0, false)
		})
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
	// b has traffic of its own: a node with nothing to fetch rests, and
	// reads no mark.
	b.Hit(ctx, "other", []Limit{{Size: time.Minute, Max: 4}}, 1, false, false, out)
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

// TestRestingNodeReadsTheFeedOnItsFirstRequest has node b's runs find
// nothing to fetch: they stop reading the feed of keys near their limits.
// Node a then brings a client near its limit; b's first request reads
// the feed before it is decided, once for all the requests after it, so
// that b admits the client only up to the limit.
func TestRestingNodeReadsTheFeedOnItsFirstRequest(t *testing.T) {
	awayFromMinuteEnds()
	name := fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "1h", "window_sizes": ["1m"], "strategy": {"module": "test_counting", "name": %q}}}}`, name)
	a := start(t, caddy.NewUsagePool(), cfg).ns("api")
	b := start(t, caddy.NewUsagePool(), cfg).ns("api")
	v, _ := countingStores.Load(name)
	store := v.(*countingStore)
	ctx := context.Background()
	limits := []Limit{{Size: time.Minute, Max: 5}}
	out := make([]window.Sample, 1)
	sync := func(ns *Namespace) {
		t.Helper()
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b.Hit(ctx, "warm-up", limits, 1, false, false, out)
	for range fetchRuns(time.Hour) + 1 {
		sync(b) // fetches warm-up, then nothing
	}
	if !b.periodic.near.restingNow() {
		t.Fatal("b's runs have nothing to fetch, yet b does not rest")
	}
	for range 3 {
		a.Hit(ctx, "client", limits, 1, false, false, out)
	}
	sync(a) // 3 of 5: the store marks the client
	reads := store.feedReads.Load()
	sync(b)
	if got := store.feedReads.Load() - reads; got != 0 {
		t.Fatalf("a resting node's run read the feed %d times, want none", got)
	}
	admitted := 0
	for range 3 {
		if b.Hit(ctx, "client", limits, 1, false, false, out) < 0 {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("b admitted %d of 3 requests of a client a took to 3 of 5, want 2", admitted)
	}
	if got := store.feedReads.Load() - reads; got != 1 || b.periodic.near.restingNow() {
		t.Fatalf("b's requests read the feed %d times (resting after: %v), want once, and awake", got, b.periodic.near.restingNow())
	}
}
