package syncapp

import (
	"context"
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// hitTimeout bounds one round trip of the hit queue (whatever the
// contexts of the requests it carries), and one call of the request path
// to the store outside it (a slot; a stale key's read from a store that
// cannot take synchronous hits) when the caller's context has no earlier
// deadline; past it the request counts locally.
const hitTimeout = time.Second

// Namespace is a namespace of one loaded config: what handlers and other
// modules count with. Its methods are the Go form of Kong's library
// functions (increment, sliding_window, sync, fetch), plus Hit, which
// checks one hit against several limits the way the handler does. It is
// safe for concurrent use.
//
// A Namespace is a façade: each method picks, by the namespace's mode,
// the part that does the work, and the parts never call it back.
type Namespace struct {
	name string
	mode Mode
	rate time.Duration
	// syncAbove, unless 0, is the fraction of a limit from which a
	// periodic namespace counts a key's hits at the store.
	syncAbove float64
	// onFailure is what the node does while it cannot reach the store.
	onFailure FailurePolicy
	counters  *window.Namespace
	sizes     *windowSizes

	// The parts of the namespace's fleet state (fleetState), pooled by
	// name so that they outlive this config: each owns one piece of
	// state, with its own lock.
	health   *health
	bans     *banTable
	slots    *slotHolder
	inFlight *inFlight
	members  *fleetMembers

	// The parts that join this config's store to the fleet state: the
	// sync runs, the round trips of requests that ask the store, the
	// second look of a periodic namespace at a stale key.
	runner   *runner
	road     *storeRoad // when the store takes synchronous hits
	periodic *periodicHits

	// The store, unless the namespace is local, shared through the pool.
	store       strategy.Store
	storeHealth *storeHealth // the store's, shared by the namespaces on it
	storeModule string
	slotter     strategy.Slotter // the store, when it can hold concurrency slots
	banner      strategy.Banner  // the store, when it can hold bans
}

// Limit is one limit a hit is checked against: a window size and the most
// its rate may be after a hit.
type Limit = window.Limit

// Name returns the namespace's name.
func (n *Namespace) Name() string { return n.name }

// Mode returns how the namespace syncs with its store.
func (n *Namespace) Mode() Mode { return n.mode }

// Hit counts one hit of value against limits, in ascending window order,
// the way Kong decides: each limit's current window is incremented, then its
// rate (sliding, or the current count alone with fixed) compared with the
// limit; once one limit rejects, the windows after it are only read. With
// undo, a rejected hit's increments are taken back (disable_penalty).
//
// out receives each limit's window state after the hit and must be as long
// as limits. Hit returns the index of the limit that rejected, or -1.
//
// In synchronous mode the whole hit is one round trip to the store, which
// decides on its own counts; hits that arrive while several round trips
// are out go together in the next (hitQueue). If the request surely never
// reached the store, the hit counts locally and is pushed later. If it
// failed after it may have been applied, it counts locally and is pushed
// later under its round trip's ID, which the store recorded if it applied
// the round trip, so it is counted once either way. After a failure, or
// when the store answers nothing for stallAfter while hits wait, hits
// count locally without trying the store until a sync run finds it back,
// so that an unreachable store does not slow every request. ctx bounds
// the wait.
//
// In a periodic namespace with sync_above, a hit near a limit (see
// window.Namespace.HitUnlessNear) is synchronous in the same way, and
// carries this node's unpushed diffs of the key to the store with it, so
// that the store decides on every hit this node admitted; the others
// count locally.
func (n *Namespace) Hit(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample) int {
	switch {
	case n.syncAbove > 0:
		above := n.syncAbove
		if n.periodic.blind(ctx, key) {
			above = 0 // near a limit by the store's feed: the store decides
		}
		rejected, a := n.road.hitNear(ctx, key, limits, value, fixed, undo, above, out)
		n.periodic.decidedAtStore(key, limits, &a, out)
		return rejected
	case n.mode == Synchronous && !n.health.downFor(key):
		if rejected, _, ok := n.road.hit(ctx, key, limits, value, fixed, undo, out, nil); ok {
			return rejected
		}
	case n.mode == Periodic:
		return n.periodic.hit(ctx, key, limits, value, fixed, undo, out)
	}
	return n.counters.Hit(key, limits, value, fixed, undo, false, out)
}

// Increment adds value (fractional and negative values are allowed) to
// key's current window of the given size, and returns the window's state
// after it, from which the caller takes the sliding or fixed rate. It is
// Kong's increment; in synchronous mode it is one round trip to the store,
// with the fallbacks of Hit.
func (n *Namespace) Increment(ctx context.Context, key string, size time.Duration, value float64) window.Sample {
	if n.mode != Synchronous {
		return n.counters.Increment(key, size, value)
	}
	var out [1]window.Sample
	n.Hit(ctx, key, []Limit{{Size: size, Max: math.Inf(1)}}, value, false, false, out[:])
	return out[0]
}

// SlidingWindow returns key's window state of the given size, from local
// counts, without counting a hit. With curDiff non-nil, it replaces the
// diff this node has not pushed yet for the current window: Kong's
// sliding_window with cur_diff.
func (n *Namespace) SlidingWindow(key string, size time.Duration, curDiff *float64) window.Sample {
	if curDiff != nil {
		return n.counters.ReadWithDiff(key, size, *curDiff)
	}
	return n.counters.Read(key, size)
}

// Sync pushes the namespace's pending diffs to its store now and, in
// periodic mode, fetches the merged counts of the keys touched recently. A
// local namespace has nothing to sync.
func (n *Namespace) Sync(ctx context.Context) error {
	return n.runner.run(ctx, true)
}

// Fetch sets the local counts of the given keys, for every window size of
// the namespace, to the store's. It waits for a sync run in progress, whose
// diffs would otherwise be missing from the store's counts.
func (n *Namespace) Fetch(ctx context.Context, keys []string) error {
	return n.runner.fetch(ctx, keys)
}

// AddWindowSizes merges window sizes into the namespace's: handlers call it
// when they are provisioned, so that the sizes their limits use are the
// ones synced. A namespace that syncs with a store takes only the sizes
// its store can keep.
func (n *Namespace) AddWindowSizes(sizes ...time.Duration) error {
	return n.sizes.add(sizes...)
}

// WindowSizes returns the namespace's window sizes, ascending.
func (n *Namespace) WindowSizes() []time.Duration { return n.sizes.list() }
