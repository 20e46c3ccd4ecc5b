package window

// Unsynced is what a near hit found of one limit's window that the store
// does not have yet: this node's diffs.
type Unsynced struct {
	// Taken is the current window's diff, taken out of the pending diffs
	// (as Take does) so that the caller carries it to the store with its
	// hit, or gives it back with Restore.
	Taken float64
	// Previous is the previous window's diff, left pending.
	Previous float64
}

// HitUnlessNear is Hit for a namespace that counts keys near their limits
// at the store (sync_above), with one look-up of the key. The local
// counts are a lower bound of the fleet's (what the store last reported
// plus this node's own hits), so a hit that takes some limit's rate past
// its Max is surely rejected, and one that keeps every limit's rate below
// near times its Max is far from any limit: both are counted here, as Hit
// counts them, and HitUnlessNear reports false. A hit whose rate reaches
// near times a Max is near: the store decides the hit that brings a key
// to sync_above of its limit.
//
// Any other hit is near a limit, where only the store can decide: it
// counts nothing and reports true, out receives each limit's window
// state without the hit, and unsynced receives each limit's diffs. The
// current windows' diffs are taken: their visible counts do not change,
// but no sync pushes them, so the caller's hit must carry them, or the
// caller must give back those the store did not apply.
func (n *Namespace) HitUnlessNear(key string, limits []Limit, value float64, fixed, undo bool, near float64, out []Sample, unsynced []Unsynced) (rejected int, isNear bool) {
	s, i, now := n.lockEntry(key)
	defer s.mu.Unlock()
	// Count the hit as Hit does, which is what all but near hits need;
	// a near one is taken back.
	if rejected = n.hitEntry(s, i, now, limits, value, fixed, undo, false, out); rejected >= 0 {
		return rejected, false
	}
	for j, l := range limits {
		isNear = isNear || out[j].Rate(fixed) >= near*l.Max
	}
	if !isNear {
		return -1, false
	}
	e := s.at(i)
	for j, l := range limits {
		c, f := s.window(e, int64(l.Size), now, false) // the hit created it
		c.cur.diff -= value
		out[j] = c.sample(f, now, n.unsyncedWeight())
		unsynced[j] = Unsynced{Taken: c.cur.diff}
		if c.index == f.k {
			unsynced[j].Previous = c.prev.diff
		}
		c.cur.synced, c.cur.diff = c.cur.total(), 0
	}
	return -1, true
}
