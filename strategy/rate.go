package strategy

import (
	"fmt"
	"time"
)

// Rates: the GCRA of window/gcra.go (nginx limit_req's rate and burst),
// decided by a store within its batches of hits (RateBatcher), the
// capability that a rate in a namespace with sync_rate 0 needs. A key's
// state under a rate is one timestamp, its theoretical arrival time
// (TAT), which the store keeps per (namespace, key, window) and moves by
// its own clock (the Redis server's TIME, PostgreSQL's
// clock_timestamp()), so that a fleet admits exactly the rate whatever
// the skew of the nodes' clocks. Stores count the TAT in whole
// microseconds, which a Lua number holds exactly. A key whose TAT has
// passed holds a whole burst, as a key never seen does, so the store
// drops it: it costs no storage once it has been idle that long.

// RateRequest is one request under a rate, in the units of the store:
// the caller turns the rate and the request's cost into how far the
// request moves the TAT and how far ahead of now the TAT may get.
type RateRequest struct {
	// Window is the rate's window, which names the key's state: rates of
	// one window share a key's TAT. A positive whole number of
	// milliseconds.
	Window time.Duration
	// Increment is how far an admitted request moves the TAT: its cost
	// times the emission interval (window/rate). Whole microseconds, 0
	// or more.
	Increment time.Duration
	// Tolerance is (burst + 1) times the emission interval: how far
	// ahead of the store's now the TAT may be after an admitted request.
	// Whole microseconds, positive.
	Tolerance time.Duration
}

// RateReply is a store's decision of a request under a rate.
type RateReply struct {
	// OK says whether the request was admitted.
	OK bool
	// TAT is the key's TAT after the call, in Unix nanoseconds (whole
	// microseconds): at or before Now when the key has its whole burst.
	TAT int64
	// Now is the store's clock at the call, in Unix nanoseconds.
	Now int64
}

// MaxRateSpan is the longest Increment and Tolerance of a rate's input:
// a key's state lives up to that long after its last request.
const MaxRateSpan = 366 * 24 * time.Hour

// RateRequestOf returns the request of cost under a rate of n requests
// per window and burst more at once, in whole microseconds, as the stores
// count them: Increment rounded to the nearest, Tolerance down (a hair
// stricter, never looser).
func RateRequestOf(window time.Duration, n, burst, cost float64) RateRequest {
	t := float64(window) / n
	return RateRequest{
		Window:    window,
		Increment: time.Duration(int64(cost*t/1e3+0.5)) * time.Microsecond,
		Tolerance: time.Duration(int64((burst+1)*t/1e3)) * time.Microsecond,
	}
}

// CheckRate checks a rate's input: a window valid for CheckSize, an
// Increment from 0 and a Tolerance from 1µs to MaxRateSpan, both whole
// microseconds. The error names the field at fault and wraps ErrRejected.
func CheckRate(r RateRequest) error {
	if err := CheckSize(r.Window); err != nil {
		return fmt.Errorf("rate window: %w", err)
	}
	if r.Increment < 0 || r.Increment > MaxRateSpan || r.Increment%time.Microsecond != 0 {
		return fmt.Errorf("%w: a rate's increment %v is not whole microseconds within [0, %v]", ErrRejected, r.Increment, MaxRateSpan)
	}
	if r.Tolerance < time.Microsecond || r.Tolerance > MaxRateSpan || r.Tolerance%time.Microsecond != 0 {
		return fmt.Errorf("%w: a rate's tolerance %v is not whole microseconds within [1µs, %v]", ErrRejected, r.Tolerance, MaxRateSpan)
	}
	return nil
}

// RateBatcher is a store that decides rates within its batches of hits,
// so that a request under a rate and limits is one hit of one round trip,
// the rate's give-back included, with the batch's exactly-once ID and its
// retry: the one road of a synchronous namespace's requests to its store.
//
// HitBatch takes hits with a Rate, and decides each, in the batch's
// order, by the store's clock: the rate first (admitted when max(TAT,
// now) + Increment - now <= Tolerance, which moves the TAT to max(TAT,
// now) + Increment; a refused request changes nothing), then the hit's
// windows. A hit the rate
// refuses is applied to no window: its windows are only read, and its
// Rejected is -1. A hit the rate admits is applied to its windows as any
// hit; if one rejects it, the rate's turn is given back at once (the TAT
// stays as it was). The hits of one key see the TAT moves of the hits of
// that key before them. HitResult.Rate holds each rate's answer. A batch
// whose ID was applied before moves no TAT: it decides every rate on the
// TAT as it is.
//
// PushDiffs takes a Batch's Rates with its Diffs, under the same ID rule:
// the Batch that carries a failed HitBatch's hits (see BatchHitter) holds,
// besides their windows' diffs, a RateDiff for each of its hits with a
// rate that the caller admitted, and the store counts it as one window
// more of the hit when it applies the rule, so that the RateDiffs move
// the TATs only where the HitBatch did not.
type RateBatcher interface {
	BatchHitter

	// DecidesRatesInBatches marks a store whose HitBatch and PushDiffs
	// take rates as described above.
	DecidesRatesInBatches()
}

// RateDiff is a turn of a key's rate of one window that a node took on
// its own, while the store did not answer: pushed, it moves the key's
// TAT whatever its tolerance, to max(TAT, now) + Increment by the
// store's clock.
type RateDiff struct {
	// Key is the client key.
	Key string
	// Window is the rate's window, as RateRequest.Window.
	Window time.Duration
	// Increment is how far the turn moves the TAT, as
	// RateRequest.Increment.
	Increment time.Duration
}

// CheckHitRequest checks one hit of a HitBatch: as CheckHit does, or,
// for a hit with a Rate, its rate as CheckRate does and 0
// to MaxHitWindows windows, or, for a hit with a Slot, its slot as
// CheckAcquire does, with neither windows nor a rate. The error names the
// field at fault and wraps ErrRejected.
func CheckHitRequest(id string, h *HitRequest) error {
	if h.Slot != nil {
		if len(h.Windows) > 0 || h.Rate != nil {
			return fmt.Errorf("%w: a hit that takes a slot has %d windows and a rate %v: want neither", ErrRejected, len(h.Windows), h.Rate != nil)
		}
		return CheckAcquire(h.Slot.ID, h.Slot.Max, h.Slot.Lease)
	}
	if h.Rate == nil {
		return CheckHit(id, h.Windows)
	}
	if err := CheckRate(*h.Rate); err != nil {
		return err
	}
	if len(h.Windows) == 0 {
		if len(id) > MaxIDLen {
			return fmt.Errorf("%w: the hit's ID has %d bytes, more than %d", ErrRejected, len(id), MaxIDLen)
		}
		return nil
	}
	return CheckHit(id, h.Windows)
}

// CheckRateDiffs checks the Rates of a Batch: each a window valid for
// CheckSize and an Increment of whole microseconds within [0,
// MaxRateSpan]. The error names the first bad one by its index and wraps
// ErrRejected.
func CheckRateDiffs(rates []RateDiff) error {
	for i, r := range rates {
		req := RateRequest{Window: r.Window, Increment: r.Increment, Tolerance: time.Microsecond}
		if err := CheckRate(req); err != nil {
			return fmt.Errorf("rates[%d]: %w", i, err)
		}
	}
	return nil
}
