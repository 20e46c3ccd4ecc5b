package syncapp

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// A periodic node keeps what it last fetched of a key after its runs stop
// fetching it: a lower bound of the fleet's count, so that a client who
// comes back slowly still meets the limit. A reset elsewhere (the admin
// API on another node) breaks that bound: the store's count drops, and
// the node would reject the key on counts nobody holds any more. So a
// rejection of a key the runs no longer fetch is decided again on the
// store's counts, at the cost of one round trip, after which the runs
// fetch the key again.

// hitPeriodic is Hit in a periodic namespace: on this node's counts, and
// on fresh ones when they rejected a key the runs no longer fetch.
func (n *Namespace) hitPeriodic(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample) int {
	rejected := n.counters.Hit(key, limits, value, fixed, undo, false, out)
	if rejected < 0 || !n.stale(key) {
		return rejected
	}
	if !undo {
		// Take back what the rejected hit counted (Kong's order counts
		// the windows up to the one that rejected), to count it again.
		for i := 0; i <= rejected; i++ {
			n.counters.Increment(key, limits[i].Size, -value)
		}
	}
	n.refresh(ctx, key)
	return n.counters.Hit(key, limits, value, fixed, undo, false, out)
}

// stale reports whether key's counts may be older than the last run: the
// runs no longer fetch it, and the store is there to ask.
func (n *Namespace) stale(key string) bool {
	return n.store != nil && n.health.ok() && !n.fetched.has(key)
}

// refresh sets key's counts to the store's, plus this node's diffs on
// their way to it, and has the runs fetch the key again (so that a flood
// of rejections costs one round trip, not one each). With a store that
// takes synchronous hits, the read is an item of the hit queue's round
// trip (storeRoad.read), with its stall detection. A failure leaves the
// counts as they were.
func (n *Namespace) refresh(ctx context.Context, key string) {
	if n.road != nil {
		if _, ok := n.road.read(ctx, key, n.WindowSizes(), window.SystemClock(), true); !ok {
			return
		}
	} else if !n.fetchOne(ctx, key) {
		return
	}
	n.fetched.touch([]string{key}, n.counters.Zone().Capacity())
}

// fetchOne is refresh's read for a store that cannot take synchronous
// hits: GetCounters, in a call of its own.
func (n *Namespace) fetchOne(ctx context.Context, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, hitTimeout)
	defer cancel()
	counts, err := n.store.GetCounters(ctx, n.name, []string{key}, n.WindowSizes(), time.Now())
	if err != nil {
		n.health.failed(err, 0)
		return false
	}
	v := n.outbox.view()
	for i, c := range counts {
		counts[i].Value += v.of(c.Key, c.Size, c.Start)
	}
	n.counters.Apply(counts)
	v.close()
	return true
}
