package accuracy

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// FetchBeat is how long after the aligned instant at which every node
// pushes a periodic node fetches the merged counts: syncapp's fetchBeat, a
// fifth of the interval, at most 10ms. The lag check counts on it.
func FetchBeat(interval time.Duration) time.Duration {
	return min(interval/5, 10*time.Millisecond)
}

// FetchAllowance is how long after a fetch starts the lag check takes its
// counts as applied: the fetch's round trip on loopback, and the step of
// the millisecond clock that times the answers.
const FetchAllowance = 2 * time.Millisecond

// Unexplained is an admission past the limit that the other nodes' unseen
// hits do not explain: the node admitted it although its count, even
// missing every hit the others made since the last sync it could have
// fetched, was at the limit. Its count was older than the design allows:
// a run came late, or the node had not fetched the key.
type Unexplained struct {
	Key int
	// AtMs is when the node admitted it, in milliseconds after its
	// window's start.
	AtMs int64
	Node int
	// Before is how many the fleet had admitted in the window before it,
	// and Unseen how many of those the other nodes admitted since the
	// aligned push whose fetch the node could have made by then.
	Before, Unseen int
}

func (u Unexplained) String() string {
	return fmt.Sprintf("key %d at %dms@node%d: %d admitted before it, %d of them unseen", u.Key+1, u.AtMs, u.Node+1, u.Before, u.Unseen)
}

// checkLag checks each admission past the limit in one window of one key
// (its admitted requests, in any order) against the periodic design. A
// node admits a request only while its count is under the limit, and by a
// time t its count holds every hit the others pushed at the aligned
// instants P whose fetch (at P + beat) has come back, P + beat +
// FetchAllowance ≤ t: only their hits since the last such P are unseen.
// So the i-th admission (i admitted before it) must have
// i < limit + unseen. It returns how many admissions it checked and those
// that break this.
func checkLag(reqs []Result, key int, windowStartMs int64, limit float64, interval time.Duration) (checked int, bad []Unexplained) {
	reqs = slices.Clone(reqs)
	slices.SortStableFunc(reqs, func(a, b Result) int { return cmp.Compare(a.ServerMs, b.ServerMs) })
	iv, beat := interval.Milliseconds(), (FetchBeat(interval) + FetchAllowance).Milliseconds()
	if iv <= 0 {
		return 0, nil
	}
	for i, r := range reqs {
		if float64(i) < limit {
			continue
		}
		checked++
		// The last aligned push whose fetch the node had back by r. A hit
		// in the same millisecond as that push counts as unseen.
		pushed := (r.ServerMs - beat) / iv * iv
		unseen := 0
		for _, o := range reqs[:i] {
			if o.Node != r.Node && o.ServerMs >= pushed {
				unseen++
			}
		}
		if float64(i) >= limit+float64(unseen) {
			bad = append(bad, Unexplained{Key: key, AtMs: r.ServerMs - windowStartMs, Node: r.Node, Before: i, Unseen: unseen})
		}
	}
	return checked, bad
}
