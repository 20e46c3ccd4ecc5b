package syncapp

import (
	"context"
	"fmt"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// Rates: the generic cell rate algorithm (GCRA) of nginx's limit_req,
// beside the windows (see window/gcra.go). A key's state under a rate is
// one timestamp, its theoretical arrival time (TAT). In a local namespace
// the zone holds it; in a synchronous one the store decides (see
// gcraStore in gcrastore.go). A periodic namespace refuses rates at load
// (CheckRate): a TAT is not a count, and the TATs that nodes move on
// their own do not add up into the fleet's, the way window diffs do.

// Rate is a GCRA limit a request is checked against: N requests per
// Window, and Burst more at once.
type Rate = window.Rate

// RateSample is a key's state under a rate at an instant.
type RateSample = window.RateSample

// CheckRate returns an error, naming the namespace and what to do, when
// the namespace cannot decide rates: a periodic one (sync_rate above 0,
// with or without sync_above), or a synchronous one whose store cannot
// decide them.
func (n *Namespace) CheckRate() error {
	switch {
	case n.mode == Periodic:
		return fmt.Errorf("namespace %q syncs every %v: a rate (GCRA) keeps one timestamp per key, which does not add up across nodes the way window counts do; use sync_rate 0 (the store decides every request, one round trip) or a local namespace",
			n.name, time.Duration(n.rate))
	case n.mode == Synchronous && n.rateStore() == nil:
		return fmt.Errorf("namespace %q: the %s store cannot decide rates (GCRA) synchronously", n.name, n.storeModule)
	}
	return nil
}

// HitRate decides one request of cost at rate, then, if the rate admits
// it, hits limits as Hit does: the rate first, then the limits in order.
// A request the rate rejects counts in no window (the limits are only
// read into out); one a limit rejects leaves the rate's state as it was,
// the limits counting it as Hit does (undo takes it back). rs receives
// the rate's state after the request, out each limit's window.
//
// It returns whether the rate admitted the request and the index of the
// limit that rejected it, or -1. In a local namespace the zone decides,
// under one lock of the key. In a synchronous one the store decides the
// rate (see hitRateAtStore), then the limits as Hit does; when the store
// cannot be reached, the zone decides both, as Hit falls back to local
// counts. A periodic namespace, which a handler refuses (CheckRate),
// decides on this node's state alone.
func (n *Namespace) HitRate(ctx context.Context, key string, rate Rate, cost float64, limits []Limit, value float64, fixed, undo bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int) {
	if n.mode == Synchronous {
		if ok, decided := n.hitRateAtStore(ctx, key, rate, cost, rs); decided {
			if !ok {
				n.peekLimits(ctx, key, limits, fixed, out)
				return false, -1
			}
			if rejected = n.Hit(ctx, key, limits, value, fixed, undo, out); rejected >= 0 {
				n.giveRateBack(ctx, key, rate, cost, rs)
			}
			return true, rejected
		}
	}
	return n.counters.HitRate(key, rate, cost, limits, value, fixed, undo, out, rs)
}

// HitRateIfRoom is HitIfRoom with a rate checked first: it counts the
// request only when the rate admits it and every limit has room for it,
// and otherwise counts nothing and returns whether the rate admitted it,
// the first limit without room (or -1), and how long until the request
// may fit if no other comes (negative: never). Where the store decides,
// a request a limit has no room for gives its turn back, as in HitRate.
func (n *Namespace) HitRateIfRoom(ctx context.Context, key string, rate Rate, cost float64, limits []Limit, value float64, fixed bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int, wait time.Duration) {
	if n.mode == Synchronous {
		if ok, decided := n.hitRateAtStore(ctx, key, rate, cost, rs); decided {
			if !ok {
				n.peekLimits(ctx, key, limits, fixed, out)
				return false, -1, rs.Wait(rate, cost)
			}
			if rejected, wait = n.HitIfRoom(ctx, key, limits, value, fixed, out); rejected >= 0 {
				n.giveRateBack(ctx, key, rate, cost, rs)
			}
			return true, rejected, wait
		}
	}
	return n.counters.HitRateIfRoom(key, rate, cost, limits, value, out, rs)
}

// PeekRate returns key's state under the rate's window without changing
// it: the store's in a synchronous namespace (one round trip), or else,
// or when the store cannot answer, this node's.
func (n *Namespace) PeekRate(ctx context.Context, key string, window time.Duration) RateSample {
	if n.mode == Synchronous {
		if s, ok := n.readRateAtStore(ctx, key, window); ok {
			return s
		}
	}
	return n.counters.ReadRate(key, window)
}

// peekLimits reads the limits' windows into out without counting, as
// Peek does (from the store in a synchronous namespace).
func (n *Namespace) peekLimits(ctx context.Context, key string, limits []Limit, fixed bool, out []window.Sample) {
	if len(limits) > 0 {
		n.Peek(ctx, key, limits, 0, fixed, out)
	}
}
