package syncapp

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	_ "github.com/ratesync/caddy-ratelimit/strategy/postgres"
)

// fleetStore is a real store server that a test owns, shared by the nodes
// of a fleet: the same tests run on every kind of store.
type fleetStore struct {
	// strategy is the JSON of the strategy that reaches the server.
	strategy string
	// down and up take the server away and bring it back, data kept.
	down, up func()
}

// fleetStores starts one server of each kind of store.
func fleetStores(t *testing.T) map[string]func(t *testing.T) fleetStore {
	return map[string]func(t *testing.T) fleetStore{
		"redis": func(t *testing.T) fleetStore {
			srv := redistest.Start(t)
			return fleetStore{
				strategy: fmt.Sprintf(`{"module": "redis", "addresses": [%q]}`, srv.Addr),
				down:     srv.Pause,
				up:       srv.Resume,
			}
		},
		"postgres": func(t *testing.T) fleetStore {
			srv := pgtest.Start(t)
			return fleetStore{
				strategy: fmt.Sprintf(`{"module": "postgres", "dsn": %q}`, srv.CreateDB(t, "rl")),
				down:     srv.Stop,
				up:       srv.Start,
			}
		},
	}
}

// config is the app config of one namespace "api" on the store.
func (s fleetStore) config(syncRate string, windows ...string) string {
	sizes, _ := json.Marshal(windows)
	return fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": %q, "window_sizes": %s, "strategy": %s}}}`,
		syncRate, sizes, s.strategy)
}

// total reads the store's counts of key's current and previous windows of
// the given size in namespace api, through a store of its own.
func (s fleetStore) total(t *testing.T, key string, size time.Duration) float64 {
	t.Helper()
	return s.totalAt(t, key, size, time.Now())
}

// open opens a store of its own on the server, closed when the test
// ends.
func (s fleetStore) open(t *testing.T) strategy.Store {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	var mod struct {
		Raw json.RawMessage `json:"strategy" caddy:"namespace=rate_limit.strategies inline_key=module"`
	}
	mod.Raw = json.RawMessage(s.strategy)
	m, err := ctx.LoadModule(&mod, "Raw")
	if err != nil {
		t.Fatal(err)
	}
	store, err := m.(strategy.Strategy).OpenStore()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// totalAt is total with the windows that hold at.
func (s fleetStore) totalAt(t *testing.T, key string, size time.Duration, at time.Time) float64 {
	t.Helper()
	store := s.open(t)
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	counts, err := store.GetCounters(rctx, "api", []string{key}, []time.Duration{size}, at)
	if err != nil {
		t.Fatalf("reading the store: %v", err)
	}
	sum := 0.0
	for _, c := range counts {
		sum += c.Value
	}
	return sum
}

// eachStore runs a test once per kind of store.
func eachStore(t *testing.T, test func(t *testing.T, s fleetStore)) {
	for name, start := range fleetStores(t) {
		t.Run(name, func(t *testing.T) { test(t, start(t)) })
	}
}

// synchronousNodes starts n nodes of namespace api at sync_rate 0 on the
// store, each connected and using it. Their hits never see the store
// stalled: the fleet is exact only while the store answers, and a loaded
// machine can hold a round trip past stallAfter (hitqueue_test.go checks
// stalls).
func synchronousNodes(t *testing.T, s fleetStore, n int) []*Namespace {
	cfg := s.config("0", "1h")
	var nodes []*Namespace
	for range n {
		ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
		neverStall(ns.road.hits)
		ns.Increment(context.Background(), "warm-up", time.Hour, 1) // connect first
		poll.Until(t, 5*time.Second, "the store to be in use", func() bool { return !ns.health.down() })
		nodes = append(nodes, ns)
	}
	return nodes
}

// TestFleetSynchronousAdmitsExactlyTheLimit hits one key concurrently
// through three nodes in synchronous mode: exactly the limit is admitted,
// and the store counts every try once.
func TestFleetSynchronousAdmitsExactlyTheLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := synchronousNodes(t, s, 3)
		const limit, tries, workers = 200, 450, 15
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := range workers {
			wg.Go(func() {
				ns := nodes[g%3]
				for range tries / workers {
					// The store's count of both windows, this hit
					// included: the hour may end during the test.
					if both(ns.Increment(context.Background(), "k", time.Hour, 1)) <= limit {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if admitted.Load() != limit {
			t.Fatalf("admitted %d of %d, want exactly %d", admitted.Load(), tries, limit)
		}
		if got := s.total(t, "k", time.Hour); got != tries {
			t.Fatalf("store holds %v, want %d", got, tries)
		}
	})
}

// TestFleetConvergesWithinTwoIntervals runs two nodes at sync_rate 100ms:
// each sees the other's hits within two sync intervals.
func TestFleetConvergesWithinTwoIntervals(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		const interval = 100 * time.Millisecond
		cfg := s.config(interval.String(), "1h")
		a := start(t, caddy.NewUsagePool(), cfg).ns("api")
		b := start(t, caddy.NewUsagePool(), cfg).ns("api")
		ctx := context.Background()
		for _, ns := range []*Namespace{a, b} { // connect first
			ns.Increment(ctx, "warm-up", time.Hour, 1)
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for range 30 {
			a.Increment(ctx, "client", time.Hour, 1)
		}
		for range 20 {
			b.Increment(ctx, "client", time.Hour, 1)
		}
		stopped := time.Now()
		// Both windows: the hour may end during the test.
		seen := func(ns *Namespace) float64 { return both(ns.SlidingWindow("client", time.Hour, nil)) }
		poll.Until(t, 10*time.Second, "both nodes to see 50 hits", func() bool {
			return seen(a) == 50 && seen(b) == 50
		})
		took := time.Since(stopped)
		t.Logf("converged in %v (sync_rate %v)", took, interval)
		// Two intervals, with room for a loaded machine's scheduler.
		if took > 2*interval+200*time.Millisecond {
			t.Errorf("converged in %v, want within two sync intervals (%v)", took, 2*interval)
		}
		if got := s.total(t, "client", time.Hour); got != 50 {
			t.Errorf("store holds %v, want 50", got)
		}
	})
}

// TestFleetFetchesASparseKey runs two nodes at sync_rate 10ms: a key that
// one node saw once stays fetched for 100ms of runs, so the node sees the
// other's later hits of it without a request of its own, and after that
// it is no longer fetched.
func TestFleetFetchesASparseKey(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		cfg := s.config("10ms", "1h")
		a := start(t, caddy.NewUsagePool(), cfg).ns("api")
		b := start(t, caddy.NewUsagePool(), cfg).ns("api")
		ctx := context.Background()
		runs := fetchRuns(10 * time.Millisecond)
		if runs != 10 {
			t.Fatalf("a key is fetched by %d runs at sync_rate 10ms, want 10", runs)
		}
		// withRunLock holds a's loop between runs.
		withRunLock := func(f func(f *fetchSet)) {
			if err := a.runner.lock.lock(ctx, a.name); err != nil {
				t.Fatal(err)
			}
			defer a.runner.lock.unlock()
			a.runner.fetched.mu.Lock()
			defer a.runner.fetched.mu.Unlock()
			f(a.runner.fetched)
		}
		for _, ns := range []*Namespace{a, b} { // connect first
			ns.Increment(ctx, "warm-up", time.Hour, 1)
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// a hits the key and pushes it, and five runs pass, more than the
		// two that fetch a busy key: b's hits still reach a. Under the run
		// lock, so that a's loop runs neither in between nor after the
		// push and before the count of runs is set.
		if err := a.runner.lock.lock(ctx, a.name); err != nil {
			t.Fatal(err)
		}
		a.Increment(ctx, "sparse", time.Hour, 1)
		if _, err := a.runner.pushPending(ctx); err != nil {
			t.Fatal(err)
		}
		a.runner.lock.unlock()
		withRunLock(func(f *fetchSet) {
			touched, ok := f.touched["sparse"]
			if !ok {
				t.Fatal("a does not fetch the key it hit")
			}
			f.fetches = touched + 5
		})
		for range 5 {
			b.Increment(ctx, "sparse", time.Hour, 1)
		}
		if err := b.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		poll.Until(t, 10*time.Second, "a to see b's hits of the key", func() bool {
			return both(a.SlidingWindow("sparse", time.Hour, nil)) == 6 // the hour may end meanwhile
		})
		// Once runs fetches passed, a fetches it no more.
		withRunLock(func(f *fetchSet) { f.fetches = f.touched["sparse"] + runs })
		a.Increment(ctx, "other", time.Hour, 1) // a key to fetch, so that a fetches
		poll.Until(t, 10*time.Second, "a to drop the key from its fetches", func() (gone bool) {
			withRunLock(func(f *fetchSet) { _, kept := f.touched["sparse"]; gone = !kept })
			return gone
		})
	})
}

// TestFleetOutageLosesNothing takes the store away while two nodes hit
// on, until a sync run of each failed, then brings it back: the store ends
// up with every hit, once.
func TestFleetOutageLosesNothing(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		cfg := s.config("50ms", "1h")
		nodes := []*Namespace{
			start(t, caddy.NewUsagePool(), cfg).ns("api"),
			start(t, caddy.NewUsagePool(), cfg).ns("api"),
		}
		ctx := context.Background()
		hits := 0
		hit := func(n int) {
			for i := range n {
				nodes[i%2].Increment(ctx, "k"+strconv.Itoa(i%7), time.Hour, 1)
				hits++
			}
		}
		total := func() float64 {
			sum := 0.0
			for i := range 7 {
				sum += s.total(t, "k"+strconv.Itoa(i), time.Hour)
			}
			return sum
		}
		hit(100)
		poll.Until(t, 10*time.Second, "the store to hold the first 100 hits", func() bool { return total() == 100 })
		// The store stays away, while the nodes hit on, until a run of each
		// node failed (a paused Redis takes a run's timeout, 5 s).
		s.down()
		awaitFailedRuns(t, 1, func() { hit(3) }, nodes...)
		s.up()
		hit(50)
		poll.Until(t, 40*time.Second, fmt.Sprintf("the store to hold all %d hits", hits), func() bool {
			return total() == float64(hits)
		})
		moreRuns(t, nodes...)
		if got := total(); got != float64(hits) {
			t.Fatalf("store holds %v, want %d: a hit was pushed twice", got, hits)
		}
	})
}
