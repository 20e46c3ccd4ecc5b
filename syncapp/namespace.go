package syncapp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// hitTimeout bounds one synchronous hit when the caller's context has no
// earlier deadline; past it the hit counts locally.
const hitTimeout = time.Second

// Namespace is a namespace of one loaded config: what handlers and other
// modules count with. Its methods are the Go form of Kong's library
// functions (increment, sliding_window, sync, fetch), plus Hit, which
// checks one hit against several limits the way the handler does. It is
// safe for concurrent use.
type Namespace struct {
	name     string
	mode     Mode
	rate     time.Duration
	counters *window.Namespace
	store    strategy.Strategy
	syncer   *syncer

	sizesMu sync.Mutex
	sizes   []time.Duration
}

// Limit is one limit a hit is checked against.
type Limit struct {
	// Size is the window size.
	Size time.Duration
	// Max is the most the window's rate may be after a hit; past it the hit
	// is rejected. math.Inf(1) never rejects.
	Max float64
}

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
// decides on its own counts. If the request surely never reached the store,
// the hit counts locally and is pushed later. If it failed after it may
// have been applied, it counts locally and is pushed later under its own
// ID, which the store recorded if it applied the hit, so it is counted
// once either way. After a failure, hits count locally without trying the
// store for a second, so that an unreachable store does not slow every
// request. ctx bounds the round trip.
func (n *Namespace) Hit(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample) int {
	if n.mode == Synchronous && !n.syncer.storeDown() {
		if rejected, ok := n.hitStore(ctx, key, limits, value, fixed, undo, out); ok {
			return rejected
		}
	}
	return n.hitLocal(key, limits, value, fixed, undo, false, out)
}

// hitLocal is Hit on local counts. With synced, the increments count as the
// store's, never to be pushed.
func (n *Namespace) hitLocal(key string, limits []Limit, value float64, fixed, undo, synced bool, out []window.Sample) int {
	add := n.counters.Increment
	if synced {
		add = n.counters.IncrementSynced
	}
	rejected := -1
	for i, l := range limits {
		if rejected >= 0 {
			out[i] = n.counters.Read(key, l.Size)
			continue
		}
		out[i] = add(key, l.Size, value)
		if out[i].Rate(fixed) > l.Max {
			rejected = i
		}
	}
	if rejected >= 0 && undo {
		for i := 0; i <= rejected; i++ {
			out[i] = add(key, limits[i].Size, -value)
		}
	}
	return rejected
}

// hitStore is Hit in one round trip to the store. It reports false when
// the hit must be counted locally as a pending diff instead.
func (n *Namespace) hitStore(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample) (int, bool) {
	now := window.SystemClock()
	windows := make([]strategy.WindowHit, len(limits))
	for i, l := range limits {
		windows[i] = strategy.WindowHit{Size: l.Size, Start: window.Start(now, l.Size), Value: value, Max: l.Max}
		if !fixed {
			windows[i].Weight = window.Weight(now, l.Size)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, hitTimeout)
	defer cancel()
	id := newBatchID()
	counts, rejected, err := n.store.Hit(ctx, n.name, key, id, windows, undo)
	switch {
	case err == nil:
	case errors.Is(err, strategy.ErrRejected):
		return 0, false // the store is fine; the windows are not
	case errors.Is(err, strategy.ErrNotSent):
		n.syncer.failed(n, err)
		return 0, false
	default:
		// The store may have applied the hit. Count it here as the store's,
		// and push it later under the hit's ID, which the store skips if
		// it did.
		n.syncer.failed(n, err)
		rejected := n.hitLocal(key, limits, value, fixed, undo, true, out)
		n.syncer.retryHit(n.name, id, key, windows, rejected, undo)
		return rejected, true
	}
	n.syncer.succeeded()
	for i, w := range windows {
		// Diffs on their way to the store are not in its counts yet.
		cur := counts[i].Current + n.syncer.inflightFor(key, w.Size, w.Start)
		prev := counts[i].Previous + n.syncer.inflightFor(key, w.Size, w.Start-int64(w.Size))
		out[i] = n.counters.Observe(key, w.Size, w.Start, cur, prev)
	}
	return rejected, true
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
	return n.syncer.run(ctx, n, true)
}

// Fetch sets the local counts of the given keys, for every window size of
// the namespace, to the store's. It waits for a sync run in progress, whose
// diffs would otherwise be missing from the store's counts.
func (n *Namespace) Fetch(ctx context.Context, keys []string) error {
	if n.store == nil || len(keys) == 0 {
		return nil
	}
	if err := n.syncer.lockRun(ctx); err != nil {
		return err
	}
	defer n.syncer.unlockRun()
	counts, err := n.store.GetCounters(ctx, n.name, keys, n.WindowSizes(), time.Now())
	if err != nil {
		return err
	}
	n.counters.Apply(counts)
	return nil
}

// AddWindowSizes merges window sizes into the namespace's: handlers call it
// when they are provisioned, so that the sizes their limits use are the
// ones synced. A namespace that syncs with a store needs whole
// milliseconds, the precision stores keep.
func (n *Namespace) AddWindowSizes(sizes ...time.Duration) error {
	n.sizesMu.Lock()
	defer n.sizesMu.Unlock()
	for _, s := range sizes {
		if err := window.ValidateSize(s); err != nil {
			return err
		}
		if n.mode != Local && s%time.Millisecond != 0 {
			return fmt.Errorf("window %v: namespace %q syncs with a store, which keeps windows in whole milliseconds", s, n.name)
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

// runTimeout bounds one sync run of the loop: two sync intervals, within
// [minRunTimeout, maxRunTimeout], so a hung store cannot hold up the
// namespace's Sync and Fetch calls and stop flushes for long.
func (n *Namespace) runTimeout() time.Duration {
	return min(max(minRunTimeout, 2*n.rate), maxRunTimeout)
}
