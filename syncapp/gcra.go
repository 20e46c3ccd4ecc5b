package syncapp

import (
	"context"
	"fmt"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// Rates: the generic cell rate algorithm (GCRA) of nginx's limit_req,
// beside the windows (see window/gcra.go). A key's state under a rate is
// one timestamp, its theoretical arrival time (TAT).
//
// In a local namespace the zone holds it. In a synchronous one (sync_rate
// 0) a request under a rate is one hit of the hit queue's round trips, as
// a synchronous Hit is: the store decides the rate by its own clock, then
// the limits beside it, and gives the rate's turn back at once when a
// limit rejects (strategy.RateBatcher). The zone keeps the TATs the store
// answers, so that it can decide on its own when the store cannot:
//
//   - the request surely never reached the store (strategy.ErrNotSent), or
//     the store is held down after a failure or a stall: the zone decides,
//     and nothing goes to the store. During an outage each node admits the
//     rate on its own, so a fleet of k nodes admits up to k times the rate
//     (and k bursts); a TAT set locally cannot be merged into the store's,
//     which is a point in time, not a sum, so when the store answers again
//     it decides from its own TAT, as if the outage's requests had not come.
//   - the round trip failed after it may have been applied: the zone
//     decides, and a request it admits goes, with its windows' increments,
//     into the round trip's retry (batchRetry), which the outbox pushes
//     under the round trip's ID until the store takes it: a turn forced
//     into the store's TAT only if the round trip was not applied, so the
//     store counts the request exactly once.
//
// A periodic namespace refuses rates at load (CheckRate): a TAT is not a
// count, and the TATs that nodes move on their own do not add up into the
// fleet's the way window diffs do.

// Rate is a GCRA limit a request is checked against: N requests per
// Window, and Burst more at once.
type Rate = window.Rate

// RateSample is a key's state under a rate at an instant.
type RateSample = window.RateSample

// CheckRate returns an error, naming the namespace and what to do, when
// the namespace cannot decide a rate of this window: a periodic one (see
// above), or a synchronous one whose store is not a strategy.RateBatcher or
// cannot name the window.
func (n *Namespace) CheckRate(win time.Duration) error {
	switch n.mode {
	case Periodic:
		return fmt.Errorf("namespace %q syncs every %v: a rate (GCRA) keeps one timestamp per key, which does not add up across nodes the way window counts do; use sync_rate 0 (the store decides every request, one round trip) or a local namespace",
			n.name, time.Duration(n.rate))
	case Synchronous:
		if _, ok := n.store.(strategy.RateBatcher); !ok {
			return fmt.Errorf("namespace %q: the %s store cannot decide rates (GCRA) synchronously", n.name, n.storeModule)
		}
		if err := strategy.CheckSize(win); err != nil {
			return fmt.Errorf("namespace %q: the window of a rate decided by the store: %v", n.name, err)
		}
	}
	return nil
}

// HitRate decides one request of cost at rate, then, if the rate admits
// it, hits limits as Hit does: the rate first, then the limits in order.
// A request the rate rejects counts in no window (the limits are only
// read into out); one a limit rejects leaves the rate's state as it was,
// the limits counting it as Hit does (undo takes it back). rs receives
// the rate's state after the request, out each limit's window. It returns
// whether the rate admitted the request and the index of the limit that
// rejected it, or -1.
//
// In a local namespace the zone decides, under one lock of the key; in a
// synchronous one the store decides the rate and the limits in one round
// trip (see above for when it cannot).
func (n *Namespace) HitRate(ctx context.Context, key string, rate Rate, cost float64, limits []Limit, value float64, fixed, undo bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int) {
	if n.mode == Synchronous && !n.health.downFor(key) {
		if rateOK, rejected, ok := n.road.rateHit(ctx, key, rate, cost, limits, value, fixed, undo, out, rs); ok {
			return rateOK, rejected
		}
	}
	return n.counters.HitRate(key, rate, cost, limits, value, fixed, undo, false, out, rs)
}

// HitRateIfRoom is HitIfRoom with a rate checked first (see HitRate): it
// counts the request only when the rate admits it and every limit has
// room for it, and otherwise counts nothing and returns whether the rate
// admitted it, the first limit without room (or -1), and how long until
// the request may fit if no other comes (negative: never). Where the
// store decides, it is a HitRate with undo, as HitIfRoom is a Hit with
// undo there.
func (n *Namespace) HitRateIfRoom(ctx context.Context, key string, rate Rate, cost float64, limits []Limit, value float64, fixed bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int, wait time.Duration) {
	if n.mode != Synchronous || n.health.downFor(key) {
		return n.counters.HitRateIfRoom(key, rate, cost, limits, value, out, rs)
	}
	switch rateOK, rejected = n.HitRate(ctx, key, rate, cost, limits, value, fixed, true, out, rs); {
	case !rateOK:
		return false, -1, rs.Wait(rate, cost)
	case rejected >= 0:
		return true, rejected, roomWait(limits, value, fixed, out, n.counters.Now())
	}
	return true, -1, 0
}

// PeekRate returns key's state under the rate's window without changing
// it, as this node's zone holds it: in a synchronous namespace, the TATs
// the store answered lately, which is what a dry run or a status check
// needs, without a round trip.
func (n *Namespace) PeekRate(key string, window time.Duration) RateSample {
	return n.counters.ReadRate(key, window)
}
