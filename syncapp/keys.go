package syncapp

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// Operating on one key: Peek looks at what a hit would do without counting
// it, Reset erases a key's counts on this node and in the store. The admin
// API (admin.go) is built on them.

// Peek is a hit that counts nothing (@o1s/rate-limiter's count 0): it
// reads key's window of every limit into out, which must be as long as
// limits, and reports what a hit of value would meet. It returns the index
// of the first limit, in the order given (ascending windows, as for Hit),
// whose rate would exceed its Max after the hit, or -1 when the hit would
// be admitted; and wait, how long until a hit of value is admitted under
// every limit if no more hits come: 0 when it would be admitted now. The
// wait is window.Sample.Until's, the computation behind the handler's
// Retry-After, with target Max - value. A hit heavier than a limit's Max
// is never admitted; its wait is until both of that limit's windows are
// empty.
//
// In local and periodic mode Peek reads this node's counts, as Hit decides
// on them. In synchronous mode, where the store decides every hit, it
// reads the store's counts (a hit of the hit queue that counts nothing,
// in the round trip of the hits beside it), plus this node's diffs on
// their way to the store; if the store cannot answer, it reads this
// node's counts, as Hit falls back to them. With sync_above, a key near a
// limit as Hit sees it (this node's counts after value at sync_above of
// the limit or more, or marked by the store's feed) is read from the
// store the same way, and the node keeps the store's counts of it.
//
// Peek never changes a count, nor adds a key to the zone. When it reads
// this node's counts it marks the key as used, as any read does, which
// keeps it from eviction and has the next sync fetch its counts.
func (n *Namespace) Peek(ctx context.Context, key string, limits []Limit, value float64, fixed bool, out []window.Sample) (rejected int, wait time.Duration) {
	now := n.counters.Now()
	// fromStore reads key's counts from the store into out (observe: as
	// refresh's, see storeRoad.read), and reports whether it could.
	fromStore := func(observe bool) bool {
		sizes := make([]time.Duration, len(limits))
		for i, l := range limits {
			sizes[i] = l.Size
		}
		samples, ok := n.road.read(ctx, key, sizes, now, observe)
		if ok {
			copy(out, samples)
		}
		return ok
	}
	// Synchronous mode has a road: the store takes synchronous hits.
	if n.mode != Synchronous || n.health.downFor(key) || !fromStore(false) {
		for i, l := range limits {
			out[i] = n.counters.Read(key, l.Size)
		}
		// So does a periodic one with sync_above. Observed, the store's
		// counts replace this node's, as refresh's do.
		if n.syncAbove > 0 && !n.health.downFor(key) && n.peekNear(ctx, key, limits, value, fixed, out) {
			fromStore(true)
		}
	}
	rejected = -1
	for i, l := range limits {
		after := out[i]
		after.Current += value
		if after.Rate(fixed) <= l.Max {
			continue
		}
		if rejected < 0 {
			rejected = i
		}
		wait = max(wait, out[i].Until(l.Max-value, now, fixed))
	}
	return rejected, wait
}

// peekNear reports whether a Peek of key in a periodic namespace with
// sync_above asks the store, as Hit would: when the key is marked near a
// limit by the store's feed, or when a hit of value would bring this
// node's count of some limit to sync_above of it or more.
func (n *Namespace) peekNear(ctx context.Context, key string, limits []Limit, value float64, fixed bool, local []window.Sample) bool {
	if n.periodic.blind(ctx, key) {
		return true
	}
	for i, l := range limits {
		after := local[i]
		after.Current += value
		if after.Rate(fixed) >= n.syncAbove*l.Max {
			return true
		}
	}
	return false
}

// Reset erases key's counts: its Kong counterpart is an increment by minus
// the count. On this node every window of the key, current and previous,
// is zeroed and the key's diffs that wait to be pushed are dropped, so that
// nothing counted before the reset is pushed after it. Then, when the
// namespace has a store, the store's Reset zeroes the key's windows of the
// namespace's sizes (and of any other size this node held for the key)
// in the store. Other nodes take the reset at their next sync, for the
// keys they fetch: those touched since their last sync or the one before,
// which a key that clients keep trying always is. What another node
// counted and had not pushed yet at the time of the reset (at most one
// sync_rate of its hits) is pushed after the reset, and counts.
//
// A reset also lifts the key's ban (see Ban): on this node, and in a store
// that holds bans, whose other nodes drop it at their next sync.
//
// The reset waits for a sync run of the namespace in progress, so that it
// never falls between a push and what the push took. ctx bounds that wait
// and the store's round trip; if the wait ends first, nothing is reset.
// An error from the store means the key was reset on this node but maybe
// not in the store, whose counts the next sync then brings back: reset
// again. A hit racing with the reset counts either before it (and is
// erased) or after it, never twice. In synchronous mode a hit answered by
// the store just before the store's reset may leave this node's view of
// the key stale until the key's next hit.
func (n *Namespace) Reset(ctx context.Context, key string) error { return n.runner.reset(ctx, key) }
