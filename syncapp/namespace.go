package syncapp

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

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
type Namespace struct {
	name string
	mode Mode
	rate time.Duration
	// syncAbove, unless 0, is the fraction of a limit from which a
	// periodic namespace counts a key's hits at the store.
	syncAbove float64
	counters  *window.Namespace
	logger    *zap.Logger

	// The parts of the namespace's fleet state (fleetState), pooled by
	// name so that they outlive this config: each owns one piece of
	// state, with its own lock.
	runs     runLock
	health   *health
	outbox   *outbox
	fetched  *fetchSet
	bans     *banTable
	slots    *slotHolder
	inFlight *inFlight

	// The store, unless the namespace is local: shared through the pool
	// by storeKey; hitter is the same store when the namespace's hits are
	// answered by it (sync_rate 0, sync_above; checked at load), and road
	// the round trips of the requests that ask the store, whenever it can
	// take synchronous hits.
	store       strategy.Store
	hitter      strategy.Hitter
	road        *storeRoad
	slotter     strategy.Slotter // the store, when it can hold concurrency slots
	banner      strategy.Banner  // the store, when it can hold bans
	storeKey    poolKey
	storeModule string
	validWindow func(time.Duration) error
	// bansUsed says that a handler of this config bans in the namespace:
	// its sync runs then read the store's bans. It belongs to the config,
	// so a reload that drops the last ban handler stops the reads.
	bansUsed atomic.Bool

	sizesMu sync.Mutex
	sizes   []time.Duration
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
		return n.hitNear(ctx, key, limits, value, fixed, undo, out)
	case n.mode == Synchronous && !n.health.down():
		if rejected, ok := n.road.hit(ctx, key, limits, value, fixed, undo, out, nil); ok {
			return rejected
		}
	case n.mode == Periodic:
		return n.hitPeriodic(ctx, key, limits, value, fixed, undo, out)
	}
	return n.counters.Hit(key, limits, value, fixed, undo, false, out)
}

// hitNear is Hit in a namespace with sync_above: local unless the hit is
// near a limit.
func (n *Namespace) hitNear(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample) int {
	var buf [4]window.Unsynced
	unsynced := buf[:]
	if len(limits) > len(buf) {
		unsynced = make([]window.Unsynced, len(limits))
	}
	unsynced = unsynced[:len(limits)]
	rejected, near := n.counters.HitUnlessNear(key, limits, value, fixed, undo, n.syncAbove, out, unsynced)
	if !near {
		return rejected
	}
	if !n.health.down() {
		if rejected, ok := n.road.hit(ctx, key, limits, value, fixed, undo, out, unsynced); ok {
			return rejected
		}
	} else {
		// The store is skipped: what the near hit took goes back, and the
		// hit counts locally.
		windows := make([]strategy.WindowHit, len(limits))
		for i, l := range limits {
			windows[i] = strategy.WindowHit{Size: l.Size, Start: out[i].Start}
		}
		n.road.giveBack(key, windows, unsynced, 0, true)
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
	return n.run(ctx, true)
}

// Fetch sets the local counts of the given keys, for every window size of
// the namespace, to the store's. It waits for a sync run in progress, whose
// diffs would otherwise be missing from the store's counts.
func (n *Namespace) Fetch(ctx context.Context, keys []string) error {
	if n.store == nil || len(keys) == 0 {
		return nil
	}
	if err := n.runs.lock(ctx, n.name); err != nil {
		return err
	}
	defer n.runs.unlock()
	counts, err := n.store.GetCounters(ctx, n.name, keys, n.WindowSizes(), time.Now())
	if err != nil {
		return err
	}
	n.counters.Apply(counts)
	return nil
}

// AddWindowSizes merges window sizes into the namespace's: handlers call it
// when they are provisioned, so that the sizes their limits use are the
// ones synced. A namespace that syncs with a store takes only the sizes
// its store can keep.
func (n *Namespace) AddWindowSizes(sizes ...time.Duration) error {
	n.sizesMu.Lock()
	defer n.sizesMu.Unlock()
	for _, s := range sizes {
		if err := window.ValidateSize(s); err != nil {
			return err
		}
		if n.validWindow != nil {
			if err := n.validWindow(s); err != nil {
				return fmt.Errorf("window %v: namespace %q syncs with the %s store: %w", s, n.name, n.storeModule, err)
			}
		}
		if !slices.Contains(n.sizes, s) {
			n.sizes = append(n.sizes, s)
		}
	}
	slices.Sort(n.sizes)
	return nil
}

// WindowSizes returns the namespace's window sizes, ascending.
func (n *Namespace) WindowSizes() []time.Duration {
	n.sizesMu.Lock()
	defer n.sizesMu.Unlock()
	return slices.Clone(n.sizes)
}
