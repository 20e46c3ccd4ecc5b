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
	return s.run(ctx, checkBatch(b), func(d *data, now int64) {
		m := marker{b.Namespace, b.ID}
		if _, ok := d.markers.get(m, now); ok {
			return // applied before: a retry, or the diffs of a hit
		}
		last := int64(math.MinInt64) // the latest expiry of the counters written
		var marks []strategy.NearMark
		for i := range b.Diffs {
			df := &b.Diffs[i]
			c := counter{b.Namespace, df.Key, df.Size, df.Start}
			if df.Value == 0 || !finite(df.Value) || c.expiresAt() <= now {
				continue
			}
			count := d.add(c, df.Value, now)
			last = max(last, c.expiresAt())
			if strategy.Crosses(strategy.NearAt(b.Near, df), count, df.Value) {
				marks = append(marks, strategy.NearMark{Key: df.Key, Until: strategy.NearUntil(df)})
			}
		}
		d.markNear(b.Namespace, marks, now)
		for _, r := range b.Rates {
			k := rateKey{b.Namespace, r.Key, r.Window}
			_, next, _ := d.turn(k, r.Increment, forced, now)
			d.setTAT(k, next, now)
			last = max(last, now)
		}
		if last != math.MinInt64 {
			d.markers.set(m, struct{}{}, max(last, now+int64(strategy.MinBatchIDLife)), now)
		}
	})
}

// checkBatch returns why a batch is refused whole, or nil.
func checkBatch(b strategy.Batch) error {
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
	return strategy.CheckNear(b.Near)
}

// GetCounters returns the counts of the current and previous windows, at
// now, of every size of every key, leaving out the counters the data set
// does not hold (never written, or expired). A counter that was reset is
// held, with the value zero. It looks up 2*len(keys)*len(sizes) counters,
// whatever the size of the namespace. A size that is not valid is refused
// with an error that wraps strategy.ErrRejected.
func (s *Store) GetCounters(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time) (counts []window.Count, err error) {
	defer errs.GetCounters(&err, namespace, len(keys))
	err = s.run(ctx, strategy.CheckSizes(sizes), func(d *data, clock int64) {
		d.lookups.Add(int64(2 * len(keys) * len(sizes)))
		for _, key := range keys {
			for _, size := range sizes {
				cur := window.Start(now.UnixNano(), size)
				for _, start := range [2]int64{cur, cur - int64(size)} {
					if v, ok := d.get(counter{namespace, key, size, start}, clock); ok {
						counts = append(counts, window.Count{Key: key, Size: size, Start: start, Value: v})
					}
				}
			}
		}
	})
	return counts, err
}

// Reset sets key's counters of the window holding now and of the one
// before it, of every given size, to zero: they are then held, and fetched
// as zero, until they expire, and diffs pushed later add to zero. A size
// that is not valid is refused, before anything is reset, with an error
// that wraps strategy.ErrRejected.
func (s *Store) Reset(ctx context.Context, namespace, key string, sizes []time.Duration, now time.Time) (err error) {
	defer errs.Reset(&err, namespace)
	return s.run(ctx, strategy.CheckSizes(sizes), func(d *data, clock int64) {
		for _, size := range sizes {
			cur := window.Start(now.UnixNano(), size)
			d.put(counter{namespace, key, size, cur}, 0, clock)
			d.put(counter{namespace, key, size, cur - int64(size)}, 0, clock)
		}
	})
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
	err := s.run(ctx, nil, func(d *data, now int64) {
		apply := d.markHits(namespace, id, now, hits, good)
		for _, i := range good {
			h, r := &hits[i], &results[i]
			if h.Slot != nil {
				r.Slot = d.acquireSlot(namespace, h.Key, *h.Slot, now)
				continue
			}
			if h.Rate == nil {
				r.Counts, r.Rejected = d.hit(namespace, h, apply, now)
				continue
			}
			k := rateKey{namespace, h.Key, h.Rate.Window}
			tat, next, ok := d.turn(k, h.Rate.Increment, h.Rate.Tolerance, now)
			r.Rate = strategy.RateReply{OK: ok, TAT: tat * 1e3, Now: now / 1e3 * 1e3}
			r.Counts, r.Rejected = d.hit(namespace, h, apply && ok, now)
			if !ok {
				r.Rejected = -1 // the rate refused it; its windows were only read
			} else if apply && r.Rejected < 0 {
				d.setTAT(k, next, now)
				r.Rate.TAT = next * 1e3
			}
		}
	})
	if err != nil {
		errs.FailBatch(results, namespace, good, err)
	}
}

// markHits records, unless id is empty, that the good hits of ID id were
// applied at now, and reports whether they are to be applied: not if the
// ID was applied before (the same hits again, or their batch came first).
// The marker lives as long as the latest of the hits' counters, but at
// least strategy.MinHitIDLife and at most strategy.MaxHitIDLife.
func (d *data) markHits(namespace, id string, now int64, hits []strategy.HitRequest, good []int) bool {
	m := marker{namespace, id}
	if id == "" {
		return true
	} else if _, ok := d.markers.get(m, now); ok {
		return false
	}
	last := int64(math.MinInt64)
	for _, i := range good {
		for _, w := range hits[i].Windows {
			last = max(last, counter{size: w.Size, start: w.Start}.expiresAt())
		}
	}
	life := min(max(last-now, int64(strategy.MinHitIDLife)), int64(strategy.MaxHitIDLife))
	d.markers.set(m, struct{}{}, now+life, now)
	return true
}

// hit applies one hit to its windows in Kong's order, deciding each by
// window's rule (window.Exceeds), unless apply is false: then it only
// reads the counts and decides on them. It returns each window's counts
// and the index of the window that rejected the hit, or -1.
func (d *data) hit(namespace string, h *strategy.HitRequest, apply bool, now int64) ([]strategy.WindowCounts, int) {
	counts := make([]strategy.WindowCounts, len(h.Windows))
	rejected := -1
	for i, w := range h.Windows {
		cur := counter{namespace, h.Key, w.Size, w.Start}
		c := &counts[i]
		c.Current, _ = d.get(cur, now)
		if apply && rejected < 0 && w.Value != 0 {
			c.Current = d.add(cur, w.Value, now)
		}
		c.Previous, _ = d.get(counter{namespace, h.Key, w.Size, w.Start - int64(w.Size)}, now)
		sample := window.Sample{Current: c.Current, Previous: c.Previous, Weight: w.Weight}
		if rejected < 0 && window.Exceeds(sample.Sliding(), w.Max) {
			rejected = i
		}
	}
	if apply && h.Undo && rejected >= 0 {
		// Every window up to the one that rejected was incremented.
		for i, w := range h.Windows[:rejected+1] {
			if w.Value != 0 {
				counts[i].Current = d.add(counter{namespace, h.Key, w.Size, w.Start}, -w.Value, now)
			}
		}
	}
	return counts, rejected
}

// Counters returns how many counters the data set holds for a namespace,
// after dropping the expired ones.
func (s *Store) Counters(namespace string) (n int) {
	s.lock(func(d *data, _ int64) {
		for c := range d.counters.m {
			if c.namespace == namespace {
				n++
			}
		}
	})
	return n
}

// finite reports whether v can be added to a counter.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
