package syncapp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/memory"
	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	caddy.RegisterModule(new(gatedStrategy))
}

// gatedStrategy opens the gatedStore of its name: a test holds a push in
// flight as long as it likes, to run something in the middle of a sync.
type gatedStrategy struct {
	Name string `json:"name"`
}

var gatedStores sync.Map // by name

func (*gatedStrategy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: strategy.Namespace + ".test_gated", New: func() caddy.Module { return new(gatedStrategy) }}
}
func (g *gatedStrategy) StoreKey() string                   { return g.Name }
func (*gatedStrategy) ValidateWindow(time.Duration) error   { return nil }
func (g *gatedStrategy) OpenStore() (strategy.Store, error) { return gatedStoreOf(g.Name), nil }

// memoryDataSet opens a memory store of the named data set, which the
// stores of that name share.
func memoryDataSet(name string) *memory.Store {
	s, _ := (&memory.Memory{Name: name}).Open() // it never fails
	return s
}

func gatedStoreOf(name string) *gatedStore {
	v, _ := gatedStores.LoadOrStore(name, &gatedStore{Store: memoryDataSet("gated/" + name), entered: make(chan struct{}), release: make(chan struct{})})
	return v.(*gatedStore)
}

// gatedStore is a memory store whose pushes, while hold is set, signal
// entered and wait for release before they apply.
type gatedStore struct {
	*memory.Store
	hold             atomic.Bool
	entered, release chan struct{}
}

func (g *gatedStore) PushDiffs(ctx context.Context, b strategy.Batch) error {
	if g.hold.Load() {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Store.PushDiffs(ctx, b)
}

// memoryStore is a fleetStore on a data set of the memory strategy of its
// own: a store shared in this process, for tests that need no server.
func memoryStore(t *testing.T) fleetStore {
	return fleetStore{strategy: fmt.Sprintf(`{"module": "memory", "name": %q}`, fmt.Sprintf("%s-%d", t.Name(), rand.Uint64()))}
}

// states reads key's windows of the given sizes on a node.
func states(ns *Namespace, key string, sizes ...time.Duration) []window.Sample {
	var out []window.Sample
	for _, s := range sizes {
		out = append(out, ns.SlidingWindow(key, s, nil))
	}
	return out
}

// awayFromMinuteEnds waits, if need be, until the current minute (and so
// the current hour) has more than two seconds left, so that a test's hits
// fall in one window of each.
func awayFromMinuteEnds() {
	if left := time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Minute)); left < 2*time.Second {
		time.Sleep(left + 10*time.Millisecond) // not an event: the nodes' wall clock must pass the minute's end
	}
}

// both returns the counts of a sample's window and of the one before it:
// every hit a test gave its own key, when the window may have ended during
// the test (an hour window does in one run out of 3600 s / the test's
// length, and the hits before its end are then the previous window's).
func both(s window.Sample) float64 { return s.Current + s.Previous }

// awayFromHourEnd returns once the hour has at least margin left, waiting
// for the next one if need be: for a test whose hour windows must not end
// while it runs because the plugin decides on them (fixed windows), where
// reading both windows would not help.
func awayFromHourEnd(margin time.Duration) {
	if left := time.Hour - time.Duration(time.Now().UnixNano()%int64(time.Hour)); left < margin {
		time.Sleep(left + 10*time.Millisecond) // not an event: the nodes' wall clock must pass the hour's end
	}
}

func sameCounts(a, b []window.Sample) bool {
	return slices.EqualFunc(a, b, func(x, y window.Sample) bool {
		return x.Current == y.Current && x.Previous == y.Previous && x.Start == y.Start
	})
}

// TestPeekCountsNothing peeks 1,000 times at a key, and at a key nobody
// hit: the counts on the node and in the store do not move, nothing waits
// to be pushed, and the zone holds no new key.
func TestPeekCountsNothing(t *testing.T) {
	for _, syncRate := range []string{"off", "1h", "0"} {
		t.Run("sync_rate "+syncRate, func(t *testing.T) {
			s := memoryStore(t)
			ns := start(t, caddy.NewUsagePool(), s.config(syncRate, "1m", "1h")).ns("api")
			ctx := context.Background()
			limits := []Limit{{Size: time.Minute, Max: 3}, {Size: time.Hour, Max: 100}}
			out := make([]window.Sample, 2)
			awayFromMinuteEnds()
			for range 5 {
				ns.Hit(ctx, "k", limits, 1, false, false, out)
			}
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			before := states(ns, "k", time.Minute, time.Hour)
			var stored [2]float64
			if syncRate != "off" {
				stored = [2]float64{s.total(t, "k", time.Minute), s.total(t, "k", time.Hour)}
				// The hits the minute rejected were not counted in the
				// hour (Kong's order).
				if stored != [2]float64{5, 3} {
					t.Fatalf("the store counts %v before the peeks, want 5 in the minute and 3 in the hour", stored)
				}
			}
			keys := ns.counters.Zone().Len()
			rejections := 0
			for range 1000 {
				if r, _ := ns.Peek(ctx, "k", limits, 1, false, out); r == 0 {
					rejections++
				}
				ns.Peek(ctx, "nobody", limits, 1, false, out)
			}
			if rejections != 1000 {
				t.Fatalf("%d of 1000 peeks at a key over its limit said the 1m limit rejects", rejections)
			}
			if got := states(ns, "k", time.Minute, time.Hour); !sameCounts(got, before) {
				t.Fatalf("counts after 1000 peeks: %+v, before: %+v", got, before)
			}
			if got := ns.runner.pendingDiffs(); got != 0 {
				t.Fatalf("%d diffs wait to be pushed after peeks", got)
			}
			if got := ns.counters.Zone().Len(); got != keys {
				t.Fatalf("the zone holds %d keys after peeks, %d before", got, keys)
			}
			if syncRate != "off" {
				if err := ns.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				if got := [2]float64{s.total(t, "k", time.Minute), s.total(t, "k", time.Hour)}; got != stored {
					t.Fatalf("the store counts %v after peeks, want %v", got, stored)
				}
			}
		})
	}
}

// TestPeekAgreesWithHit checks Peek's verdict and wait against what hits
// then do, and against the handler's arithmetic (Sample.Until).
func TestPeekAgreesWithHit(t *testing.T) {
	ns := start(t, caddy.NewUsagePool(), `{}`).ns("default")
	ctx := context.Background()
	limits := []Limit{{Size: time.Minute, Max: 5}, {Size: time.Hour, Max: 7}}
	awayFromMinuteEnds()
	out := make([]window.Sample, 2)
	for range 3 {
		ns.Hit(ctx, "k", limits, 1, false, false, out)
	}
	if r, wait := ns.Peek(ctx, "k", limits, 1, false, out); r != -1 || wait != 0 {
		t.Fatalf("peek at 3 of 5: rejected %d, wait %v; want -1 and 0", r, wait)
	}
	if out[0].Current != 3 || out[1].Current != 3 {
		t.Fatalf("peek samples %+v, want the counts 3 and 3", out)
	}
	// A hit of 3 would take the minute to 6 of 5.
	r, wait := ns.Peek(ctx, "k", limits, 3, false, out)
	now := time.Now()
	if r != 0 {
		t.Fatalf("peek of a hit of 3 at 3 of 5: rejected %d, want 0", r)
	}
	// The 3 hits must fade to 2 in the next minute: a third of it on.
	left := time.Duration(out[0].Start) + time.Minute - time.Duration(now.UnixNano())
	if want := left + 20*time.Second; wait < want-100*time.Millisecond || wait > want+100*time.Millisecond {
		t.Fatalf("wait %v, want about %v", wait, want)
	}
	if got := ns.Hit(ctx, "k", limits, 3, false, true, out); got != 0 {
		t.Fatalf("the hit Peek said the 1m limit rejects: rejected %d", got)
	}
	// Fixed: the minute's end. Both limits reject; the hour's wait (to its
	// end) is the longer.
	for range 2 {
		ns.Hit(ctx, "k", limits, 1, true, false, out)
	}
	r, wait = ns.Peek(ctx, "k", limits, 3, true, out)
	now = time.Now()
	hourLeft := time.Duration(out[1].Start) + time.Hour - time.Duration(now.UnixNano())
	if r != 0 || wait < hourLeft-100*time.Millisecond || wait > hourLeft+100*time.Millisecond {
		t.Fatalf("fixed peek at 5 of 5 and 5 of 7: rejected %d, wait %v; want 0 and about %v", r, wait, hourLeft)
	}
	want := max(out[0].Until(limits[0].Max-3, now.UnixNano(), true), out[1].Until(limits[1].Max-3, now.UnixNano(), true))
	if d := wait - want; d < -100*time.Millisecond || d > 100*time.Millisecond {
		t.Fatalf("wait %v, Sample.Until gives %v", wait, want)
	}
}

// TestResetOnANode resets a key at its limit: it is admitted at once, the
// diffs this node had not pushed never reach the store, and the store's
// counts are zero.
func TestResetOnANode(t *testing.T) {
	t.Run("local", func(t *testing.T) {
		ns := start(t, caddy.NewUsagePool(), `{}`).ns("default")
		ctx := context.Background()
		limits := []Limit{{Size: time.Minute, Max: 2}}
		out := make([]window.Sample, 1)
		for range 3 {
			ns.Hit(ctx, "k", limits, 1, false, false, out)
		}
		if err := ns.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if got := ns.Hit(ctx, "k", limits, 1, false, false, out); got != -1 || out[0].Current != 1 {
			t.Fatalf("after the reset: rejected %d, count %v; want -1 and 1", got, out[0].Current)
		}
	})
	t.Run("periodic", func(t *testing.T) {
		s := memoryStore(t)
		ns := start(t, caddy.NewUsagePool(), s.config("1h", "1m", "1h")).ns("api")
		ctx := context.Background()
		for range 4 {
			ns.Increment(ctx, "k", time.Hour, 1)
			ns.Increment(ctx, "other", time.Hour, 1)
		}
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		ns.Increment(ctx, "k", time.Hour, 2) // pending
		ns.Increment(ctx, "k", 2*time.Hour, 1)
		if err := ns.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		for _, size := range []time.Duration{time.Minute, time.Hour, 2 * time.Hour} {
			if got := s.total(t, "k", size); got != 0 {
				t.Fatalf("the store counts %v in the %v window after the reset", got, size)
			}
			if got := ns.SlidingWindow("k", size, nil); got.Current != 0 || got.Previous != 0 {
				t.Fatalf("the node counts %+v after the reset", got)
			}
		}
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.total(t, "k", time.Hour); got != 0 {
			t.Fatalf("the store counts %v after a sync that followed the reset: a diff from before it was pushed", got)
		}
		if got := s.total(t, "other", time.Hour); got != 4 {
			t.Fatalf("the store counts %v for another key, want 4", got)
		}
		ns.Increment(ctx, "k", time.Hour, 3)
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := s.total(t, "k", time.Hour); got != 3 {
			t.Fatalf("the store counts %v after 3 hits that followed the reset", got)
		}
	})
}

// TestResetDropsTheKeyFromRetries: a reset takes the key's diffs out of a
// batch whose push failed and out of synchronous hits queued for a retry;
// the rest of them is still pushed, under the same IDs. In synchronous
// mode, where hits add the diffs in flight to the store's counts, those of
// the key are gone too.
func TestResetDropsTheKeyFromRetries(t *testing.T) {
	for _, syncRate := range []string{"1h", "0"} {
		t.Run("sync_rate "+syncRate, func(t *testing.T) {
			s := memoryStore(t)
			ns := start(t, caddy.NewUsagePool(), s.config(syncRate, "1h")).ns("api")
			ctx := context.Background()
			start := window.Start(time.Now().UnixNano(), time.Hour)
			diff := func(key string, v float64) window.Diff {
				return window.Diff{Key: key, Size: time.Hour, Start: start, Value: v}
			}
			box := ns.runner.outbox
			if err := ns.runner.lock.lock(ctx, ns.name); err != nil {
				t.Fatal(err)
			}
			box.setFailed([]strategy.Batch{{ID: "failed-push", Namespace: "api", Diffs: []window.Diff{diff("k", 2), diff("other", 1), diff("k", 1)}}})
			box.retry(strategy.Batch{ID: "failed-hit-1", Namespace: "api", Diffs: []window.Diff{diff("k", 1)}})
			box.retry(strategy.Batch{ID: "failed-hit-2", Namespace: "api", Diffs: []window.Diff{diff("other", 5)}})
			if syncRate == "0" {
				box.inflight.set(box.pending())
			}
			ns.runner.lock.unlock()

			if err := ns.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if syncRate == "0" {
				// The loop retries every second, and may have pushed
				// before the reset: only what is in flight is certain.
				v := box.view()
				got := v.of("k", time.Hour, start)
				v.close()
				if got != 0 {
					t.Fatalf("in flight for k after the reset: %v, want 0", got)
				}
			} else {
				if err := ns.runner.lock.lock(ctx, ns.name); err != nil {
					t.Fatal(err)
				}
				pending, retries := box.failed, box.retries
				ns.runner.lock.unlock()
				if len(pending) != 1 || pending[0].ID != "failed-push" || !slices.Equal(pending[0].Diffs, []window.Diff{diff("other", 1)}) {
					t.Fatalf("the failed batch after the reset: %+v, want failed-push with other's diff only", pending)
				}
				if len(retries) != 1 || retries[0].ID != "failed-hit-2" {
					t.Fatalf("the queued hits after the reset: %+v, want failed-hit-2 only", retries)
				}
			}
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if k, other := s.total(t, "k", time.Hour), s.total(t, "other", time.Hour); k != 0 || other != 6 {
				t.Fatalf("the store counts %v for k and %v for other; want 0 and 6", k, other)
			}
		})
	}
}

// TestResetRacesWithHits resets a key over and over while goroutines hit
// it, peek at it and sync every millisecond, on each kind of store, under
// the race detector: nothing panics, the node and the store agree, every
// hit that ended before the last reset began is erased, and every hit
// that began after it ended counts, once.
func TestResetRacesWithHits(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		ns := start(t, caddy.NewUsagePool(), s.config("1ms", "1h")).ns("api")
		ctx := context.Background()
		limits := []Limit{{Size: time.Hour, Max: 1e9}}
		var started, done atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				out := make([]window.Sample, 1)
				for {
					select {
					case <-stop:
						return
					default:
					}
					started.Add(1)
					ns.Hit(ctx, "k", limits, 1, false, false, out)
					done.Add(1)
					ns.Peek(ctx, "k", limits, 1, false, out)
				}
			})
		}
		var before, after int64 // hits ended before the last reset, begun by its end
		resets := 0
		for end := time.Now().Add(time.Second); time.Now().Before(end); {
			time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // not a wait: resets at random moments of the hits
			b := done.Load()
			if err := ns.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			before, after = b, started.Load()
			resets++
		}
		// Hits after the last reset, and syncs.
		poll.Until(t, 10*time.Second, "hits after the last reset", func() bool { return started.Load() > after+100 })
		awaitRuns(t, "api", 2)
		close(stop)
		wg.Wait()
		if err := ns.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		hits := done.Load()
		local := ns.SlidingWindow("k", time.Hour, nil)
		stored := s.total(t, "k", time.Hour)
		t.Logf("%d hits, %d resets; %d hits began after the last reset; the store counts %v", hits, resets, hits-after, stored)
		if node := local.Current + local.Previous; node != stored {
			t.Fatalf("the node counts %v and the store %v", node, stored)
		}
		if stored > float64(hits-before) || stored < float64(hits-after) {
			t.Fatalf("the store counts %v: want between %d (hits begun after the last reset) and %d (hits not ended before it)",
				stored, hits-after, hits-before)
		}
	})
}

// TestResetWaitsForAPushInFlight holds a push of a key's diffs in the
// middle of a sync: a reset waits for it, so the pushed hits, which came
// before the reset, are erased with it; a reset whose context ends first
// resets nothing.
func TestResetWaitsForAPushInFlight(t *testing.T) {
	name := fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
	ns := start(t, caddy.NewUsagePool(), fmt.Sprintf(
		`{"namespaces": {"api": {"sync_rate": "1h", "window_sizes": ["1h"], "strategy": {"module": "test_gated", "name": %q}}}}`, name)).ns("api")
	store := gatedStoreOf(name)
	ctx := context.Background()
	stored := func() float64 {
		counts, err := store.GetCounters(ctx, "api", []string{"k"}, []time.Duration{time.Hour}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, c := range counts {
			sum += c.Value
		}
		return sum
	}
	for range 5 {
		ns.Increment(ctx, "k", time.Hour, 1)
	}
	store.hold.Store(true)
	synced := make(chan error, 1)
	go func() { synced <- ns.Sync(ctx) }()
	<-store.entered // the 5 hits are on their way

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := ns.Reset(short, "k")
	cancel()
	if err == nil || !strings.Contains(err.Error(), "nothing was reset") {
		t.Fatalf("a reset that could not wait for the push: %v, want an error saying nothing was reset", err)
	}
	if got := both(ns.SlidingWindow("k", time.Hour, nil)); got != 5 {
		t.Fatalf("the node counts %v after a reset that gave up, want 5", got)
	}

	reset := make(chan error, 1)
	go func() { reset <- ns.Reset(ctx, "k") }()
	select {
	case err := <-reset:
		t.Fatalf("the reset returned (%v) while a push of the key was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	store.hold.Store(false)
	store.release <- struct{}{}
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if err := <-reset; err != nil {
		t.Fatal(err)
	}
	if got := stored(); got != 0 {
		t.Fatalf("the store counts %v after the reset, want 0: a push from before it landed after it", got)
	}
	if got := both(ns.SlidingWindow("k", time.Hour, nil)); got != 0 {
		t.Fatalf("the node counts %v after the reset, want 0", got)
	}
}

// TestPeekInSynchronousModeAsksTheStore: in synchronous mode the store
// decides every hit, so a node peeks at the store's counts, which hold
// the hits of the other nodes, in a round trip of its hit queue.
func TestPeekInSynchronousModeAsksTheStore(t *testing.T) {
	s := memoryStore(t)
	a := start(t, caddy.NewUsagePool(), s.config("0", "1h")).ns("api")
	b := start(t, caddy.NewUsagePool(), s.config("0", "1h")).ns("api")
	reads := &readCounter{BatchHitter: b.road.store.BatchHitter}
	b.road.store.BatchHitter = reads
	ctx := context.Background()
	awayFromMinuteEnds()
	limits := []Limit{{Size: time.Hour, Max: 4}}
	out := make([]window.Sample, 1)
	for range 4 {
		a.Hit(ctx, "k", limits, 1, false, false, out)
	}
	r, wait := b.Peek(ctx, "k", limits, 1, false, out)
	if r != 0 || wait <= 0 || out[0].Current != 4 {
		t.Fatalf("node b peeks at a key node a hit 4 times: rejected %d, wait %v, %+v; want 0, a wait, and the count 4", r, wait, out[0])
	}
	if got := reads.n.Load(); got != 1 {
		t.Fatalf("the peek read the store %d times in the hit queue's round trips, want 1", got)
	}
	if got := b.SlidingWindow("k", time.Hour, nil).Current; got != 0 {
		t.Fatalf("node b's own count is %v: the peek must not have come from it", got)
	}
}
