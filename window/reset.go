package window

import (
	"cmp"
	"slices"
	"time"
)

// These are the operations an operator runs on one key: look at its
// windows, and reset them. Neither is on the path of a hit.

// KeyWindow is one window size of a key as a zone holds it: the sample a
// read would give, and the parts of its counts that this node has not
// pushed to a store yet.
type KeyWindow struct {
	Sample
	// PendingCurrent is the part of Current that waits to be pushed.
	PendingCurrent float64
	// PendingPrevious is the part of Previous that waits to be pushed.
	PendingPrevious float64
}

// Inspect returns key's windows of every size the zone holds for it, by
// ascending size, at the zone's clock. Unlike Read it changes nothing: the
// key is not marked as used (for eviction) or as touched (for the next
// sync). A key the zone does not hold has no windows.
func (n *Namespace) Inspect(key string) []KeyWindow {
	now := n.zone.now()
	s, i := n.lockKey(key)
	defer s.mu.Unlock()
	if i < 0 {
		return nil
	}
	var out []KeyWindow
	s.forEach(s.at(i), func(c *counts) {
		f := frameAt(now, c.size)
		cp := *c // advanced as a read would, without writing it back
		cp.advance(f.k)
		w := KeyWindow{Sample: cp.sample(f, now, 1), PendingCurrent: cp.cur.diff}
		if cp.index <= f.k {
			w.PendingPrevious = cp.prev.diff
		}
		out = append(out, w)
	})
	slices.SortFunc(out, func(a, b KeyWindow) int { return cmp.Compare(a.Size, b.Size) })
	return out
}

// Reset zeroes every window of key, current and previous, of every size,
// and gives the key its whole burst under every rate (see gcra.go):
// both what the store last reported and what this node counted since.
// The diffs of key that wait to be pushed, including those of a time the
// key was evicted, are dropped, so that no later Take pushes anything
// counted before the reset. It returns the window sizes the key held,
// ascending.
//
// The key stays in the zone, and in a tracked namespace it is marked as
// touched, so that the next sync fetches its counts from the store. A
// concurrent Increment lands either before the reset (and is erased) or
// after it (and counts, and is pushed), never both. A caller that syncs
// must not reset between a Take and the Restore of what it took (the
// Restore would bring the taken diffs back): a sync loop resets between
// its runs.
func (n *Namespace) Reset(key string) []time.Duration {
	s, i := n.lockKey(key)
	defer s.mu.Unlock()
	var sizes []time.Duration
	if i >= 0 {
		e := s.at(i)
		s.forEachCounts(e, func(c *counts) {
			if c.isRate() {
				c.index = 0 // the whole burst again
				return
			}
			c.cur, c.prev = cell{}, cell{}
			sizes = append(sizes, timeDuration(c.size))
		})
		if e.flags&flagDirty != 0 {
			e.flags &^= flagDirty
			n.dirty.Add(-1)
		}
		n.mark(s, i, e, false)
	}
	// Orphans of a key live in the shard the key hashes to (see remove,
	// Restore and reshard).
	s.orphans = slices.DeleteFunc(s.orphans, func(o orphan) bool {
		gone := o.ns == n.id && o.Key == key
		if gone {
			n.orphanGone()
		}
		return gone
	})
	slices.Sort(sizes)
	return sizes
}

// Len returns how many keys of the namespace the zone holds. It visits
// every key of the zone, one shard at a time, so it is for operators, not
// for every request.
func (n *Namespace) Len() int {
	keys := 0
	for s := range n.zone.lockAll() {
		s.forEachLive(func(_ int32, e *entry) {
			if e.ns == n.id {
				keys++
			}
		})
		s.mu.Unlock()
	}
	return keys
}
