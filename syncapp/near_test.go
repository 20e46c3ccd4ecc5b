package syncapp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/memory"
	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	caddy.RegisterModule(new(countingStrategy))
}

// countingStrategy opens the countingStore of its name.
type countingStrategy struct {
	Name string `json:"name"`
}

var countingStores sync.Map // by name

func (*countingStrategy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: strategy.Namespace + ".test_counting", New: func() caddy.Module { return new(countingStrategy) }}
}
func (c *countingStrategy) StoreKey() string                 { return c.Name }
func (*countingStrategy) ValidateWindow(time.Duration) error { return nil }
func (c *countingStrategy) OpenStore() (strategy.Store, error) {
	v, _ := countingStores.LoadOrStore(c.Name, &countingStore{Store: memoryDataSet("counting/" + c.Name), name: c.Name})
	return v.(*countingStore), nil
}

// countingStore is a memory store that counts the synchronous hits it
// applies, the reads of its feed of keys near their limits, the marks
// nodes ask it to make, and the runs that have it do its housekeeping.
type countingStore struct {
	*memory.Store
	name                   string
	hits, feedReads, marks atomic.Int64
	maintained             atomic.Int64
}

// Maintain implements strategy.Maintainer: it counts the calls.
func (c *countingStore) Maintain(context.Context) { c.maintained.Add(1) }

func (c *countingStore) GetCountersNear(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, known int64, mark []strategy.NearMark) ([]window.Count, []strategy.NearMark, int64, error) {
	c.feedReads.Add(1)
	c.marks.Add(int64(len(mark)))
	return c.Store.GetCountersNear(ctx, namespace, keys, sizes, now, known, mark)
}

func (c *countingStore) MarkNear(ctx context.Context, namespace string, marks []strategy.NearMark) error {
	c.marks.Add(int64(len(marks)))
	return c.Store.MarkNear(ctx, namespace, marks)
}

func (c *countingStore) Hit(ctx context.Context, namespace, key, id string, windows []strategy.WindowHit, undo bool) ([]strategy.WindowCounts, int, error) {
	c.hits.Add(1)
	return c.Store.Hit(ctx, namespace, key, id, windows, undo)
}

// countingNode starts a node whose namespace "api" syncs every hour (so
// only the test pushes) with sync_above, on a counting store of its own.
func countingNode(t *testing.T, above float64) (*Namespace, *countingStore) {
	name := fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "1h", "sync_above": %v, "window_sizes": ["1h"], "strategy": {"module": "test_counting", "name": %q}}}}`, above, name)
	ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
	v, _ := countingStores.Load(name)
	return ns, v.(*countingStore)
}

// storeCount reads the store's current count of key's hour window.
func storeCount(t *testing.T, s strategy.Store, key string) float64 {
	t.Helper()
	counts, err := s.GetCounters(context.Background(), "api", []string{key}, []time.Duration{time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	start := window.Start(time.Now().UnixNano(), time.Hour)
	for _, c := range counts {
		if c.Start == start {
			return c.Value
		}
	}
	return 0
}

// TestSyncAboveOnlyNearKeysReachTheStore counts a key up to its limit:
// far from it hits stay local; near it each is one synchronous hit, which
// carries the node's unpushed diffs; past it hits are rejected locally.
func TestSyncAboveOnlyNearKeysReachTheStore(t *testing.T) {
	awayFromMinuteEnds()
	ns, store := countingNode(t, 0.8)
	ctx := context.Background()
	limits := []Limit{{Size: time.Hour, Max: 10}}
	out := make([]window.Sample, 1)
	hit := func(key string) int { return ns.Hit(ctx, key, limits, 1, true, false, out) }
	for i := range 7 {
		if rej := hit("k"); rej != -1 {
			t.Fatalf("hit %d rejected", i+1)
		}
		hit(fmt.Sprintf("far-%d", i))
	}
	if n := store.hits.Load(); n != 0 {
		t.Fatalf("%d synchronous hits for keys below 0.8 of their limit, want none", n)
	}
	if rej := hit("k"); rej != -1 || store.hits.Load() != 1 {
		t.Fatalf("8th hit, which reaches 0.8 of the limit: rejected %d after %d synchronous hits; want admitted by one", rej, store.hits.Load())
	}
	if got := storeCount(t, store, "k"); got != 8 {
		t.Fatalf("the store holds %v after the first near hit, want 8: the 7 unpushed hits ride along", got)
	}
	for i := 9; i <= 10; i++ {
		if rej := hit("k"); rej != -1 || store.hits.Load() != int64(i-7) {
			t.Fatalf("hit %d: rejected %d after %d synchronous hits; want admitted by the %dth", i, rej, store.hits.Load(), i-7)
		}
	}
	if rej := hit("k"); rej != 0 || store.hits.Load() != 3 {
		t.Fatalf("11th hit: rejected %d after %d synchronous hits; want rejected locally", rej, store.hits.Load())
	}
	if err := ns.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := storeCount(t, store, "k"); got != 11 {
		t.Fatalf("the store holds %v after a sync, want 11: each hit once", got)
	}
	if got := out[0].Current; got != 11 {
		t.Fatalf("the node sees %v, want 11", got)
	}
}

// TestSyncAboveMarksAKeyOnce has a node's hits at the store bring a key
// near its limit: its next run marks the key, and its hits after that run
// ask for no mark again, although the run's read came before the mark.
func TestSyncAboveMarksAKeyOnce(t *testing.T) {
	awayFromMinuteEnds()
	ns, store := countingNode(t, 0.8)
	ctx := context.Background()
	limits := []Limit{{Size: time.Hour, Max: 10}}
	out := make([]window.Sample, 1)
	for range 8 { // the 8th is decided at the store, which leaves it near
		ns.Hit(ctx, "k", limits, 1, true, false, out)
	}
	if n := store.hits.Load(); n != 1 {
		t.Fatalf("8 hits: %d synchronous hits, want 1", n)
	}
	for run := range 3 {
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := store.marks.Load(); got != 1 {
			t.Fatalf("run %d: %d marks asked of the store, want 1", run+1, got)
		}
		ns.Hit(ctx, "k", limits, 1, true, false, out) // at the store, near
	}
}

// TestSyncAboveMarksOncePerFleet has two nodes' hits at the store find a
// key near its limit: only the node whose hit brought it there asks for
// a mark, not the one that found it so.
func TestSyncAboveMarksOncePerFleet(t *testing.T) {
	awayFromMinuteEnds()
	a, store := countingNode(t, 0.8)
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "1h", "sync_above": 0.8, "window_sizes": ["1h"], "strategy": {"module": "test_counting", "name": %q}}}}`, store.name)
	b := start(t, caddy.NewUsagePool(), cfg).ns("api")
	ctx := context.Background()
	limits := []Limit{{Size: time.Hour, Max: 10}}
	out := make([]window.Sample, 1)
	for _, ns := range []*Namespace{a, b} {
		for range 8 { // the 8th is decided at the store
			ns.Hit(ctx, "k", limits, 1, true, false, out)
		}
	}
	if n := store.hits.Load(); n != 2 {
		t.Fatalf("%d synchronous hits, want one per node", n)
	}
	for _, ns := range []*Namespace{a, b} {
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := store.marks.Load(); got != 1 {
		t.Fatalf("%d marks asked of the store, want 1: the first node's hit crossed, the second found the key near", got)
	}
}

// TestSyncAboveDecidesOnOtherNodesCounts has the store reject a near hit
// on another node's pushed hits the node has not fetched yet; with
// disable_penalty the unpushed diffs the hit carried go back to the node,
// to be pushed once.
func TestSyncAboveDecidesOnOtherNodesCounts(t *testing.T) {
	awayFromMinuteEnds()
	ns, store := countingNode(t, 0.5)
	ctx := context.Background()
	limits := []Limit{{Size: time.Hour, Max: 10}}
	out := make([]window.Sample, 1)
	for range 4 {
		ns.Hit(ctx, "k", limits, 1, true, true, out) // below 0.5 of 10: local
	}
	start := window.Start(time.Now().UnixNano(), time.Hour)
	other := strategy.Batch{ID: "other-node", Namespace: "api", Diffs: []window.Diff{{Key: "k", Size: time.Hour, Start: start, Value: 6}}}
	if err := store.PushDiffs(ctx, other); err != nil {
		t.Fatal(err)
	}
	if rej := ns.Hit(ctx, "k", limits, 1, true, true, out); rej != 0 {
		t.Fatalf("near hit: rejected %d, want the store to reject it (4 + 6 + 1 > 10)", rej)
	}
	if store.hits.Load() != 1 || out[0].Current != 10 {
		t.Fatalf("%d synchronous hits, the node sees %v; want one, and 10", store.hits.Load(), out[0].Current)
	}
	if err := ns.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := storeCount(t, store, "k"); got != 10 {
		t.Fatalf("the store holds %v, want 10: the node's 4 given back and pushed once", got)
	}
}

// TestFleetSyncAboveAdmitsExactlyTheLimit paces hits of one key through
// three nodes at sync_rate 20ms: the other nodes admit far less than
// (1 - sync_above) of the limit within an interval, so the fleet admits
// exactly the limit, while only hits near it reach the store.
func TestFleetSyncAboveAdmitsExactlyTheLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "20ms", "sync_above": 0.5, "window_sizes": ["1h"], "strategy": %s}}}`, s.strategy)
		// The hits are fixed: a new hour would admit the limit again. The
		// nodes connect to the store first, which a loaded machine may
		// make take seconds.
		awayFromHourEnd(30 * time.Second)
		hour := window.Start(time.Now().UnixNano(), time.Hour)
		var nodes []*Namespace
		for range 3 {
			ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
			ns.Increment(context.Background(), "warm-up", time.Hour, 1)
			if err := ns.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			nodes = append(nodes, ns)
		}
		const limit, perNode = 100, 80
		limits := []Limit{{Size: time.Hour, Max: limit}}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for _, ns := range nodes {
			wg.Go(func() {
				out := make([]window.Sample, 1)
				for range perNode {
					if ns.Hit(context.Background(), "k", limits, 1, true, true, out) < 0 {
						admitted.Add(1)
					}
					time.Sleep(5 * time.Millisecond) // not a wait: a client's pace, so that syncs fall between a node's hits
				}
			})
		}
		wg.Wait()
		if admitted.Load() != limit {
			if window.Start(time.Now().UnixNano(), time.Hour) != hour {
				t.Log("the hour ended during the test, though it had 30 s left at its start")
			}
			t.Fatalf("admitted %d of %d, want exactly %d", admitted.Load(), 3*perNode, limit)
		}
		poll.Until(t, 10*time.Second, "the store to hold the admitted hits", func() bool {
			return s.total(t, "k", time.Hour) == limit
		})
	})
}

// TestFleetSyncAboveOutageLosesNothing takes the store away while two
// nodes hit keys near their limits: the hits count locally, and the store
// ends up with every one, once.
func TestFleetSyncAboveOutageLosesNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "50ms", "sync_above": 0.000001, "window_sizes": ["1h"], "strategy": %s}}}`, s.strategy)
		nodes := []*Namespace{
			start(t, caddy.NewUsagePool(), cfg).ns("api"),
			start(t, caddy.NewUsagePool(), cfg).ns("api"),
		}
		limits := []Limit{{Size: time.Hour, Max: 1e6}} // every hit past the first is near
		out := make([]window.Sample, 1)
		hits := 0
		hit := func(n int) {
			for i := range n {
				if rej := nodes[i%2].Hit(context.Background(), fmt.Sprint("k", i%7), limits, 1, true, false, out); rej >= 0 {
					t.Fatalf("hit rejected by limit %d", rej)
				}
				hits++
			}
		}
		hit(100)
		s.down()
		// The store stays away, while the nodes hit on, until a run of each
		// node failed (a paused Redis takes a run's timeout, 5 s).
		awaitFailedRuns(t, 1, func() { hit(3) }, nodes...)
		s.up()
		hit(50)
		total := func() float64 {
			sum := 0.0
			for i := range 7 {
				sum += s.total(t, fmt.Sprint("k", i), time.Hour)
			}
			return sum
		}
		poll.Until(t, 40*time.Second, fmt.Sprintf("the store to hold all %d hits", hits), func() bool {
			return total() == float64(hits)
		})
		moreRuns(t, nodes...)
		if got := total(); got != float64(hits) {
			t.Fatalf("store holds %v, want %d: a hit was pushed twice", got, hits)
		}
	})
}

func (c *countingStore) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	c.hits.Add(int64(len(hits)))
	c.Store.HitBatch(ctx, namespace, id, hits, results)
}

// TestPeekNearAsksTheStore peeks, on a node that never saw a key, at a key
// another node brought near its limit, as a request with response_cost
// does before it runs: with sync_above the store's feed marks the key, so
// the peek reads the store's count, not the node's empty one; a key the
// node's own counts bring near is read there too.
func TestPeekNearAsksTheStore(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		// Runs only when the test syncs; a test clock, so that the hour
		// cannot end.
		cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "1h", "sync_above": 0.8, "window_sizes": ["1h"], "strategy": %s}}}`, s.strategy)
		clock := fakeclock.New(time.Date(time.Now().Year()+1, 3, 2, 10, 0, 0, 0, time.UTC))
		ctx := context.Background()
		var a, b *Namespace
		for _, ns := range []**Namespace{&a, &b} {
			n, err := provisionAt(t, caddy.NewUsagePool(), cfg, clock.UnixNano)
			if err != nil {
				t.Fatal(err)
			}
			if err := n.app.Start(); err != nil {
				t.Fatal(err)
			}
			*ns = n.ns("api")
			neverStall((*ns).road.hits)
			(*ns).Increment(ctx, "warm-up", time.Hour, 1)
			if err := (*ns).Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		limits := []Limit{{Size: time.Hour, Max: 10}}
		out := make([]window.Sample, 1)
		for i := range 9 { // the 8th and 9th at the store
			if a.Hit(ctx, "k", limits, 1, true, true, out) >= 0 {
				t.Fatalf("hit %d rejected", i+1)
			}
		}
		for _, ns := range []*Namespace{a, b} { // a marks the key, b reads the mark
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if r, _ := b.Peek(ctx, "k", limits, 2, true, out); r != 0 || out[0].Current != 9 {
			t.Errorf("a peek of 2 on the other node: rejected %d with a count of %v, want rejected by limit 0 at the store's 9", r, out[0].Current)
		}
		if r, _ := b.Peek(ctx, "k", limits, 1, true, out); r != -1 {
			t.Errorf("a peek of 1 on the other node: rejected %d, want admitted (9 + 1 of 10)", r)
		}
		// Near by a's own count: the store's, which holds the same.
		if r, _ := a.Peek(ctx, "k", limits, 2, true, out); r != 0 || out[0].Current != 9 {
			t.Errorf("a peek of 2 on the first node: rejected %d with a count of %v, want 0 at 9", r, out[0].Current)
		}
	})
}

// TestRunsMaintainTheStore checks that a periodic namespace's runs have a
// store with housekeeping (strategy.Maintainer) do it after their calls.
func TestRunsMaintainTheStore(t *testing.T) {
	name := fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "20ms", "window_sizes": ["1h"], "strategy": {"module": "test_counting", "name": %q}}}}`, name)
	ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
	v, _ := countingStores.Load(name)
	store := v.(*countingStore)
	out := make([]window.Sample, 1)
	ns.Hit(context.Background(), "k", []Limit{{Size: time.Hour, Max: 10}}, 1, true, false, out)
	poll.Until(t, 10*time.Second, "the runs to push the hit", func() bool { return storeCount(t, store, "k") == 1 })
	poll.Until(t, 10*time.Second, "a run to maintain the store", func() bool { return store.maintained.Load() > 0 })
}
