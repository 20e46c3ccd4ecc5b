package syncapp

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// fleetState is what a node keeps of one namespace across config reloads,
// pooled by the namespace's name. Each part owns one piece of state, with
// its own lock, and each loaded config's Namespace holds the parts
// directly: a request goes from the Namespace to a part and on to the
// store, never back through the loop.
type fleetState struct {
	name     string
	runs     runLock     // one run at a time
	health   *health     // the store's health: skip window, backoff, logs
	outbox   *outbox     // taken from the zone, not yet in the store
	fetched  *fetchSet   // the keys the periodic runs fetch
	bans     *banTable   // the bans this node knows of
	slots    *slotHolder // concurrency slots held in stores
	inFlight *inFlight   // requests in flight per key, on this node
	loop     *loop       // the timer and the reload hand-off
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
		loop:     newLoop(name, logger, pool, h, runs),
	}
}

// pendingDiffs returns how many diffs wait to be pushed: those in the
// zone of the namespace attached, and those in the outbox.
func (s *fleetState) pendingDiffs() int {
	if ns := s.loop.current(); ns != nil {
		return ns.pendingDiffs()
	}
	return s.outbox.diffs()
}

// syncInterval returns the loop's interval for the namespace attached,
// and false when none is attached or it has no store.
func (s *fleetState) syncInterval() (time.Duration, bool) {
	if ns := s.loop.current(); ns != nil && ns.store != nil {
		return ns.runInterval(), true
	}
	return 0, false
}

// Destruct stops the loop and the slot holder when the last config that
// names the namespace is gone (that config's cleanup already pushed what
// was pending).
func (s *fleetState) Destruct() error {
	s.slots.close()
	s.loop.close()
	return nil
}

// use makes the parts of s the namespace's own.
func (n *Namespace) use(s *fleetState) {
	n.runs = s.runs
	n.health = s.health
	n.outbox = s.outbox
	n.fetched = s.fetched
	n.bans = s.bans
	n.slots = s.slots
	n.inFlight = s.inFlight
	// Any namespace whose store takes synchronous hits has a road to it:
	// a periodic one reads its stale keys on it (see refresh), and any
	// takes its slots on it when the store can.
	if h, ok := n.store.(strategy.Hitter); ok {
		_, slots := n.store.(strategy.SlotBatcher)
		n.road = &storeRoad{slots: slots, hits: newHitQueue(h, n.name, s.health), health: s.health, outbox: s.outbox, counters: n.counters}
	}
	if n.store != nil {
		initStoreMetrics(n.name)
	}
}

// track has the zone keep track of the namespace's changes while it syncs:
// when its config starts, and when it runs again after a failed reload.
func (n *Namespace) track() { n.counters.SetTracked(n.mode != Local) }
