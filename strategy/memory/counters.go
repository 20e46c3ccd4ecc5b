package memory

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// ErrInvalidWindow is wrapped by the errors of operations given a window
// the store does not take: a size that is not a positive whole number of
// milliseconds, or a start that is not a multiple of the size. It is
// strategy.ErrInvalidWindow, which wraps strategy.ErrRejected, as such a
// request can never succeed.
var ErrInvalidWindow = strategy.ErrInvalidWindow

// PushDiffs adds the diffs of a batch to their counters, and takes its
// rates' turns (see strategy.RateBatcher), at most once per batch ID and
// namespace: a batch whose ID was applied before (pushed
// before, or a synchronous hit of that ID) applies nothing and succeeds.
// The batch is applied all at once or not at all. Diffs with a zero or
// non-finite value add nothing and are dropped, and diffs of windows that
// have expired are skipped; a batch of which nothing is left records no ID.
// A batch without an ID, or with a window that is not valid, is refused
// whole with an error that wraps strategy.ErrRejected.
func (s *Store) PushDiffs(ctx context.Context, b strategy.Batch) (err error) {
	defer errs.PushDiffs(&err, b)
	if err := s.check(ctx); err != nil {
		return err
	}
	if b.ID == "" {
		return errs.Rejected("the batch has no ID")
	}
	for i := range b.Diffs {
		if err := strategy.CheckWindow(b.Diffs[i].Size, b.Diffs[i].Start); err != nil {
			return fmt.Errorf("diffs[%d]: %w", i, err)
		}
	}
	if err := strategy.CheckRateDiffs(b.Rates); err != nil {
		return err
	}
	if err := strategy.CheckNear(b.Near); err != nil {
		return err
	}
	now := s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(now)
	m := marker{b.Namespace, b.ID}
	if d.marked(m, now) {
		return nil // applied before: a retry, or the diffs of a hit
	}
	last := int64(math.MinInt64) // the latest expiry of the counters written
	var marks []strategy.NearMark
	for i := range b.Diffs {
		df := &b.Diffs[i]
		c := cell{df.Key, df.Size, df.Start}
		if df.Value == 0 || !finite(df.Value) || c.expiresAt() <= now {
			continue
		}
		count := d.add(b.Namespace, c, df.Value, now)
		last = max(last, c.expiresAt())
		if strategy.Crosses(strategy.NearAt(b.Near, df), count, df.Value) {
			marks = append(marks, strategy.NearMark{Key: df.Key, Until: strategy.NearUntil(df)})
		}
	}
	d.markNear(b.Namespace, marks, now)
	if len(b.Rates) > 0 {
		rd := d.ratesLocked()
		rd.sweep(now)
		for _, r := range b.Rates {
			k := rateKey{b.Namespace, r.Key, r.Window}
			next, _ := strategy.ConformMicros(rd.tat(k), now/1e3, r.Increment.Microseconds(), 0, true)
			rd.setTAT(k, next)
		}
		last = max(last, now)
	}
	if last != math.MinInt64 {
		d.mark(m, max(last, now+int64(strategy.MinBatchIDLife)))
	}
	return nil
}

// GetCounters returns the counts of the current and previous windows, at
// now, of every size of every key, leaving out the counters the data set
// does not hold (never written, or expired). A counter that was reset is
// held, with the value zero. It looks up 2*len(keys)*len(sizes) counters,
// whatever the size of the namespace. A size that is not valid is refused
// with an error that wraps strategy.ErrRejected.
func (s *Store) GetCounters(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time) (_ []window.Count, err error) {
	defer errs.GetCounters(&err, namespace, len(keys))
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	if err := strategy.CheckSizes(sizes); err != nil {
		return nil, err
	}
	if len(keys) == 0 || len(sizes) == 0 {
		return nil, nil
	}
	at, clock := now.UnixNano(), s.now().UnixNano()
	d := s.data
	d.lookups.Add(int64(2 * len(keys) * len(sizes)))
	d.mu.Lock()
	defer d.mu.Unlock()
	var counts []window.Count
	for _, key := range keys {
		for _, size := range sizes {
			cur := window.Start(at, size)
			for _, start := range [2]int64{cur, cur - int64(size)} {
				if v, ok := d.get(namespace, cell{key, size, start}, clock); ok {
					counts = append(counts, window.Count{Key: key, Size: size, Start: start, Value: v})
				}
			}
		}
	}
	return counts, nil
}

// Reset sets key's counters of the window holding now and of the one
// before it, of every given size, to zero: they are then held, and fetched
// as zero, until they expire, and diffs pushed later add to zero. A size
// that is not valid is refused, before anything is reset, with an error
// that wraps strategy.ErrRejected.
func (s *Store) Reset(ctx context.Context, namespace, key string, sizes []time.Duration, now time.Time) (err error) {
	defer errs.Reset(&err, namespace)
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := strategy.CheckSizes(sizes); err != nil {
		return err
	}
	at, clock := now.UnixNano(), s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(clock)
	for _, size := range sizes {
		cur := window.Start(at, size)
		d.put(namespace, cell{key, size, cur}, 0, clock)
		d.put(namespace, cell{key, size, cur - int64(size)}, 0, clock)
	}
	return nil
}

// Hit applies one synchronous hit as a batch of one (see HitBatch, and
// strategy.Hitter for the contract and the hit ID rule).
func (s *Store) Hit(ctx context.Context, namespace, key, id string, windows []strategy.WindowHit, undo bool) ([]strategy.WindowCounts, int, error) {
	return strategy.HitAsBatch(ctx, s, namespace, key, id, windows, undo)
}

// HitBatch applies several synchronous hits, atomically, in the order
// given, each deciding as if they were sent one after the other (see
// strategy.BatchHitter), a hit with a rate deciding it first (see
// strategy.RateBatcher) and a hit with a slot taking it (see
// strategy.SlotBatcher). A non-empty id names the batch, and shares its
// marker with a batch of diffs of the same ID and namespace, so the two
// are applied at most once between them; a batch whose ID was applied
// before applies nothing and decides every hit on the counts as they are.
// The marker lives as long as the latest counter of the batch's hits, but
// at least a minute and at most two. A bad hit (strategy.CheckHitRequest)
// gets the error in its result, and the others are applied all the same.
func (s *Store) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	good := errs.CheckBatch(namespace, id, hits, results)
	if len(good) == 0 {
		return
	}
	if err := s.check(ctx); err != nil {
		errs.FailBatch(results, namespace, good, err)
		return
	}
	now := s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(now)
	var windows []strategy.WindowHit
	for _, i := range good {
		windows = append(windows, hits[i].Windows...)
	}
	apply := d.markHits(namespace, id, now, windows)
	for _, i := range good {
		h, r := &hits[i], &results[i]
		if h.Slot != nil {
			r.Slot = d.acquireSlot(namespace, h.Key, *h.Slot, now)
			continue
		}
		if h.Rate == nil {
			r.Counts, r.Rejected = d.hit(namespace, h.Key, h.Windows, h.Undo, apply, now)
			continue
		}
		rd := d.ratesLocked()
		rd.sweep(now)
		k := rateKey{namespace, h.Key, h.Rate.Window}
		tat := rd.tat(k)
		nowUs := now / 1e3
		next, ok := strategy.ConformMicros(tat, nowUs, h.Rate.Increment.Microseconds(), h.Rate.Tolerance.Microseconds(), false)
		r.Rate = strategy.RateReply{OK: ok, TAT: tat * 1e3, Now: nowUs * 1e3}
		r.Counts, r.Rejected = d.hit(namespace, h.Key, h.Windows, h.Undo, apply && ok, now)
		if !ok {
			r.Rejected = -1 // the rate refused it; its windows were only read
		} else if apply && r.Rejected < 0 {
			rd.setTAT(k, next)
			r.Rate.TAT = next * 1e3
		}
	}
}

// markHits records, unless id is empty, that the hits of ID id with these
// windows were applied at now, and reports whether they are to be applied:
// not if the ID was applied before (the same hits again, or their batch
// came first). The marker lives as long as the latest of the windows'
// counters, but at least strategy.MinHitIDLife and at most
// strategy.MaxHitIDLife.
func (d *data) markHits(namespace, id string, now int64, windows []strategy.WindowHit) bool {
	if id == "" {
		return true
	}
	m := marker{namespace, id}
	if d.marked(m, now) {
		return false
	}
	last := int64(math.MinInt64)
	for _, w := range windows {
		last = max(last, cell{"", w.Size, w.Start}.expiresAt())
	}
	life := min(max(last-now, int64(strategy.MinHitIDLife)), int64(strategy.MaxHitIDLife))
	d.mark(m, now+life)
	return true
}

// hit applies one hit of key to its windows, as Hit does, unless apply is
// false: then it only reads the counts and decides on them. It returns
// each window's counts and the index of the window that rejected the hit,
// or -1.
func (d *data) hit(namespace, key string, windows []strategy.WindowHit, undo, apply bool, now int64) ([]strategy.WindowCounts, int) {
	counts := make([]strategy.WindowCounts, len(windows))
	rejected := -1
	for i, w := range windows {
		cur := cell{key, w.Size, w.Start}
		c := &counts[i]
		if apply && rejected < 0 && w.Value != 0 {
			c.Current = d.add(namespace, cur, w.Value, now)
		} else {
			c.Current, _ = d.get(namespace, cur, now)
		}
		c.Previous, _ = d.get(namespace, cell{key, w.Size, w.Start - int64(w.Size)}, now)
		if rejected < 0 && exceeds(c.Current+c.Previous*w.Weight, w.Max) {
			rejected = i
		}
	}
	if apply && undo && rejected >= 0 {
		// Every window up to the one that rejected was incremented.
		for i, w := range windows[:rejected+1] {
			if w.Value != 0 {
				counts[i].Current = d.add(namespace, cell{key, w.Size, w.Start}, -w.Value, now)
			}
		}
	}
	return counts, rejected
}

// exceeds reports whether a rate exceeds a limit: +Inf never is exceeded
// and -Inf always is, whatever the rate, as in Redis.
func exceeds(rate, limit float64) bool {
	switch {
	case math.IsInf(limit, 1):
		return false
	case math.IsInf(limit, -1):
		return true
	}
	return rate > limit
}

// Counters returns how many counters the data set holds for a namespace,
// after dropping the expired ones.
func (s *Store) Counters(namespace string) int {
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(s.now().UnixNano())
	return len(d.spaces[namespace])
}

// finite reports whether v can be added to a counter.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
