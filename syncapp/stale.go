package syncapp

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// periodicHits decides the hits of a periodic namespace (without
// sync_above) on this node's counts, and again on the store's when they
// rejected a key that may be stale.
//
// A periodic node keeps what it last fetched of a key after its runs stop
// fetching it: a lower bound of the fleet's count, so that a client who
// comes back slowly still meets the limit. A reset elsewhere (the admin
// API on another node) breaks that bound: the store's count drops, and
// the node would reject the key on counts nobody holds any more. So a
// rejection of a key the runs no longer fetch is decided again on the
// store's counts, at the cost of one round trip, after which the runs
// fetch the key again.
type periodicHits struct {
	name     string
	counters *window.Namespace
	sizes    *windowSizes
	store    strategy.Store
	road     *storeRoad // the store's hit queue, when it takes synchronous hits
	health   *health
	fetched  *fetchSet
	outbox   *outbox
	near     *nearKeys         // the store's marks, when it tells of them
	feed     strategy.NearFeed // the store, which reads them, with near
	share    float64           // of a limit, at which a window's count is near it (nearShare)
}

// decidedAtStore notes a hit that the store decided (sync_above), from
// its answer a (no counts when the store did not decide): the store
// applies a synchronous hit without marking, so a hit that brought one
// of the key's windows near its limit at the store, as a push that marks
// would (strategy.NearAt, strategy.Crosses), has the next run mark the
// key, unless it is marked. The store adds each hit to its counts
// atomically, so of the fleet's hits only the one that crossed asks: the
// others, which found the key near already, were marked by it, or by the
// push that crossed. A hit in doubt, which may have crossed unanswered,
// asks when its local counts in out are near.
func (p *periodicHits) decidedAtStore(key string, limits []Limit, a *storeAnswer, out []window.Sample) {
	if p.near == nil || (a.counts == nil && !a.doubt) {
		return
	}
	for i, l := range limits {
		d := window.Diff{Key: key, Size: out[i].Size, Start: out[i].Start, Limit: l.Max}
		var near bool
		if a.doubt {
			at := strategy.NearAt(p.share, &d)
			near = at > 0 && out[i].Current >= at
		} else {
			d.Previous = a.counts[i].Previous
			near = strategy.Crosses(strategy.NearAt(p.share, &d), a.counts[i].Current, a.added(i))
		}
		if near {
			p.near.ask(key, strategy.NearUntil(&d).UnixNano())
			return
		}
	}
}

// hit is Hit in a periodic namespace: on this node's counts, and on fresh
// ones when they rejected a key the runs no longer fetch.
func (p *periodicHits) hit(ctx context.Context, key string, limits []Limit, value float64, fixed, undo bool, out []window.Sample) int {
	if p.blind(ctx, key) {
		p.refresh(ctx, key)
	}
	rejected := p.counters.Hit(key, limits, value, fixed, undo, false, out)
	if rejected < 0 || !p.stale(key) {
		return rejected
	}
	if !undo {
		// Take back what the rejected hit counted (Kong's order counts
		// the windows up to the one that rejected), to count it again.
		for i := 0; i <= rejected; i++ {
			p.counters.Increment(key, limits[i].Size, -value)
		}
	}
	p.refresh(ctx, key)
	return p.counters.Hit(key, limits, value, fixed, undo, false, out)
}

// hitIfRoom is HitIfRoom in a periodic namespace, with the second look of
// hit.
func (p *periodicHits) hitIfRoom(ctx context.Context, key string, limits []Limit, value float64, out []window.Sample) (rejected int, wait time.Duration) {
	if p.blind(ctx, key) {
		p.refresh(ctx, key)
	}
	rejected, wait = p.counters.HitIfRoom(key, limits, value, out)
	if rejected >= 0 && p.stale(key) {
		p.refresh(ctx, key)
		rejected, wait = p.counters.HitIfRoom(key, limits, value, out)
	}
	return rejected, wait
}

// blind reports whether this node would decide key blind to the fleet's
// hits: the store's feed marked it near a limit, and the runs do not
// fetch it (it came back after a while, or never came). Its hit then asks
// the store first: a read in a namespace without sync_above, the hit
// itself at the store with it. A node that rests reads the feed first.
func (p *periodicHits) blind(ctx context.Context, key string) bool {
	if p.near == nil {
		return false
	}
	if p.near.restingNow() {
		p.wake(ctx)
	}
	return p.near.has(key) && p.stale(key)
}

// wake reads the marks a resting node has not read (see nearKeys), with
// the requests that find it resting meanwhile. It reads nothing while the
// store is failing; a failure leaves the node resting, and its requests
// decided on its own counts, as without a feed. The read has the stall
// bound of the hit queue's round trips: a store that has not answered
// within stallAfter is held stalled, and the requests go on without it.
func (p *periodicHits) wake(ctx context.Context) {
	if p.feed == nil || p.health.down() {
		return
	}
	p.near.wake(func() {
		// Not the first request's own context: the others wait for it.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stallAfter)
		defer cancel()
		now := time.Unix(0, p.counters.Now())
		_, marks, version, err := p.feed.GetCountersNear(ctx, p.name, nil, p.sizes.list(), now, p.near.known(), nil)
		if err != nil {
			if ctx.Err() != nil { // no answer within the bound
				p.health.stalled()
			} else {
				p.health.fail(err, 0)
			}
			return
		}
		p.near.add(marks, version, p.counters.Zone().Capacity(), now)
	})
}

// stale reports whether key's counts may be older than the last run: the
// runs no longer fetch it, and the store is there to ask.
func (p *periodicHits) stale(key string) bool {
	return p.store != nil && !p.health.downFor(key) && !p.fetched.has(key)
}

// refresh sets key's counts to the store's, plus this node's diffs on
// their way to it, and has the runs fetch the key again (so that a flood
// of rejections costs one round trip, not one each). With a store that
// takes synchronous hits, the read is an item of the hit queue's round
// trip (storeRoad.read), with its stall detection. A failure leaves the
// counts as they were.
func (p *periodicHits) refresh(ctx context.Context, key string) {
	if p.road != nil {
		if _, ok := p.road.read(ctx, key, p.sizes.list(), p.counters.Now(), true); !ok {
			return
		}
	} else if !p.fetchOne(ctx, key) {
		return
	}
	p.fetched.touch([]string{key}, p.counters.Zone().Capacity())
}

// fetchOne is refresh's read for a store that cannot take synchronous
// hits: GetCounters, in a call of its own.
func (p *periodicHits) fetchOne(ctx context.Context, key string) bool {
	ctx, cancel := context.WithTimeout(ctx, hitTimeout)
	defer cancel()
	epoch := p.outbox.epoch()
	counts, err := p.store.GetCounters(ctx, p.name, []string{key}, p.sizes.list(), time.Unix(0, p.counters.Now()))
	if err != nil {
		p.health.fail(err, 0)
		return false
	}
	v := p.outbox.view()
	if v.landedSince(epoch) {
		// The counts may lack a push that landed meanwhile: the node's
		// own are kept, and the next run fetches the key.
		v.close()
		return true
	}
	for i, c := range counts {
		counts[i].Value += v.of(c.Key, c.Size, c.Start)
	}
	p.counters.Apply(counts)
	v.close()
	return true
}
