package window

import "time"

// HitIfRoom is Hit for a request that may wait for its turn (max_delay),
// judged by the hits that can lie in the last window length rather than
// by the sliding estimate. A window's hits leave the last window length
// once its last hit does: this node stamps its hits, and counts that the
// store reported are taken as late as they can be (the previous window's
// at its end, the current window's now). So no span of one window length
// ever holds more than Max hits of those this node counts, however the
// previous window's hits were spread, which the estimate, assuming them
// spread evenly, cannot promise after a burst.
//
// It counts the hit when every limit has room for value, and returns -1;
// out then receives each limit's window state after it. Otherwise it
// counts nothing and returns the index of the first limit without room,
// and how long until every limit has room if no other hit comes, or a
// negative duration if some limit can never hold value.
func (n *Namespace) HitIfRoom(key string, limits []Limit, value float64, out []Sample) (rejected int, wait time.Duration) {
	s, i, now := n.lockEntry(key)
	defer s.mu.Unlock()
	return n.hitIfRoomEntry(s, i, now, limits, value, out)
}

// hitIfRoomEntry is HitIfRoom on entry i of s, whose lock the caller
// holds.
func (n *Namespace) hitIfRoomEntry(s *shard, i int32, now int64, limits []Limit, value float64, out []Sample) (rejected int, wait time.Duration) {
	e := s.at(i)
	m := n.unsyncedWeight()
	rejected = -1
	for j, l := range limits {
		c, f := s.window(e, int64(l.Size), now, true)
		if w := c.untilRoom(f, now, value, l.Max, m); w != 0 {
			if rejected < 0 {
				rejected = j
			}
			if w < 0 || wait < 0 {
				wait = -1
			} else {
				wait = max(wait, w)
			}
		}
	}
	if rejected >= 0 {
		return rejected, wait
	}
	for j, l := range limits {
		c, f := s.window(e, int64(l.Size), now, false)
		c.count(f, now, value, false)
		if value > 0 {
			noteLimit(s.limitOf(e, c), l.Max)
		}
		out[j] = c.sample(f, now, m)
	}
	n.mark(s, i, e, true)
	return -1, 0
}

// roomMargin is how much later than a window length after a window's last
// hit HitIfRoom takes its hits to be gone: a hit admitted at the end of a
// wait is then a window length and a millisecond after the hits it waited
// for, which anyone timing the two, a little after each, still sees.
const roomMargin = int64(time.Millisecond)

// untilRoom returns how long after now the windows' hits that can lie in
// the last window length leave room for value within max: 0 if they do
// now, negative if they never will. This node's unsynced counts, value
// included, count m times (see Namespace.SetUnsyncedWeight). c's current
// window is f's.
func (c *counts) untilRoom(f frame, now int64, value, max, m float64) time.Duration {
	value *= m
	if value > max {
		return -1
	}
	if calendarOf(c.size) != nil {
		// Fixed: its hits all leave at its end.
		if c.cur.weighted(m)+value <= max {
			return 0
		}
		return time.Duration(f.end - now)
	}
	start := f.start
	// When each window's hits have all left the last window length.
	prevGone := c.lastHit(start-c.size, c.prevAt, c.prev, start) + c.size + roomMargin
	curGone := c.lastHit(start, c.curAt, c.cur, now) + c.size + roomMargin
	cur, prev := c.cur.weighted(m), c.prev.weighted(m)
	if prevGone <= now {
		prev = 0
	}
	switch {
	case cur+prev+value <= max:
		return 0
	case cur+value <= max:
		return time.Duration(prevGone - now)
	default:
		return time.Duration(curGone - now) // curGone > now: the window holds now
	}
}

// lastHit returns when the last hit of the window starting at start
// happened, at the latest: its stamp, or latest when the store reported
// some of its count (another node's hits have no stamp here) or the stamp
// cannot tell.
func (c *counts) lastHit(start int64, at uint32, cell cell, latest int64) int64 {
	if cell.synced != 0 || at == stampEnd || at == 0 && cell.diff != 0 {
		return latest
	}
	return start + int64(at)*1e6
}
