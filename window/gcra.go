package window

import (
	"fmt"
	"math"
	"time"
)

// A rate is a limit of the generic cell rate algorithm (GCRA), the
// algorithm of nginx's limit_req: N requests per Window, one every
// T = Window/N (the emission interval), and Burst more at once. A key's
// whole state is one timestamp, its theoretical arrival time (TAT): when
// the key would next be due if it had sent at exactly the rate ever since
// it went over it. A request of cost c arriving at now is admitted when
//
//	max(TAT, now) + c*T - now <= (Burst + 1) * T
//
// and then moves the TAT to max(TAT, now) + c*T; a rejected request
// leaves it. So a key that was idle long enough has 1 + Burst requests at
// once, then one per T: what nginx admits with burst and nodelay. A
// request that was rejected is admitted after the wait
//
//	max(TAT, now) + c*T - (Burst + 1) * T - now
//
// and never when c*T > (Burst + 1) * T, its cost alone being over the
// burst.
//
// In a zone, a key's TAT lives in the key's entry beside its windows, as
// the counts of a window size that no window has (the rate's window,
// negated), so it needs no memory of its own and leaves the zone the way
// windows do: by CLOCK eviction, or when a sweep finds that the TAT has
// passed (the key is then as good as new).

// Rate is one GCRA limit: N requests per Window, and Burst more at once.
// Window names the state: two rates of one window share a key's TAT, as
// two limits of one window share its counts, whatever their N and Burst,
// which may change from one request to the next.
type Rate struct {
	// Window is the period N requests are spread over.
	Window time.Duration
	// N is the number of requests per window, positive; fractions are
	// allowed.
	N float64
	// Burst is how many more requests may come at once, 0 or more.
	Burst float64
}

// Check returns an error, naming the field, when r cannot be a rate.
func (r Rate) Check() error {
	switch {
	case r.Window <= 0:
		return fmt.Errorf("rate: the window must be positive, got %v", r.Window)
	case !(r.N > 0) || math.IsInf(r.N, 1):
		return fmt.Errorf("rate: the number of requests per window must be a positive number, got %v", r.N)
	case !(r.Burst >= 0) || math.IsInf(r.Burst, 1):
		return fmt.Errorf("rate: the burst must be a number of 0 or more, got %v", r.Burst)
	}
	return nil
}

// interval returns the emission interval T = Window/N: one request per
// T, at the rate.
func (r Rate) interval() float64 { return float64(r.Window) / r.N }

// tolerance returns (Burst + 1) * T, how far ahead of now a key's TAT may
// get after an admitted request: the GCRA's limit.
func (r Rate) tolerance() float64 { return math.Round((r.Burst + 1) * r.interval()) }

// increment returns c*T, how far a request of cost c moves the TAT.
func (r Rate) increment(cost float64) float64 { return math.Round(cost * r.interval()) }

// share returns the rate one node of m keeps to while the fleet cannot
// sync (see Namespace.SetUnsyncedWeight): a request every m*T, and the
// burst's share, though never less than one request at once, without
// which no request would ever be admitted.
func (r Rate) share(m float64) Rate {
	if m == 1 {
		return r
	}
	return Rate{Window: r.Window, N: r.N / m, Burst: max((r.Burst+1)/m, 1) - 1}
}

// Never is the wait of a request that no wait admits: its cost alone is
// more than 1 + Burst requests.
const Never = time.Duration(-1)

// Conform decides one request of cost at now (Unix nanoseconds) for a key
// whose TAT is tat (0 for a new key): it returns the TAT after it, and
// wait, 0 when the request is admitted. A rejected request leaves the TAT
// as it is, and waits: how long until the same request would be
// admitted, if no other comes, or Never.
func Conform(tat, now int64, r Rate, cost float64) (next int64, wait time.Duration) {
	inc, tol := r.increment(cost), r.tolerance()
	if inc > tol {
		return tat, Never
	}
	next, w := ConformSpans(tat, now, int64(inc), int64(tol))
	return next, time.Duration(w)
}

// ConformSpans is Conform's rule in any one unit of time (a store counts
// microseconds), for a request that moves the TAT by inc, when the TAT
// may get tol ahead of now: the TAT after it, and wait, 0 when the
// request is admitted, else how long until it would be.
func ConformSpans(tat, now, inc, tol int64) (next, wait int64) {
	due := max(tat, now) + inc
	if allowAt := due - tol; allowAt > now {
		return tat, allowAt - now
	}
	return due, 0
}

// RateSample is a key's GCRA state at an instant: what Conform left, and
// what headers and waits are computed from.
type RateSample struct {
	// TAT is the key's theoretical arrival time, in Unix nanoseconds: 0 or
	// before At when the key has its whole burst.
	TAT int64
	// At is the instant, in Unix nanoseconds: the clock of the zone or
	// the store that decided.
	At int64
}

// backlog returns how far the TAT is ahead of the instant.
func (s RateSample) backlog() float64 { return float64(max(s.TAT-s.At, 0)) }

// Remaining returns how many requests of cost 1 the key may send at once
// now: 1 + Burst for a key that has its whole burst, 0 when the next one
// must wait.
func (s RateSample) Remaining(r Rate) int {
	room := r.tolerance() - s.backlog()
	if room <= 0 {
		return 0
	}
	return int(math.Floor(room/r.interval() + 1e-9))
}

// Wait returns how long until a request of cost is admitted, if no other
// comes: 0 if it is now, or Never.
func (s RateSample) Wait(r Rate, cost float64) time.Duration {
	_, wait := Conform(s.TAT, s.At, r, cost)
	return wait
}

// Refill returns how long until one more request of cost 1 can be sent
// at once: 0 when the key has its whole burst, else at most T.
func (s RateSample) Refill(r Rate) time.Duration {
	b := s.backlog()
	if b <= 0 {
		return 0
	}
	t := r.interval()
	whole := float64(s.Remaining(r))
	return time.Duration(math.Ceil(min(b, (whole+1)*t-(r.tolerance()-b))))
}

// Full returns how long until the key has its whole burst again: until
// its TAT.
func (s RateSample) Full() time.Duration { return time.Duration(s.backlog()) }

// rateSize returns the size under which the counts of an entry hold the
// TAT of a rate of this window: the window negated, which no window size
// is.
func rateSize(window time.Duration) int64 { return -int64(window) }

// HitRate decides one request of cost at the rate and, if the rate admits
// it, hits limits as Hit does, under one lock of the key: the rate is
// checked first, then the limits in order. A request the rate rejects
// changes nothing: the limits are only read (as the windows after a
// rejecting one are). A request that a limit rejects leaves the TAT as it
// was, since it was not admitted; the limits count it as Hit does (undo
// takes the increments back). rs receives the rate's state after the
// request, out each limit's window state.
//
// It returns whether the rate admitted the request and the index of the
// limit that rejected it, or -1 (always -1 when the rate rejected).
//
// synced counts the hits as already in the store, as Hit's synced does:
// a synchronous request whose round trip failed after it may have been
// applied, whose increments go to the store under its round trip's ID.
func (n *Namespace) HitRate(key string, rate Rate, cost float64, limits []Limit, value float64, fixed, undo, synced bool, out []Sample, rs *RateSample) (rateOK bool, rejected int) {
	rateOK, rejected, _ = n.hitAfterRate(key, rate, cost, limits, out, rs, func(s *shard, i int32, now int64) (int, time.Duration) {
		return n.hitEntry(s, i, now, limits, value, fixed, undo, synced, out), 0
	})
	return rateOK, rejected
}

// HitRateIfRoom is HitIfRoom with a rate checked first, under one lock:
// it counts the request only when the rate admits it and every limit has
// room for it. Otherwise it counts nothing, and returns whether the rate
// admitted it, the index of the first limit without room (-1 if none, or
// if the rate did not admit it), and how long until the request may fit
// if no other comes (Never: it never fits). rs and out receive the
// states as HitRate's do.
func (n *Namespace) HitRateIfRoom(key string, rate Rate, cost float64, limits []Limit, value float64, out []Sample, rs *RateSample) (rateOK bool, rejected int, wait time.Duration) {
	return n.hitAfterRate(key, rate, cost, limits, out, rs, func(s *shard, i int32, now int64) (int, time.Duration) {
		return n.hitIfRoomEntry(s, i, now, limits, value, out)
	})
}

// hitAfterRate decides a request of cost at the rate and, if the rate
// admits it, has hit count it on the limits, under one lock of the key;
// the TAT moves when hit returns -1, admitted by every limit. A request
// the rate rejects only reads the limits, and waits for the rate.
func (n *Namespace) hitAfterRate(key string, rate Rate, cost float64, limits []Limit, out []Sample, rs *RateSample, hit func(s *shard, i int32, now int64) (int, time.Duration)) (rateOK bool, rejected int, wait time.Duration) {
	s, i, now := n.lockEntry(key)
	defer s.mu.Unlock()
	c := s.countsFor(s.at(i), rateSize(rate.Window), true)
	next, wait := Conform(c.index, now, rate.share(n.unsyncedWeight()), cost)
	*rs = RateSample{TAT: c.index, At: now}
	if wait != 0 { // only read the limits, as those after a rejecting one
		for j, l := range limits {
			out[j] = s.read(s.at(i), l.Size, now, n.unsyncedWeight())
		}
		return false, -1, wait
	}
	// Counts never move while the lock is held (extras live in chunks
	// that stay put), so c is still the rate's.
	if rejected, wait = hit(s, i, now); rejected < 0 {
		c.index, rs.TAT = next, next
	}
	return true, rejected, wait
}

// ReadRate returns key's state under the rate's window, without changing
// it: a key the zone does not hold has its whole burst.
func (n *Namespace) ReadRate(key string, window time.Duration) RateSample {
	now := n.zone.now()
	s, i := n.lockKey(key)
	defer s.mu.Unlock()
	out := RateSample{At: now}
	if i >= 0 {
		if c := s.countsFor(s.at(i), rateSize(window), false); c != nil {
			out.TAT = c.index
		}
	}
	return out
}

// ObserveRate records the TAT a store answered for key under the rate's
// window, adding the key when the zone does not hold it, so that the
// local state stays close to the store's should the store fail. A TAT
// earlier than the zone's is ignored: the zone may have counted requests
// the store has not seen.
func (n *Namespace) ObserveRate(key string, window time.Duration, tat int64) {
	s, i, _ := n.lockEntry(key)
	defer s.mu.Unlock()
	c := s.countsFor(s.at(i), rateSize(window), true)
	c.index = max(c.index, tat)
}

// isRate reports whether c holds a rate's TAT rather than a window's
// counts.
func (c *counts) isRate() bool { return c.size < 0 }
