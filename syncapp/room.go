package syncapp

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// HitIfRoom is Hit for a request that may wait for its turn (max_delay):
// it counts the hit only when every limit has room for it, and otherwise
// counts nothing and returns the index of the first limit without room and
// how long until the hit may fit if no other hit comes (negative: never).
//
// In local and periodic namespaces the node's counts decide, as
// window.Namespace.HitIfRoom does: no span of one window length ever
// holds more than a limit of the hits this node counts, and the store's
// counts are taken as late as they can be. Where the store decides
// (synchronous, or sync_above), it is a Hit that counts nothing when
// rejected, and the wait is when the store's rate (sliding or fixed)
// admits the hit, as Retry-After says.
func (n *Namespace) HitIfRoom(ctx context.Context, key string, limits []Limit, value float64, fixed bool, out []window.Sample) (rejected int, wait time.Duration) {
	switch {
	case n.mode == Local:
		return n.counters.HitIfRoom(key, limits, value, out)
	case n.mode == Periodic && n.syncAbove == 0:
		return n.periodic.hitIfRoom(ctx, key, limits, value, out)
	}
	if rejected = n.Hit(ctx, key, limits, value, fixed, true, out); rejected < 0 {
		return -1, 0
	}
	return rejected, roomWait(limits, value, fixed, out, n.counters.Now())
}

// roomWait returns how long until a hit of value that the store rejected
// may fit every limit, from their windows' states in out, if no other hit
// comes: when the store's rate (sliding or fixed) admits it, as
// Retry-After says; negative when it never fits.
func roomWait(limits []Limit, value float64, fixed bool, out []window.Sample, now int64) time.Duration {
	var wait time.Duration
	for i, l := range limits {
		if l.Max < value {
			return -1
		}
		wait = max(wait, out[i].Until(l.Max-value, now, fixed))
	}
	// A rounding of the rate can leave the hit just short of fitting when
	// the wait ends: the caller then waits again.
	return max(wait, time.Millisecond)
}
