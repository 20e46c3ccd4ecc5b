package strategy

import (
	"context"
	"fmt"
	"time"
)

// Rater is a Store that can decide rates (the GCRA of window/gcra.go,
// nginx limit_req's rate and burst): the capability that a rate in a
// namespace with sync_rate 0 needs. A key's state under a rate is one
// timestamp, its theoretical arrival time (TAT), which the store keeps per
// (namespace, key, window) and moves by its own clock (the Redis server's
// TIME, PostgreSQL's clock_timestamp()), so that a fleet admits exactly
// the rate whatever the skew of the nodes' clocks. Stores count the TAT in
// whole microseconds, which a Lua number holds exactly.
//
// A request is one round trip (Rate). A request that the rate admits and
// a limit checked after it then rejects gives its turn back (GiveBack),
// as if the rate had never admitted it: the caller checks the rate
// first, as the handler does, and the limits after it. A RateBatcher
// does both in one hit of a batch, which is how the rate_limit app sends
// every request under a rate.
//
// Every call is named by an ID, unique per request, which makes it
// exactly once: the store records what an ID did (took a turn, was
// refused one, gave it back) for RateIDLife, so a Rate whose reply was
// lost may be sent again under its ID without taking a second turn, and a
// GiveBack sent twice gives back once. A key whose TAT has passed holds a
// whole burst, as a key never seen does, so the store drops it: it costs
// no storage once it has been idle that long.
//
// Errors follow the conventions of Store and Hitter: they wrap ErrNotSent
// when the request surely never reached the store, and ErrRejected for
// input that can never be accepted (see CheckRate).
type Rater interface {
	Store

	// Rate decides one request of key under a rate, by the store's clock:
	// it is admitted when max(TAT, now) + Increment - now <= Tolerance
	// (or always, with Force), and then moves the TAT to max(TAT, now) +
	// Increment; a refused request changes nothing. id, unless empty,
	// names the request: a Rate with an id already recorded changes
	// nothing and answers what the id did, except that a forced Rate of
	// an id that was refused takes its turn; an id given back is never
	// admitted.
	Rate(ctx context.Context, namespace, key, id string, r RateRequest) (RateReply, error)

	// GiveBack takes back the turn that the Rate named id took of key's
	// rate of this window, moving the TAT back by that Rate's Increment,
	// and records id as given back, so that a Rate of id that reaches the
	// store later (a resend) takes no turn. An id that took no turn is
	// only recorded. Giving back twice gives back once.
	GiveBack(ctx context.Context, namespace, key, id string, window time.Duration) error
}

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
	// Force admits the request whatever the TAT: the retry of a request
	// that a node admitted on its own when the store did not answer, so
	// that the store's TAT counts it.
	Force bool
}

// RateReply is what a Rate answers.
type RateReply struct {
	// OK says whether the request was admitted.
	OK bool
	// TAT is the key's TAT after the call, in Unix nanoseconds (whole
	// microseconds): at or before Now when the key has its whole burst.
	TAT int64
	// Now is the store's clock at the call, in Unix nanoseconds.
	Now int64
}

// Limits of a Rater's input.
const (
	// MaxRateSpan is the longest Increment and Tolerance: a key's state
	// lives up to that long after its last request.
	MaxRateSpan = 366 * 24 * time.Hour

	// RateIDLife is how long a store remembers what an ID did: a resend
	// or a give-back of a request comes within it, or is dropped by the
	// caller.
	RateIDLife = time.Minute
)

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

// CheckRate checks the input of Rate and GiveBack: an id of at most
// MaxIDLen bytes (1 or more for GiveBack, which needs one, as with
// needID), a window valid for CheckSize, and, for Rate, an Increment from
// 0 and a Tolerance from 1µs to MaxRateSpan, both whole microseconds. The
// error names the field at fault and wraps ErrRejected.
func CheckRate(id string, needID bool, r RateRequest) error {
	if n := len(id); n > MaxIDLen || needID && n == 0 {
		return fmt.Errorf("%w: a rate's ID has %d bytes, not %d to %d", ErrRejected, n, min(n, 1), MaxIDLen)
	}
	if err := CheckSize(r.Window); err != nil {
		return fmt.Errorf("rate window: %w", err)
	}
	if needID {
		return nil
	}
	if r.Increment < 0 || r.Increment > MaxRateSpan || r.Increment%time.Microsecond != 0 {
		return fmt.Errorf("%w: a rate's increment %v is not whole microseconds within [0, %v]", ErrRejected, r.Increment, MaxRateSpan)
	}
	if r.Tolerance < time.Microsecond || r.Tolerance > MaxRateSpan || r.Tolerance%time.Microsecond != 0 {
		return fmt.Errorf("%w: a rate's tolerance %v is not whole microseconds within [1µs, %v]", ErrRejected, r.Tolerance, MaxRateSpan)
	}
	return nil
}

// ConformMicros is the decision of Rate, in microseconds, for stores that
// compute it in Go (the memory store; the others follow it in Lua and
// SQL): the TAT after a request of inc at now, and whether it was
// admitted (a refused request leaves tat).
func ConformMicros(tat, now, inc, tol int64, force bool) (next int64, ok bool) {
	due := max(tat, now) + inc
	if !force && due-now > tol {
		return tat, false
	}
	return due, true
}

// Rate wraps the error of Rater.Rate.
func (e Errors) Rate(errp *error, namespace string) {
	e.wrap(errp, "deciding a rate of namespace %q", namespace)
}

// GiveBack wraps the error of Rater.GiveBack.
func (e Errors) GiveBack(errp *error, namespace string) {
	e.wrap(errp, "giving back a rate's turn of namespace %q", namespace)
}

// RateBatcher is a Rater that decides rates within its batches of hits,
// so that a request under a rate and limits is one hit of one round trip,
// the rate's give-back included, with the batch's exactly-once ID and its
// retry: the one road of a synchronous namespace's requests to its store.
//
// HitBatch takes hits with a Rate (whose Force must be false), and
// decides each, in the batch's order, by the store's clock: the rate
// first, as Rate decides it, then the hit's windows. A hit the rate
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
// TAT as a forced Rate does, to max(TAT, now) + Increment by the store's
// clock.
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
// for a hit with a Rate, its rate as CheckRate does (not forced) and 0
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
	if err := CheckRate(id, false, *h.Rate); err != nil {
		return err
	}
	if h.Rate.Force {
		return fmt.Errorf("%w: a hit's rate cannot be forced", ErrRejected)
	}
	if len(h.Windows) == 0 {
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
		if err := CheckRate("", false, req); err != nil {
			return fmt.Errorf("rates[%d]: %w", i, err)
		}
	}
	return nil
}
