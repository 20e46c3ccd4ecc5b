package syncapp

import (
	"context"
	"errors"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// hit is a synchronous Namespace.Hit in one round trip to ns's store. It
// reports false when the hit must be counted locally as a pending diff
// instead: the store refused the windows, or the request surely never
// reached it. When the request failed after it may have been applied, the
// hit counts locally as the store's and is queued for a retry under its
// own ID, which the store skips if it applied the hit.
func (s *syncer) hit(ctx context.Context, ns *Namespace, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample) (int, bool) {
	now := window.SystemClock()
	windows := make([]strategy.WindowHit, len(limits))
	for i, l := range limits {
		windows[i] = strategy.WindowHit{Size: l.Size, Start: window.Start(now, l.Size), Value: value, Max: l.Max}
		if !fixed {
			windows[i].Weight = window.Weight(now, l.Size)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, hitTimeout)
	defer cancel()
	id := newBatchID()
	counts, rejected, err := ns.hitter.Hit(ctx, s.name, key, id, windows, undo)
	switch {
	case err == nil:
	case errors.Is(err, strategy.ErrRejected):
		return 0, false // the store is fine; the windows are not
	case errors.Is(err, strategy.ErrNotSent):
		s.health.failed(err, 0)
		return 0, false
	default:
		s.health.failed(err, 0)
		rejected := ns.hitLocal(key, limits, value, fixed, undo, true, out)
		s.retries.add(hitBatch(s.name, id, key, windows, rejected, undo))
		return rejected, true
	}
	s.health.succeeded()
	for i, w := range windows {
		// Diffs on their way to the store are not in its counts yet.
		cur := counts[i].Current + s.inflight.of(key, w.Size, w.Start)
		prev := counts[i].Previous + s.inflight.of(key, w.Size, w.Start-int64(w.Size))
		out[i] = ns.counters.Observe(key, w.Size, w.Start, cur, prev)
	}
	return rejected, true
}
