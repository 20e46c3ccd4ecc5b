package syncapp

import (
	"fmt"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// Rates: the generic cell rate algorithm (GCRA) of nginx's limit_req,
// beside the windows (see window/gcra.go). A key's state under a rate is
// one timestamp, its theoretical arrival time (TAT), which the zone
// holds. Only local namespaces decide rates: a periodic namespace refuses
// them at load (CheckRate), since a TAT is not a count and the TATs that
// nodes move on their own do not add up into the fleet's the way window
// diffs do; a synchronous one refuses them too until the stores can
// decide them in one round trip.

// Rate is a GCRA limit a request is checked against: N requests per
// Window, and Burst more at once.
type Rate = window.Rate

// RateSample is a key's state under a rate at an instant.
type RateSample = window.RateSample

// CheckRate returns an error, naming the namespace and what to do, when
// the namespace cannot decide rates: any namespace with a store. A
// periodic one never can (see above); a synchronous one cannot yet.
func (n *Namespace) CheckRate() error {
	switch n.mode {
	case Periodic:
		return fmt.Errorf("namespace %q syncs every %v: a rate (GCRA) keeps one timestamp per key, which does not add up across nodes the way window counts do; use a local namespace (sync_rate 0, where the store would decide, cannot decide rates yet)",
			n.name, time.Duration(n.rate))
	case Synchronous:
		return fmt.Errorf("namespace %q has sync_rate 0: the stores cannot decide rates (GCRA) yet; use a local namespace", n.name)
	}
	return nil
}

// HitRate decides one request of cost at rate, then, if the rate admits
// it, hits limits as Hit does: the rate first, then the limits in order,
// under one lock of the key in the zone. A request the rate rejects
// counts in no window (the limits are only read into out); one a limit
// rejects leaves the rate's state as it was, the limits counting it as
// Hit does (undo takes it back). rs receives the rate's state after the
// request, out each limit's window. It returns whether the rate admitted
// the request and the index of the limit that rejected it, or -1.
//
// It decides on this node's state, in every mode: handlers use rates in
// local namespaces only (CheckRate).
func (n *Namespace) HitRate(key string, rate Rate, cost float64, limits []Limit, value float64, fixed, undo bool, out []window.Sample, rs *RateSample) (rateOK bool, rejected int) {
	return n.counters.HitRate(key, rate, cost, limits, value, fixed, undo, out, rs)
}

// HitRateIfRoom is HitIfRoom with a rate checked first, on this node's
// state (see HitRate): it counts the request only when the rate admits it
// and every limit has room for it, and otherwise counts nothing and
// returns whether the rate admitted it, the first limit without room (or
// -1), and how long until the request may fit if no other comes
// (negative: never).
func (n *Namespace) HitRateIfRoom(key string, rate Rate, cost float64, limits []Limit, value float64, out []window.Sample, rs *RateSample) (rateOK bool, rejected int, wait time.Duration) {
	return n.counters.HitRateIfRoom(key, rate, cost, limits, value, out, rs)
}

// PeekRate returns key's state under the rate's window on this node,
// without changing it.
func (n *Namespace) PeekRate(key string, window time.Duration) RateSample {
	return n.counters.ReadRate(key, window)
}
