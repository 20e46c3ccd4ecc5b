package syncapp

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// TestConcurrencyLocal limits requests in flight per key on one node, and
// holds a key only while it has some.
func TestConcurrencyLocal(t *testing.T) {
	ns := start(t, caddy.NewUsagePool(), `{}`).ns(DefaultName)
	ctx := context.Background()
	var releases []func()
	for i := range 3 {
		release, ok := ns.Acquire(ctx, "k", 2)
		if ok != (i < 2) {
			t.Fatalf("request %d: ok %v, want %v", i+1, ok, i < 2)
		}
		if ok {
			releases = append(releases, release)
		}
	}
	if _, ok := ns.Acquire(ctx, "other", 2); !ok {
		t.Fatal("another key was limited")
	}
	releases[0]()
	release, ok := ns.Acquire(ctx, "k", 2)
	if !ok {
		t.Fatal("a place given back was not taken again")
	}
	release()
	releases[1]()
	ns.inFlight.remove("other")
	if n := ns.inFlight.keys(); n != 0 {
		t.Fatalf("%d keys held with nothing in flight, want 0", n)
	}
}

// acquireAll has n requests of key take a place at once, spread over the
// nodes, and returns the releases of those that got one.
func acquireAll(nodes []*Namespace, key string, max, n int) []func() {
	var mu sync.Mutex
	var got []func()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if release, ok := nodes[i%len(nodes)].Acquire(context.Background(), key, max); ok {
				mu.Lock()
				got = append(got, release)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got
}

// fleetNodes starts n nodes of namespace api on the store, connected.
func fleetNodes(t *testing.T, s fleetStore, n int) []*Namespace {
	var nodes []*Namespace
	for range n {
		ns := start(t, caddy.NewUsagePool(), s.config("100ms", "1h")).ns("api")
		if !ns.LimitsConcurrencyAcrossNodes() {
			t.Fatal("the store cannot hold concurrency slots")
		}
		neverStall(ns.road.hits)                                     // see synchronousNodes
		release, _ := ns.Acquire(context.Background(), "warm-up", 1) // connect first
		if release != nil {
			release()
		}
		nodes = append(nodes, ns)
	}
	return nodes
}

// TestFleetConcurrency has 6 requests of one key take a place at once
// through two nodes sharing a store, with max_concurrent 2: exactly 2 get
// one; another key is not limited by them; places given back are free
// again.
func TestFleetConcurrency(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := fleetNodes(t, s, 2)
		held := acquireAll(nodes, "k", 2, 6)
		if len(held) != 2 {
			t.Fatalf("%d of 6 requests got a place, want exactly 2", len(held))
		}
		if other := acquireAll(nodes, "other", 2, 2); len(other) != 2 {
			t.Fatalf("another key got %d places of 2", len(other))
		}
		for _, release := range held {
			release()
		}
		poll.Until(t, 5*time.Second, "the released places to be free", func() bool {
			again := acquireAll(nodes, "k", 2, 1)
			for _, release := range again {
				release()
			}
			return len(again) == 1
		})
	})
}

// slotHits counts the hits of a hit queue's round trips that take slots.
type slotHits struct {
	strategy.BatchHitter
	n atomic.Int64
}

func (c *slotHits) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	for _, h := range hits {
		if h.Slot != nil {
			c.n.Add(1)
		}
	}
	c.BatchHitter.HitBatch(ctx, namespace, id, hits, results)
}

// TestFleetConcurrencyInTheHitQueue: a request's slot is a hit of the
// round trips of the hit queue; and a slot whose round trip failed after
// the store took it does not keep its place: the node counts the request
// on its own, and gives the slot back.
func TestFleetConcurrencyInTheHitQueue(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		ns := fleetNodes(t, s, 1)[0]
		ctx := context.Background()
		counted := &slotHits{BatchHitter: ns.road.store.BatchHitter}
		doubt := &inDoubt{BatchHitter: counted, applied: func(int64) bool { return true }}
		ns.road.store.BatchHitter = doubt
		release, ok := ns.Acquire(ctx, "k", 1)
		if !ok {
			t.Fatal("the first request of a key got no place")
		}
		if _, again := ns.Acquire(ctx, "k", 1); again {
			t.Fatal("a second request got the key's one place")
		}
		release()
		if got := counted.n.Load(); got != 2 {
			t.Fatalf("%d slots went in the hit queue's round trips, want 2", got)
		}

		doubt.on.Store(true)
		release, ok = ns.Acquire(ctx, "k2", 1)
		doubt.on.Store(false)
		if !ok || doubt.after.Load() != 1 {
			t.Fatalf("a request whose slot's round trip was in doubt: ok %v after %d round trips applied, want counted on the node after 1", ok, doubt.after.Load())
		}
		release()
		poll.Until(t, 10*time.Second, "the slot taken in doubt to be given back", func() bool {
			probe := fmt.Sprint("probe-", time.Now().UnixNano())
			_, ok, err := ns.slotter.AcquireSlot(ctx, "api", "k2", probe, 1, time.Minute)
			if ok {
				_ = ns.slotter.ReleaseSlots(ctx, "api", []strategy.Slot{{Key: "k2", ID: probe}})
			}
			return err == nil && ok
		})
	})
}

// TestFleetConcurrencyRenewsAndFreesDeadNodes holds a slot past its lease
// while its node lives, and frees it within a lease once the node stops
// renewing it (as a node that dies does).
func TestFleetConcurrencyRenewsAndFreesDeadNodes(t *testing.T) {
	defer func(l time.Duration) { slotLease = l }(slotLease)
	slotLease = 900 * time.Millisecond
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := fleetNodes(t, s, 2)
		a, b := nodes[0], nodes[1]
		if _, ok := a.Acquire(context.Background(), "k", 1); !ok {
			t.Fatal("the first request got no place")
		}
		time.Sleep(2 * slotLease) // not a wait: the slot outlives its lease in real time, which the store's clock measures, while a renews it
		if release, ok := b.Acquire(context.Background(), "k", 1); ok {
			release()
			t.Fatalf("a slot renewed by its live node was taken after %v", 2*slotLease)
		}
		// a dies: its loop stops renewing, and nothing is released.
		died := time.Now()
		a.slots.mu.Lock()
		clear(a.slots.held)
		a.slots.mu.Unlock()
		var freed time.Duration
		poll.Until(t, 10*time.Second, "the dead node's slot to be free", func() bool {
			release, ok := b.Acquire(context.Background(), "k", 1)
			if ok {
				freed = time.Since(died)
				release()
			}
			return ok
		})
		t.Logf("the slot came back %v after its node stopped renewing it (lease %v)", freed, slotLease)
		if freed > slotLease+500*time.Millisecond {
			t.Errorf("the slot came back after %v, want within its lease of %v", freed, slotLease)
		}
	})
}

// TestFleetConcurrencyOutage counts on the node while the store is down,
// and in the store again once it is back.
func TestFleetConcurrencyOutage(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		ns := fleetNodes(t, s, 1)[0]
		s.down()
		var held []func()
		for i := range 3 {
			release, ok := ns.Acquire(context.Background(), "k", 2)
			if ok != (i < 2) {
				t.Fatalf("store down, request %d: ok %v, want %v (counted on the node)", i+1, ok, i < 2)
			}
			if ok {
				held = append(held, release)
			}
		}
		s.up()
		for _, release := range held {
			release()
		}
		poll.Until(t, 20*time.Second, "the store to hold slots again", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, ok, err := ns.slotter.AcquireSlot(ctx, "api", "probe", fmt.Sprint("probe-", time.Now().UnixNano()), 1000, time.Second)
			return err == nil && ok
		})
		var served atomic.Int32
		for range 3 {
			if release, ok := ns.Acquire(context.Background(), "k2", 2); ok {
				served.Add(1)
				defer release()
			}
		}
		if served.Load() != 2 {
			t.Fatalf("%d of 3 requests got a place once the store was back, want 2", served.Load())
		}
	})
}

// TestFleetConcurrencyAdoptsLocalRequests admits requests on a node while
// the store is down; once it is back, the store takes their slots, so
// that it gives another node none of the key's places while they run, and
// gives them again when they end.
func TestFleetConcurrencyAdoptsLocalRequests(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := fleetNodes(t, s, 2)
		a, b := nodes[0], nodes[1]
		s.down()
		var held []func()
		for range 2 {
			release, ok := a.Acquire(context.Background(), "k", 2)
			if !ok {
				t.Fatal("store down: a request was not admitted on the node")
			}
			held = append(held, release)
		}
		s.up()
		poll.Until(t, 20*time.Second, "the store to take the slots of the requests admitted locally", func() bool {
			a.slots.mu.Lock()
			defer a.slots.mu.Unlock()
			return len(a.slots.local) == 0 && len(a.slots.held) == 2
		})
		// Asked through the store itself: b's first calls after the outage
		// may meet a connection the restart broke, and a node whose call
		// fails counts on its own, by design.
		var taken bool
		poll.Until(t, 10*time.Second, "the store to answer node b", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, ok, err := b.slotter.AcquireSlot(ctx, "api", "k", "node-b-probe", 2, time.Second)
			taken = ok
			return err == nil
		})
		if taken {
			t.Fatal("the store gave another node a place while the cap's two, admitted during the outage, still run")
		}
		for _, release := range held {
			release()
		}
		poll.Until(t, 10*time.Second, "the places to be free once the requests ended", func() bool {
			release, ok := b.Acquire(context.Background(), "k", 2)
			if ok {
				release()
			}
			return ok
		})
	})
}
