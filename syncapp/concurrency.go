package syncapp

import (
	"context"
	"fmt"
	"math"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
)

// Acquire takes a place for one request of key among at most max in
// flight at once, and reports whether it got one. The caller calls
// release, once, when the request ends (not when ok is false).
//
// In a local namespace, or one whose store cannot hold slots, the
// requests are counted on this node. Otherwise the place is a slot in
// the store, shared by the fleet: one hit of the round trips that carry
// the requests' synchronous hits (hitQueue, with its stall detection)
// when the store can take slots in them, or else a round trip of its
// own, bounded by ctx; the
// slot is renewed while the request runs and released off the request's
// path when it ends. When the store cannot be reached, requests are
// counted on this node, and the failure is logged as for hits; once the
// store answers again, the requests admitted so that still run take slots
// in it, whatever the number held, so that the fleet's cap counts them.
func (n *Namespace) Acquire(ctx context.Context, key string, max int) (release func(), ok bool) {
	if n.slotter != nil && !n.health.downFor(key) {
		if slot, ok, decided := n.slots.acquire(ctx, n.slotter, n.road.forSlots(), n.name, key, max); decided {
			if !ok {
				return nil, false
			}
			n.inFlight.add(key) // counted, in case the store fails
			return func() {
				n.inFlight.remove(key)
				n.slots.release(slot)
			}, true
		}
	}
	if !n.inFlight.acquire(key, n.localConcurrency(key, max)) {
		return nil, false
	}
	if n.slotter == nil {
		return func() { n.inFlight.remove(key) }, true
	}
	// Admitted while the store could not be asked: the store takes the
	// slot once it answers again, if the request still runs.
	slot := n.slots.admitLocal(n.slotter, n.name, key)
	return func() {
		n.inFlight.remove(key)
		n.slots.endLocal(slot)
	}, true
}

// CheckConcurrency returns an error, naming the store, when the namespace
// syncs with a store that cannot hold concurrency slots: its requests in
// flight could only be counted per node, which a config that shares a
// store across a fleet does not mean.
func (n *Namespace) CheckConcurrency() error {
	if n.store != nil && n.slotter == nil {
		return fmt.Errorf("namespace %q syncs with the %s store, which cannot hold concurrency slots", n.name, n.storeModule)
	}
	return nil
}

// LimitsConcurrencyAcrossNodes reports whether Acquire counts requests in
// the store, across the fleet, rather than on this node.
func (n *Namespace) LimitsConcurrencyAcrossNodes() bool { return n.slotter != nil }

// inFlight counts the requests in flight per key on this node. It holds a
// key only while the key has requests in flight.
type inFlight struct {
	mu lockorder.Mutex[inFlightLock]
	n  map[string]int
}

// acquire counts one more request of key, unless max are in flight.
func (f *inFlight) acquire(key string, max int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key] >= max {
		return false
	}
	if f.n == nil {
		f.n = make(map[string]int)
	}
	f.n[key]++
	return true
}

// add counts one more request of key, whatever the number in flight.
func (f *inFlight) add(key string) { f.acquire(key, math.MaxInt) }

// remove counts one request of key less.
func (f *inFlight) remove(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[key] <= 1 {
		delete(f.n, key)
		return
	}
	f.n[key]--
}

// keys returns how many keys have requests in flight.
func (f *inFlight) keys() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.n)
}
