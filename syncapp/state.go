package syncapp

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// fleetState is what a node keeps of one namespace across config reloads,
// pooled by the namespace's name. Each part owns one piece of state, with
// its own lock. A loaded config's Namespace holds those it asks itself,
// and builds on the others its runner, its storeRoad and its
// periodicHits (Namespace.use): a request goes from the Namespace to a
// part and on to the store, never back through the loop.
type fleetState struct {
	name     string
	runs     runLock       // one run at a time
	health   *health       // the store's health: skip window, backoff, logs
	outbox   *outbox       // taken from the zone, not yet in the store
	fetched  *fetchSet     // the keys the periodic runs fetch
	bans     *banTable     // the bans this node knows of
	slots    *slotHolder   // concurrency slots held in stores
	inFlight *inFlight     // requests in flight per key, on this node
	near     *nearKeys     // the keys the store's feed marked near their limits
	members  *fleetMembers // the fleet's size, learned through the store
	hits     *hitQueue     // the round trips of synchronous hits
	loop     *loop         // the timer and the reload hand-off
}

func newFleetState(name string, logger *zap.Logger, pool *caddy.UsagePool) *fleetState {
	h := newHealth(name, logger)
	runs := newRunLock()
	return &fleetState{
		name:     name,
		runs:     runs,
		health:   h,
		outbox:   newOutbox(name, logger),
		fetched:  newFetchSet(),
		bans:     newBanTable(name, logger),
		slots:    newSlotHolder(logger, h),
		inFlight: new(inFlight),
		near:     newNearKeys(),
		members:  newFleetMembers(),
		hits:     newHitQueue(name, h),
		loop:     newLoop(name, logger, pool, h, runs),
	}
}

// pendingDiffs returns how many diffs wait to be pushed: those in the
// zone of the runner attached, and those in the outbox.
func (s *fleetState) pendingDiffs() int {
	if r := s.loop.current(); r != nil {
		return r.pendingDiffs()
	}
	return s.outbox.diffs()
}

// syncInterval returns the loop's interval for the runner attached, and
// false when none is attached or it has no store.
func (s *fleetState) syncInterval() (time.Duration, bool) {
	if r := s.loop.current(); r != nil && r.store != nil {
		return r.interval(), true
	}
	return 0, false
}

// Destruct stops the loop and the slot holder when the last config that
// names the namespace is gone (that config's cleanup already pushed what
// was pending).
func (s *fleetState) Destruct() error {
	s.health.onStore(nil)
	s.slots.close()
	s.loop.close()
	return nil
}

// use makes the parts of s the namespace's own, and builds on them the
// parts that join them to the config's store (storeKey its pool key): the
// runner, the road of the requests that ask the store, and the second
// look of a periodic namespace at a stale key.
func (n *Namespace) use(s *fleetState, storeKey poolKey, logger *zap.Logger) {
	n.health, n.bans, n.slots, n.inFlight, n.members = s.health, s.bans, s.slots, s.inFlight, s.members
	// A periodic namespace whose store tells of keys near their limits
	// marks them with its pushes and reads the marks with its fetches.
	var near *nearKeys
	feed, ok := n.store.(strategy.NearFeed)
	if ok && n.mode == Periodic {
		near = s.near
		near.clock.Store(n.counters.Zone())
	} else {
		feed = nil
	}
	// A namespace that shares its limits while the store is away learns
	// the fleet's size through the store.
	roster, ok := n.store.(strategy.Roster)
	if !ok || n.onFailure != FailShare {
		roster = nil
	}
	n.runner = &runner{
		name:        n.name,
		mode:        n.mode,
		rate:        n.rate,
		logger:      logger,
		counters:    n.counters,
		sizes:       n.sizes,
		store:       n.store,
		storeKey:    storeKey,
		storeModule: n.storeModule,
		banner:      n.banner,
		lock:        s.runs,
		outbox:      s.outbox,
		fetched:     s.fetched,
		health:      s.health,
		bans:        s.bans,
		slots:       s.slots,
		feed:        feed,
		near:        near,
		nearShare:   nearShare(n.syncAbove),
		roster:      roster,
		members:     s.members,
		watched:     n.onFailure != FailAllow,
	}

	// Any namespace whose store takes synchronous hits has a road to it:
	// a periodic one reads its stale keys on it, and any takes its slots
	// on it when the store can.
	if h, ok := n.store.(strategy.Hitter); ok {
		_, slots := n.store.(strategy.SlotBatcher)
		n.road = &storeRoad{slots: slots, store: newTripStore(h), hits: s.hits, health: s.health, outbox: s.outbox, counters: n.counters}
	}
	n.periodic = &periodicHits{
		name:     n.name,
		counters: n.counters,
		sizes:    n.sizes,
		store:    n.store,
		road:     n.road,
		health:   s.health,
		fetched:  s.fetched,
		outbox:   s.outbox,
		near:     near,
		feed:     feed,
		share:    nearShare(n.syncAbove),
	}
	if n.store != nil {
		initStoreMetrics(n.name)
	}
}
