package window

import (
	"slices"
	"time"
)

// These are the operations a sync loop needs: take what this node added
// since the last sync, put it back when the push fails, and set what the
// store reports. A namespace only keeps track of changes while it is
// tracked, so local-only namespaces pay nothing for them.

// SetTracked turns change tracking on or off. Turning it on lists every key
// that already has a diff, so that nothing counted before is missed by the
// next Take.
func (n *Namespace) SetTracked(on bool) {
	if n.tracked.Swap(on) == on || !on {
		return
	}
	for s := range n.zone.lockAll() {
		s.forEachLive(func(i int32, e *entry) {
			if e.ns != n.id {
				return
			}
			s.forEach(e, func(c *counts) {
				if c.cur.diff != 0 || c.prev.diff != 0 {
					n.mark(s, i, e, true)
				}
			})
		})
		s.mu.Unlock()
	}
}

// Pending returns how many diffs wait for Take: one per key with a diff,
// plus those of keys that left the zone before they were taken.
func (n *Namespace) Pending() int { return int(n.dirty.Load() + n.orphans.Load()) }

// Take empties the namespace's pending diffs and returns them, with the keys
// touched (hit or read) since the last Take: the keys whose store counts
// are worth fetching. Each diff moves into the synced part of its counter
// under the counter's lock, so a visible rate never dips, and a concurrent
// Increment lands either in this batch or in the next one, never both.
func (n *Namespace) Take() (diffs []Diff, keys []string) {
	for s := range n.zone.lockAll() {
		if int(n.id) < len(s.recent) {
			l := s.recent[n.id]
			for _, i := range l {
				e := s.at(i)
				if e.ns != n.id || e.flags&flagListed == 0 {
					continue // removed or re-listed since
				}
				e.flags &^= flagListed
				// A copy of its own for each key: a key in the arena is
				// only lent, and keys sharing one string would keep all
				// of them alive as long as a caller keeps any (the
				// syncer keeps keys to fetch for several runs).
				key := cloneString(s.keyOf(e))
				keys = append(keys, key)
				if e.flags&flagDirty == 0 {
					continue
				}
				e.flags &^= flagDirty
				n.dirty.Add(-1)
				s.forEach(e, func(c *counts) {
					limit := s.limitOf(e, c)
					diffs = takeCell(diffs, key, c, c.index, &c.cur, *limit, c.prev.total())
					diffs = takeCell(diffs, key, c, c.index-1, &c.prev, *limit, 0)
					*limit = 0
				})
			}
			s.recent[n.id] = l[:0]
		}
		s.orphans = slices.DeleteFunc(s.orphans, func(o orphan) bool {
			if o.ns == n.id {
				diffs = append(diffs, o.Diff)
				n.orphanGone()
			}
			return o.ns == n.id
		})
		s.mu.Unlock()
	}
	return diffs, keys
}

func takeCell(diffs []Diff, key string, c *counts, k int64, cl *cell, limit float32, previous float64) []Diff {
	if cl.diff == 0 {
		return diffs
	}
	diffs = append(diffs, Diff{Key: key, Size: timeDuration(c.size), Start: startOf(k, c.size), Value: cl.diff, Limit: float64(limit), Previous: previous})
	cl.synced += cl.diff
	cl.diff = 0
	return diffs
}

// Restore puts back diffs that Take returned but that could not be pushed.
// Each moves from the synced part back into the diff, so the visible rate
// does not change and the next Take returns it again. A diff whose key has
// left the zone is kept aside and returned by the next Take, unless its
// window has expired.
func (n *Namespace) Restore(diffs []Diff) {
	z := n.zone
	now := z.now()
	for _, d := range diffs {
		s, i := n.lockKey(d.Key)
		k := Index(d.Start, d.Size)
		var cl *cell
		if i >= 0 {
			e := s.at(i)
			c := s.countsFor(e, int64(d.Size), true)
			if cl = c.cellAt(k); cl != nil {
				cl.diff += d.Value
				cl.synced -= d.Value
				noteLimit(s.limitOf(e, c), d.Limit)
				n.mark(s, i, e, true)
			}
		}
		if cl == nil {
			s.orphan(z, n.id, d.Key, int64(d.Size), k, d.Value, d.Limit, now)
		}
		s.mu.Unlock()
	}
}

// Apply sets counters to the totals a store reported. Diffs added since
// they were taken stay on top, so nothing this node counted is lost. Counts
// of keys the zone no longer holds are ignored.
func (n *Namespace) Apply(counts []Count) {
	for _, ct := range counts {
		s, i := n.lockKey(ct.Key)
		if i >= 0 {
			// A window size the key has no counts for yet gets them only for
			// a count worth holding.
			if c := s.countsFor(s.at(i), int64(ct.Size), ct.Value != 0); c != nil {
				if cl := c.cellAt(Index(ct.Start, ct.Size)); cl != nil {
					cl.synced = ct.Value
				}
			}
		}
		s.mu.Unlock()
	}
}

// Sweep forgets windows older than the previous one, and keys left with no
// count at all. Increments forget old windows of the keys they touch; Sweep
// is for the keys nobody touches any more, and is meant to run now and then
// (it visits every key).
func (z *Zone) Sweep() {
	now := z.now()
	for s := range z.lockAll() {
		s.forEachLive(func(i int32, e *entry) {
			// A rate's TAT still ahead of now keeps the entry too, or the
			// key would get its burst back early.
			keep := e.flags&flagDirty != 0
			s.forEachCounts(e, func(c *counts) {
				if c.isRate() {
					keep = keep || c.index > now
					return
				}
				c.advance(frameAt(now, c.size).k)
				keep = keep || c.cur != (cell{}) || c.prev != (cell{})
			})
			if !keep {
				s.remove(z, i, now)
			}
		})
		s.mu.Unlock()
	}
}

// lockAll yields the zone's shards, each locked: the caller unlocks each
// one before moving to the next, so no two are ever held at once. If a
// resize moves the keys meanwhile, it starts over on the new shards.
func (z *Zone) lockAll() func(yield func(*shard) bool) {
	return func(yield func(*shard) bool) {
		for i := 0; ; i++ {
			shards := z.current()
			if i >= len(shards) {
				return
			}
			s := shards[i]
			s.mu.Lock()
			if s.retired {
				s.mu.Unlock()
				i = -1
				continue
			}
			if !yield(s) {
				return
			}
		}
	}
}

// Observe records the counts a store answered for one hit in synchronous
// mode: current for key's window of the given size starting at start (Unix
// nanoseconds) and previous for the window before it. Unlike Apply, it adds
// the key when the zone does not hold it, so that local counts stay close
// to the store's if the store later fails. It returns the key's state now:
// the store's counts plus any diff this node could not push yet.
func (n *Namespace) Observe(key string, size time.Duration, start int64, current, previous float64) Sample {
	return n.observe(key, size, start, current, previous, false)
}

// ObserveAtLeast is Observe for an answer that may predate a push of this
// node's diffs which landed before the caller could see it on its way:
// the counts only rise, so that the node never forgets its own hits.
func (n *Namespace) ObserveAtLeast(key string, size time.Duration, start int64, current, previous float64) Sample {
	return n.observe(key, size, start, current, previous, true)
}

func (n *Namespace) observe(key string, size time.Duration, start int64, current, previous float64, atLeast bool) Sample {
	s, i, now := n.lockEntry(key)
	defer s.mu.Unlock()
	e := s.at(i)
	c := s.countsFor(e, int64(size), true)
	k := Index(start, size)
	if cl := c.cellAt(k); cl != nil && (!atLeast || current > cl.synced) {
		cl.synced = current
	}
	if cl := c.cellAt(k - 1); cl != nil && (!atLeast || previous > cl.synced) {
		cl.synced = previous
	}
	n.mark(s, i, e, false)
	f := frameAt(now, int64(size))
	c.advance(f.k)
	return c.sample(f, now, n.unsyncedWeight())
}
