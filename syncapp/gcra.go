package syncapp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// Rates: the generic cell rate algorithm (GCRA) of nginx's limit_req,
// beside the windows (see window/gcra.go). A key's state under a rate is
// one timestamp, its theoretical arrival time (TAT).
//
// In a local namespace the zone holds it. In a synchronous one (sync_rate
// 0) the store decides every request, in one round trip, by its own clock
// (strategy.Rater), then the limits are hit as Hit does; a request that a
// limit rejects gives its turn back at the store (a second round trip, a
// third for the rejecting limit's). The zone keeps the TATs the store
// answers, so that it can decide on its own when the store cannot:
//
//   - the request surely never reached the store (strategy.ErrNotSent), or
//     the store is held down after a failure: the zone decides, and
//     nothing goes to the store. During an outage each node admits the
//     rate on its own, so a fleet of k nodes admits up to k times the rate
//     (and k bursts); a TAT set locally cannot be merged into the store's,
//     which is a point in time, not a sum, so when the store answers again
//     it decides from its own TAT, as if the outage's requests had not come.
//   - the request failed after it may have been applied: the zone decides,
//     and what it decided is sent to the store later under the request's
//     ID (a forced Rate when admitted, a GiveBack when not), which the
//     store applies only if it did not already: so the store's TAT counts
//     the request exactly once, or not at all. Those retries go with the
//     first request the store answers again, and are dropped when older
//     than half of strategy.RateIDLife, past which the store may have
//     forgotten the ID.
//
// A periodic namespace refuses rates at load (CheckRate): a TAT is not a
// count, and the TATs that nodes move on their own do not add up into the
// fleet's the way window diffs do.

// Rate is a GCRA limit a request is checked against: N requests per
// Window, and Burst more at once.
type Rate = window.Rate

// RateSample is a key's state under a rate at an instant.
type RateSample = window.RateSample

// maxRateRetries bounds the decisions waiting to be sent to the store
// (see above): past it the oldest are dropped.
const maxRateRetries = 4096

// CheckRate returns an error, naming the namespace and what to do, when
// the namespace cannot decide a rate of this window: a periodic one (see
// above), or a synchronous one whose store is not a strategy.Rater or
// cannot name the window.
func (n *Namespace) CheckRate(win time.Duration) error {
	switch n.mode {
	case Periodic:
		return fmt.Errorf("namespace %q syncs every %v: a rate (GCRA) keeps one timestamp per key, which does not add up across nodes the way window counts do; use sync_rate 0 (the store decides every request, one round trip) or a local namespace",
			n.name, time.Duration(n.rate))
	case Synchronous:
		if _, ok := n.store.(strategy.Rater); !ok {
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
// read into out); one a limit rejects leaves the rate's state as it was
// (in a synchronous namespace it gives its turn back), the limits
// counting it as Hit does (undo takes it back). rs receives the rate's
// state after the request, out each limit's window. It returns whether
// the rate admitted the request and the index of the limit that rejected
// it, or -1.
//
// In a local namespace the zone decides, under one lock of the key; in a
// synchronous one the store decides the rate (see above for when it
// cannot), and the limits are hit as Hit does.
func (n *Namespace) HitRate(ctx context.Context, key string, rate Rate, cost float64, limits []Limit, value float64, fixed, undo bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int) {
	if d := n.rateAtStore(ctx, key, rate, cost, rs); d.decided {
		if !d.ok {
			n.readLimits(key, limits, out)
			return false, -1
		}
		rejected = -1
		if len(limits) > 0 {
			if rejected = n.Hit(ctx, key, limits, value, fixed, undo, out); rejected >= 0 {
				n.giveRateBack(ctx, key, rate.Window, d.id)
			}
		}
		return true, rejected
	} else if d.id != "" {
		rateOK, rejected = n.counters.HitRate(key, rate, cost, limits, value, fixed, undo, out, rs)
		n.rateInDoubt(key, rate, cost, d.id, rateOK && rejected < 0)
		return rateOK, rejected
	}
	return n.counters.HitRate(key, rate, cost, limits, value, fixed, undo, out, rs)
}

// HitRateIfRoom is HitIfRoom with a rate checked first (see HitRate): it
// counts the request only when the rate admits it and every limit has
// room for it, and otherwise counts nothing and returns whether the rate
// admitted it, the first limit without room (or -1), and how long until
// the request may fit if no other comes (negative: never). Where the
// store decides, a request a limit has no room for gives its turn back.
func (n *Namespace) HitRateIfRoom(ctx context.Context, key string, rate Rate, cost float64, limits []Limit, value float64, fixed bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int, wait time.Duration) {
	if d := n.rateAtStore(ctx, key, rate, cost, rs); d.decided {
		if !d.ok {
			n.readLimits(key, limits, out)
			return false, -1, rs.Wait(rate, cost)
		}
		if len(limits) > 0 {
			if rejected, wait = n.HitIfRoom(ctx, key, limits, value, fixed, out); rejected >= 0 {
				n.giveRateBack(ctx, key, rate.Window, d.id)
				return true, rejected, wait
			}
		}
		return true, -1, 0
	} else if d.id != "" {
		rateOK, rejected, wait = n.counters.HitRateIfRoom(key, rate, cost, limits, value, out, rs)
		n.rateInDoubt(key, rate, cost, d.id, rateOK && rejected < 0)
		return rateOK, rejected, wait
	}
	return n.counters.HitRateIfRoom(key, rate, cost, limits, value, out, rs)
}

// PeekRate returns key's state under the rate's window without changing
// it, as this node's zone holds it: in a synchronous namespace, the TATs
// the store answered lately, which is what a dry run or a status check
// needs, without a round trip.
func (n *Namespace) PeekRate(key string, window time.Duration) RateSample {
	return n.counters.ReadRate(key, window)
}

// readLimits reads the limits' windows into out without counting, from
// the zone, as they are read after a rate that rejects.
func (n *Namespace) readLimits(key string, limits []Limit, out []window.Sample) {
	for i, l := range limits {
		out[i] = n.counters.Read(key, l.Size)
	}
}

// storeDecision is what rateAtStore did: decided says the store decided
// (ok: admitted), under id; an id without a decision is a request that
// may have been applied.
type storeDecision struct {
	id          string
	ok, decided bool
}

// rateAtStore has the store decide one request under a rate, in a
// synchronous namespace whose store is not held down. The store's answer
// goes to rs and to the zone (ObserveRate).
func (n *Namespace) rateAtStore(ctx context.Context, key string, rate Rate, cost float64, rs *RateSample) storeDecision {
	rater, ok := n.store.(strategy.Rater)
	if n.mode != Synchronous || !ok || n.health.down() {
		return storeDecision{}
	}
	id := newBatchID()
	ctx, cancel := context.WithTimeout(ctx, hitTimeout)
	defer cancel()
	rep, err := rater.Rate(ctx, n.name, key, id, strategy.RateRequestOf(rate.Window, rate.N, rate.Burst, cost))
	switch {
	case err == nil:
	case errors.Is(err, strategy.ErrRejected): // the store is fine; the input is not
		return storeDecision{}
	case errors.Is(err, strategy.ErrNotSent):
		n.health.failed(err, 0)
		return storeDecision{}
	default:
		n.health.failed(err, 0)
		return storeDecision{id: id}
	}
	n.health.succeeded()
	*rs = RateSample{TAT: rep.TAT, At: rep.Now}
	n.counters.ObserveRate(key, rate.Window, rep.TAT)
	n.sendRateRetries(rater)
	return storeDecision{id: id, ok: rep.OK, decided: true}
}

// giveRateBack gives back at the store the turn that the request id took
// and a limit then refused; on a failure it is queued to be sent again.
func (n *Namespace) giveRateBack(ctx context.Context, key string, win time.Duration, id string) {
	rater := n.store.(strategy.Rater)
	ctx, cancel := context.WithTimeout(ctx, hitTimeout)
	defer cancel()
	if err := rater.GiveBack(ctx, n.name, key, id, win); err != nil && !errors.Is(err, strategy.ErrRejected) {
		n.health.failed(err, 0)
		n.rateRetries.add(rateRetry{key: key, id: id, req: strategy.RateRequest{Window: win}, giveBack: true, at: time.Now()})
	}
}

// rateInDoubt queues what this node decided for a request that may have
// reached the store: a forced Rate if it admitted it, a GiveBack if not.
func (n *Namespace) rateInDoubt(key string, rate Rate, cost float64, id string, admitted bool) {
	req := strategy.RateRequestOf(rate.Window, rate.N, rate.Burst, cost)
	req.Force = true
	n.rateRetries.add(rateRetry{key: key, id: id, req: req, giveBack: !admitted, at: time.Now()})
}

// sendRateRetries sends the queued decisions, in the background, one
// sender at a time.
func (n *Namespace) sendRateRetries(rater strategy.Rater) {
	q := &n.rateRetries
	if q.len() == 0 || !q.sending.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer q.sending.Store(false)
		queued := q.take()
		for i, r := range queued {
			if time.Since(r.at) > strategy.RateIDLife/2 {
				continue // the store may have forgotten the ID
			}
			ctx, cancel := context.WithTimeout(context.Background(), hitTimeout)
			var err error
			if r.giveBack {
				err = rater.GiveBack(ctx, n.name, r.key, r.id, r.req.Window)
			} else {
				_, err = rater.Rate(ctx, n.name, r.key, r.id, r.req)
			}
			cancel()
			if err != nil && !errors.Is(err, strategy.ErrRejected) {
				n.logger.Warn("sending a rate decision made while the store failed", zap.Error(err))
				for _, r := range queued[i:] { // the store's next answer sends them
					q.add(r)
				}
				return
			}
		}
	}()
}

// rateRetry is a decision to send to the store under its request's ID.
type rateRetry struct {
	key, id  string
	req      strategy.RateRequest
	giveBack bool
	at       time.Time
}

// rateRetries are the decisions waiting for the store; the zero value is
// an empty queue.
type rateRetries struct {
	mu      sync.Mutex
	queue   []rateRetry
	sending atomic.Bool
}

func (q *rateRetries) add(r rateRetry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) >= maxRateRetries {
		q.queue = q.queue[1:]
	}
	q.queue = append(q.queue, r)
}

func (q *rateRetries) take() []rateRetry {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := q.queue
	q.queue = nil
	return r
}

func (q *rateRetries) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}
