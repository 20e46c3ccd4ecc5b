package syncapp

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// storeRoad is a config's road from a request to its store: the
// synchronous hits (sync_rate 0, near hits with sync_above, rates at
// sync_rate 0) that go in the round trips of its hit queue, and what a
// refusal, a failure, a stall or a doubt does to each. A config's
// Namespace that has a store able to take synchronous hits holds one; the
// hit queue, the health and the outbox are the pooled fleet state's, and
// the zone's counts are where the store's answers go.
type storeRoad struct {
	// slots says that the store takes concurrency slots in its round
	// trips (strategy.SlotBatcher).
	slots    bool
	store    *tripStore
	hits     *hitQueue
	health   *health
	outbox   *outbox
	counters *window.Namespace
}

// tripEnd is how a request's round trip ended for it.
type tripEnd int

const (
	// tripAnswered: the store decided.
	tripAnswered tripEnd = iota
	// tripUnsent: the request is decided locally, and nothing of it
	// retried: the store refused its input, the store stalled (health
	// knows), or the request surely never reached it.
	tripUnsent
	// tripInDoubt: the round trip failed after it may have been applied;
	// what the request counts locally goes into its retry.
	tripInDoubt
)

// trip sends req in a round trip of the hit queue, tells health what
// the round trip said of the store, and returns the result, the retry
// that carries the request if the round trip is in doubt, and how it
// ended. No timeout of its own: a round trip ends within hitTimeout, a
// hit waits for at most the one ahead of it, and a stall sends it local.
func (r *storeRoad) trip(ctx context.Context, req strategy.HitRequest) (strategy.HitResult, retrySlot, tripEnd) {
	res, retry := r.hits.do(ctx, r.store, req)
	switch err := res.Err; {
	case err == nil:
		r.health.succeededFor(req.Key)
		return res, retry, tripAnswered
	case errors.Is(err, strategy.ErrRejected), errors.Is(err, errStalled):
		return res, retry, tripUnsent
	case errors.Is(err, strategy.ErrNotSent):
		r.health.fail(err, 0)
		return res, retry, tripUnsent
	}
	r.health.fail(res.Err, 0)
	return res, retry, tripInDoubt
}

// hit is a synchronous Hit in one round trip to the store, which
// carries the hits of the namespace that wait with it (hitQueue). It reports
// false when the hit must be counted locally as a pending diff instead:
// the store refused the windows, or the request surely never reached it.
// When the request failed after it may have been applied, the hit counts
// locally as the store's and is queued in the outbox for a retry under
// its round trip's ID, which the store skips if it applied the round trip.
//
// unsynced, for a near hit of a periodic namespace, holds what
// window.Namespace.HitUnlessNear found of this node's diffs, and out the
// windows it read. The store must decide on every hit this node counted:
// the current windows' diffs, taken, ride along with the hit; the previous
// windows' diffs, and the diffs on their way in a push, lower the limits
// instead. The diffs taken of windows the hit did not increment go back
// to the zone.
//
// a is the store's answer when the store decided the hit, or says the
// hit is in doubt (its zero value when the hit was not sent).
func (r *storeRoad) hit(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample, unsynced []window.Unsynced) (rejected int, a storeAnswer, ok bool) {
	windows := syncWindows(limits, value, fixed, r.counters.Now())
	if unsynced != nil {
		// A run's diffs taken from the zone are in the view: a near hit's
		// unsynced diffs and the view never both miss them. Some may be in
		// both, which only lowers the limits it sends.
		v := r.outbox.view()
		for i := range windows {
			w, u := &windows[i], unsynced[i]
			w.Start = out[i].Start
			if !fixed {
				w.Weight = out[i].Weight
			}
			w.Value += u.Taken
			w.Max -= v.of(key, w.Size, w.Start) + (u.Previous+v.of(key, w.Size, w.Start-int64(w.Size)))*w.Weight
		}
		v.close()
	}
	epoch := r.outbox.epoch()
	res, retry, end := r.trip(ctx, strategy.HitRequest{Key: key, Windows: windows, Undo: undo})
	switch end {
	case tripUnsent:
		r.giveBack(key, windows, unsynced, 0, true)
		return 0, storeAnswer{}, false
	case tripInDoubt:
		rejected := r.counters.Hit(key, limits, value, fixed, undo, true, out)
		r.retry(retry, hitDiffs(key, windows, rejected, undo), nil)
		r.giveBack(key, windows, unsynced, rejected, undo)
		return rejected, storeAnswer{doubt: true}, true
	}
	r.giveBack(key, windows, unsynced, res.Rejected, undo)
	r.observe(key, windows, res.Counts, epoch, out)
	return res.Rejected, storeAnswer{windows: windows, counts: res.Counts, rejected: res.Rejected, undo: undo}, true
}

// storeAnswer is what the store answered a synchronous hit: the windows
// the hit sent, and their counts after it; or, with doubt, that the hit
// failed after it may have been applied (and was counted locally).
type storeAnswer struct {
	windows  []strategy.WindowHit
	counts   []strategy.WindowCounts
	rejected int
	undo     bool
	doubt    bool
}

// added returns what the hit added to window i's count at the store:
// its value, unless the window was not incremented (a window after the
// one that rejected) or the increment was taken back (undo).
func (a *storeAnswer) added(i int) float64 {
	if a.rejected >= 0 && (a.undo || i > a.rejected) {
		return 0
	}
	return a.windows[i].Value
}

// hitNear is Hit in a namespace with sync_above, the fraction of a limit
// from which a key's hits count at the store: on this node's counts
// unless the hit is near a limit (window.Namespace.HitUnlessNear), and
// then as hit, with the key's diffs this node has not pushed. a is the
// store's answer when the store decided (out then holds its counts).
func (r *storeRoad) hitNear(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, above float64, out []window.Sample) (rejected int, a storeAnswer) {
	var buf [4]window.Unsynced
	unsynced := buf[:]
	if len(limits) > len(buf) {
		unsynced = make([]window.Unsynced, len(limits))
	}
	unsynced = unsynced[:len(limits)]
	rejected, near := r.counters.HitUnlessNear(key, limits, value, fixed, undo, above, out, unsynced)
	if !near {
		return rejected, storeAnswer{}
	}
	if !r.health.downFor(key) {
		if rejected, a, ok := r.hit(ctx, key, limits, value, fixed, undo, out, unsynced); ok {
			return rejected, a
		}
	} else {
		// The store is skipped: what the near hit took goes back, and the
		// hit counts locally.
		windows := make([]strategy.WindowHit, len(limits))
		for i, l := range limits {
			windows[i] = strategy.WindowHit{Size: l.Size, Start: out[i].Start}
		}
		r.giveBack(key, windows, unsynced, 0, true)
	}
	return r.counters.Hit(key, limits, value, fixed, undo, false, out), storeAnswer{}
}

// rateHit is a synchronous HitRate: one hit of the hit queue, with the
// rate, which the store decides with the limits (see hit for the limits'
// side). It reports false when the request must be decided by
// the zone alone: the store refused the input, or the request surely
// never reached it. When the round trip failed after it may have been
// applied, the zone decides, and what it admitted goes into the round
// trip's retry: the limits' increments and the rate's turn.
func (r *storeRoad) rateHit(ctx context.Context, key string, rate Rate, cost float64, limits []Limit, value float64, fixed, undo bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int, ok bool) {
	req := strategy.RateRequestOf(rate.Window, rate.N, rate.Burst, cost)
	windows := syncWindows(limits, value, fixed, r.counters.Now())
	epoch := r.outbox.epoch()
	res, retry, end := r.trip(ctx, strategy.HitRequest{Key: key, Windows: windows, Undo: undo, Rate: &req})
	switch end {
	case tripUnsent:
		return false, -1, false
	case tripInDoubt:
		rateOK, rejected = r.counters.HitRate(key, rate, cost, limits, value, fixed, undo, true, out, rs)
		var diffs []window.Diff
		var turn *strategy.RateDiff
		if rateOK {
			diffs = hitDiffs(key, windows, rejected, undo)
			if rejected < 0 {
				turn = &strategy.RateDiff{Key: key, Window: rate.Window, Increment: req.Increment}
			}
		}
		r.retry(retry, diffs, turn)
		return rateOK, rejected, true
	}
	r.observe(key, windows, res.Counts, epoch, out)
	*rs = RateSample{TAT: res.Rate.TAT, At: res.Rate.Now}
	r.counters.ObserveRate(key, rate.Window, res.Rate.TAT)
	return res.Rate.OK, res.Rejected, true
}

// read reads key's windows of the given sizes at now (Unix nanoseconds)
// from the store: a hit of the hit queue that increments nothing and has
// no limit, so that it rides the round trip of the hits beside it. It
// returns each window's state, the store's counts plus this node's diffs
// on their way to it, and with observe sets the zone's counts to them
// too (zone.Observe, which then adds its own diffs to the states). It
// reports false when the store did not answer.
func (r *storeRoad) read(ctx context.Context, key string, sizes []time.Duration, now int64, observe bool) ([]window.Sample, bool) {
	windows := make([]strategy.WindowHit, len(sizes))
	for i, size := range sizes {
		windows[i] = strategy.WindowHit{Size: size, Start: window.Start(now, size), Max: math.Inf(1)}
	}
	epoch := r.outbox.epoch()
	res, retry, end := r.trip(ctx, strategy.HitRequest{Key: key, Windows: windows})
	if end != tripAnswered {
		r.retry(retry, nil, nil)
		return nil, false
	}
	out := make([]window.Sample, len(windows))
	if observe {
		r.observe(key, windows, res.Counts, epoch, out)
		return out, true
	}
	v := r.outbox.view()
	defer v.close()
	for i, w := range windows {
		out[i] = window.Sample{
			Current:  res.Counts[i].Current + v.of(key, w.Size, w.Start),
			Previous: res.Counts[i].Previous + v.of(key, w.Size, w.Start-int64(w.Size)),
			Weight:   window.Weight(now, w.Size), Start: w.Start, Size: w.Size, At: now,
		}
	}
	return out, true
}

// takeSlot takes a concurrency slot of key in the store, as a hit of the
// hit queue (see strategy.SlotBatcher), and reports whether it got one.
// The error is the hit's: the caller handles it as AcquireSlot's, and
// errStalled when the hit left the queue unsent.
func (r *storeRoad) takeSlot(ctx context.Context, key string, slot strategy.SlotRequest) (bool, error) {
	res, retry := r.hits.do(ctx, r.store, strategy.HitRequest{Key: key, Slot: &slot})
	r.retry(retry, nil, nil) // a slot in doubt is released, not pushed
	return res.Slot.OK, res.Err
}

// forSlots returns r if its store takes slots in its round trips, and
// nil otherwise (or if r is nil).
func (r *storeRoad) forSlots() *storeRoad {
	if r == nil || !r.slots {
		return nil
	}
	return r
}

// retry adds a hit's increments and its rate's turn, if any, to the
// retry of its round trip in doubt, if any (nothing for a read or a
// slot: the retry waits for every hit the round trip carried), and
// queues the retry in the outbox once the last hit added its own.
func (r *storeRoad) retry(retry retrySlot, diffs []window.Diff, turn *strategy.RateDiff) {
	if retry.r == nil {
		return
	}
	if b, last := retry.add(diffs, turn); last {
		r.outbox.retry(b)
	}
}

// observe sets key's windows in the zone to the counts the store
// answered, and out to their states. epoch is the outbox's (see inflight)
// when the hit was sent: if diffs landed since, the counts only rise.
func (r *storeRoad) observe(key string, windows []strategy.WindowHit, counts []strategy.WindowCounts, epoch uint64, out []window.Sample) {
	// Diffs on their way to the store are not in its counts yet; no run
	// takes the zone's diffs while the view is open, so none is counted
	// both in the view and in the zone the counts are observed into.
	v := r.outbox.view()
	defer v.close()
	observe := r.counters.Observe
	if v.landedSince(epoch) {
		observe = r.counters.ObserveAtLeast
	}
	for i, w := range windows {
		cur := counts[i].Current + v.of(key, w.Size, w.Start)
		prev := counts[i].Previous + v.of(key, w.Size, w.Start-int64(w.Size))
		out[i] = observe(key, w.Size, w.Start, cur, prev)
	}
}

// syncWindows returns the windows of a synchronous hit of value against
// limits at now (Unix nanoseconds).
func syncWindows(limits []Limit, value float64, fixed bool, now int64) []strategy.WindowHit {
	windows := make([]strategy.WindowHit, len(limits))
	for i, l := range limits {
		w := strategy.WindowHit{Size: l.Size, Start: window.Start(now, l.Size), Value: value, Max: l.Max}
		if !fixed {
			w.Weight = window.Weight(now, l.Size)
		}
		windows[i] = w
	}
	return windows
}

// hitDiffs returns the diffs that carry a failed synchronous hit: the
// increments the local decision made (none, if undo took them back).
func hitDiffs(key string, windows []strategy.WindowHit, rejected int, undo bool) []window.Diff {
	if rejected >= 0 && undo {
		return nil
	}
	var diffs []window.Diff
	for i, w := range windows {
		if rejected >= 0 && i > rejected {
			break
		}
		diffs = append(diffs, window.Diff{Key: key, Size: w.Size, Start: w.Start, Value: w.Value})
	}
	return diffs
}

// giveBack returns to the zone's pending diffs the diffs a near hit took
// of the windows that the hit, rejected at index rejected (or -1), did not
// increment: those after the rejecting window, or all of them when undo
// took the increments back. It runs before the store's counts are
// observed, which then lack them.
func (r *storeRoad) giveBack(key string, windows []strategy.WindowHit, unsynced []window.Unsynced, rejected int, undo bool) {
	if unsynced == nil {
		return
	}
	var diffs []window.Diff
	for i, w := range windows {
		applied := rejected < 0 || (!undo && i <= rejected)
		if !applied && unsynced[i].Taken != 0 {
			diffs = append(diffs, window.Diff{Key: key, Size: w.Size, Start: w.Start, Value: unsynced[i].Taken})
		}
	}
	if len(diffs) > 0 {
		r.counters.Restore(diffs)
	}
}
