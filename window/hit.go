package window

import (
	"math"
	"time"
)

// Limit is one limit a hit is checked against.
type Limit struct {
	// Size is the window size.
	Size time.Duration
	// Max is the most the window's rate may be after a hit; past it the hit
	// is rejected. math.Inf(1) never rejects.
	Max float64
}

// Exceeds reports whether a rate is over a limit, Max: +Inf never is
// exceeded and -Inf always is, whatever the rate. It is the one rule of
// the zones and the stores that decide in Go.
func Exceeds(rate, max float64) bool {
	return rate > max && !math.IsInf(max, 1) || math.IsInf(max, -1)
}

// Hit counts one hit of value against limits, in the order given
// (ascending window size), the way Kong decides: each limit's current
// window is incremented, then its rate (sliding, or the current count
// alone with fixed) compared with Max; once one limit rejects, the windows
// after it are only read. With undo, a rejected hit's increments are
// taken back (disable_penalty). With synced, the increments count as the
// store's and are never pushed (see IncrementSynced).
//
// It is what a sequence of Increment and Read calls would do, with one
// look-up of the key under one lock, so that no other hit of the key
// interleaves. out receives each limit's window state after the hit and
// must be as long as limits. Hit returns the index of the limit that
// rejected, or -1.
func (n *Namespace) Hit(key string, limits []Limit, value float64, fixed, undo, synced bool, out []Sample) int {
	s, i, now := n.lockEntry(key)
	defer s.mu.Unlock()
	return n.hitEntry(s, i, now, limits, value, fixed, undo, synced, out)
}

// hitEntry is Hit on entry i of s, whose lock the caller holds.
func (n *Namespace) hitEntry(s *shard, i int32, now int64, limits []Limit, value float64, fixed, undo, synced bool, out []Sample) int {
	e := s.at(i)
	m := n.unsyncedWeight()
	rejected := -1
	for j, l := range limits {
		if rejected >= 0 {
			out[j] = s.read(e, l.Size, now, m)
			continue
		}
		c, f := s.window(e, int64(l.Size), now, true)
		c.count(f, now, value, synced)
		if value > 0 && !synced {
			noteLimit(s.limitOf(e, c), l.Max)
		}
		out[j] = c.sample(f, now, m)
		if Exceeds(out[j].Rate(fixed), l.Max) {
			rejected = j
		}
	}
	if rejected >= 0 && undo {
		for j := 0; j <= rejected; j++ {
			c, f := s.window(e, int64(limits[j].Size), now, false)
			c.count(f, now, -value, synced)
			out[j] = c.sample(f, now, m)
		}
	}
	n.mark(s, i, e, !synced)
	return rejected
}
