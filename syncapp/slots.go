package syncapp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// SlotLease is how long a slot taken in a store lives unless its node
// renews it: the slots of a node that dies come back within it, which
// leaves 5 s to the 30 s that users are promised, for the store's expiry
// and a renewal in flight at the node's death.
const SlotLease = 25 * time.Second

// slotLease is SlotLease, which tests shorten.
var slotLease = SlotLease

// nodeID names this process in the slots it takes, so that a store's
// slots say which node holds them; slotSeq numbers them, process-wide,
// so that no two of its requests share an ID.
var (
	nodeID = func() string {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}()
	slotSeq atomic.Uint64
)

// heldSlot is a slot this node holds, with the store that holds it.
type heldSlot struct {
	store     strategy.Slotter
	namespace string
	slot      strategy.Slot
}

// newSlot names a new slot of key, and starts the loop that renews and
// releases the slots.
func (h *slotHolder) newSlot(store strategy.Slotter, namespace, key string) heldSlot {
	h.worker.start(h.logger, h.loop)
	return heldSlot{store: store, namespace: namespace, slot: strategy.Slot{
		Key: key,
		ID:  nodeID + "-" + strconv.FormatUint(slotSeq.Add(1), 36),
	}}
}

// slotHolder keeps the slots a namespace's requests hold in its store:
// it renews them every third of a lease while their requests run, and
// releases them, batched and off the requests' path, when they end. A
// release that fails is tried again every retryInterval until the slot's
// lease would have ended anyway, so that a store back from an outage does
// not keep the slots of requests that ended during it. Its loop starts
// with the first slot and ends with the namespace's fleetState.
type slotHolder struct {
	logger *zap.Logger
	health *health

	mu         lockorder.Mutex[slotHolderLock]
	held       map[heldSlot]struct{}
	unreleased map[heldSlot]unreleased
	// local are the slots of requests admitted on this node while the
	// store could not be asked. Once it answers again, the next sync run
	// takes them in it, whatever the number held (adopt), so that the
	// fleet counts them until they end; until then they are in no store.
	// The value says that a take of the slot failed after it may have
	// been applied: the slot is released when its request ends.
	local map[heldSlot]bool

	releases chan heldSlot
	worker   worker
}

func newSlotHolder(logger *zap.Logger, h *health) *slotHolder {
	return &slotHolder{
		logger:     logger,
		health:     h,
		held:       make(map[heldSlot]struct{}),
		unreleased: make(map[heldSlot]unreleased),
		local:      make(map[heldSlot]bool),
		releases:   make(chan heldSlot, 4096),
		worker:     newWorker("holding concurrency slots"),
	}
}

// acquire takes a slot of key of a namespace in store: on road, in the
// round trip of the requests beside it, when it is not nil (the store
// takes slots in batches), or else in a call of its own. decided is false
// when the store could not answer, and the caller must count on this
// node.
func (h *slotHolder) acquire(ctx context.Context, store strategy.Slotter, road *storeRoad, namespace, key string, max int) (slot heldSlot, ok, decided bool) {
	slot = h.newSlot(store, namespace, key)
	req := strategy.SlotRequest{ID: slot.slot.ID, Max: max, Lease: slotLease}
	var err error
	if road != nil {
		ok, err = road.takeSlot(ctx, key, req)
	} else {
		ctx, cancel := context.WithTimeout(ctx, hitTimeout)
		_, ok, err = store.AcquireSlot(ctx, namespace, key, req.ID, req.Max, req.Lease)
		cancel()
	}
	switch {
	case err == nil:
		h.health.succeededFor(key)
		if ok {
			h.mu.Lock()
			h.held[slot] = struct{}{}
			h.mu.Unlock()
		}
		return slot, ok, true
	case errors.Is(err, errStalled): // never sent, and health knows
	case errors.Is(err, strategy.ErrRejected):
		h.logger.Error("the store refused a concurrency slot; counting on this node", zap.String("namespace", namespace), zap.Error(err))
	case errors.Is(err, strategy.ErrNotSent):
		h.health.fail(err, 0)
	default: // it may have been taken, now or when the store resumes
		h.health.fail(err, 0)
		h.mu.Lock()
		h.unreleased[slot] = unreleased{until: time.Now().Add(slotLease), uncertain: true}
		h.mu.Unlock()
		h.queue(slot)
	}
	return slot, false, false
}

// admitLocal records a request of key admitted on this node while the
// store could not be asked, and returns its slot, to give to endLocal
// when the request ends.
func (h *slotHolder) admitLocal(store strategy.Slotter, namespace, key string) heldSlot {
	slot := h.newSlot(store, namespace, key)
	h.mu.Lock()
	h.local[slot] = false
	h.mu.Unlock()
	return slot
}

// endLocal forgets the slot of a request admitted locally that ended, and
// releases it if the store took it, or may have.
func (h *slotHolder) endLocal(slot heldSlot) {
	h.mu.Lock()
	tried, local := h.local[slot]
	delete(h.local, slot)
	h.mu.Unlock()
	if !local || tried {
		h.release(slot)
	}
}

// hasLocal reports whether requests admitted locally wait for slots in
// the store.
func (h *slotHolder) hasLocal() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.local) > 0
}

// adopt takes in their store the slots of the requests admitted locally
// that still run, whatever the number held: the store then counts them,
// and the fleet admits no more of their keys than the cap allows until
// they end. A slot whose request ended meanwhile is released at once. It
// stops at the first failure, and returns it. The slots of keys that skip
// wait (the keys of a store's parts that are down).
func (h *slotHolder) adopt(ctx context.Context, skip func(key string) bool) error {
	h.mu.Lock()
	local := slices.Collect(maps.Keys(h.local))
	h.mu.Unlock()
	// skip takes the health's locks: never under h.mu.
	local = slices.DeleteFunc(local, func(s heldSlot) bool { return skip(s.slot.Key) })
	for _, s := range local {
		_, _, err := s.store.AcquireSlot(ctx, s.namespace, s.slot.Key, s.slot.ID, math.MaxInt32, slotLease)
		h.mu.Lock()
		_, running := h.local[s]
		switch {
		case err == nil && running:
			delete(h.local, s)
			h.held[s] = struct{}{}
		case running && !errors.Is(err, strategy.ErrNotSent):
			h.local[s] = true // it may be held: released when it ends
		}
		h.mu.Unlock()
		if !running && !errors.Is(err, strategy.ErrNotSent) {
			h.queue(s) // its request ended meanwhile
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// release gives back a slot whose request ended.
func (h *slotHolder) release(slot heldSlot) {
	h.mu.Lock()
	delete(h.held, slot)
	h.mu.Unlock()
	h.queue(slot)
}

// queue hands a slot to the loop to release. When the queue is full the
// slot is left to its lease.
func (h *slotHolder) queue(slot heldSlot) {
	select {
	case h.releases <- slot:
	default:
	}
}

// maxReleaseBatch bounds the slots one release call frees.
const maxReleaseBatch = 512

// unreleased is a slot to release again: its release failed, or its
// acquire failed after it may have been applied. until is when its lease
// ends at the latest. An uncertain acquire may reach the store after a
// release of its slot, so that slot is released again until then even
// when a release worked.
type unreleased struct {
	until     time.Time
	uncertain bool
}

// loop releases slots as their requests end, renews the held ones, and
// tries the failed releases again.
func (h *slotHolder) loop() {
	renew := time.NewTicker(slotLease / 3)
	defer renew.Stop()
	retry := time.NewTicker(retryInterval)
	defer retry.Stop()
	for {
		select {
		case <-h.worker.stopping():
			h.releaseAll()
			return
		case first := <-h.releases:
			batch := h.drain([]heldSlot{first}, maxReleaseBatch)
			h.retryLater(h.each(batch, strategy.Slotter.ReleaseSlots))
		case <-retry.C:
			h.retryReleases(time.Now())
		case <-renew.C:
			h.mu.Lock()
			held := slices.Collect(maps.Keys(h.held))
			h.mu.Unlock()
			h.each(held, func(st strategy.Slotter, ctx context.Context, ns string, slots []strategy.Slot) error {
				return st.RenewSlots(ctx, ns, slots, slotLease)
			})
		}
	}
}

// retryLater keeps slots whose release failed for the next retry.
func (h *slotHolder) retryLater(failed []heldSlot) {
	if len(failed) == 0 {
		return
	}
	until := time.Now().Add(slotLease)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range failed {
		if _, ok := h.unreleased[s]; !ok {
			h.unreleased[s] = unreleased{until: until}
		}
	}
}

// retryReleases releases again the slots whose release failed or whose
// acquire was uncertain, and forgets those whose lease ended by now.
func (h *slotHolder) retryReleases(now time.Time) {
	h.mu.Lock()
	maps.DeleteFunc(h.unreleased, func(_ heldSlot, u unreleased) bool { return !now.Before(u.until) })
	again := slices.Collect(maps.Keys(h.unreleased))
	h.mu.Unlock()
	if len(again) == 0 {
		return
	}
	failed := make(map[heldSlot]bool)
	for _, s := range h.each(again, strategy.Slotter.ReleaseSlots) {
		failed[s] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range again {
		if u := h.unreleased[s]; !u.uncertain && !failed[s] {
			delete(h.unreleased, s)
		}
	}
}

// each calls f once per store and namespace of the given slots, and
// returns the slots of the calls that failed.
// f's parameters are in the order of a method expression of
// strategy.Slotter.
func (h *slotHolder) each(slots []heldSlot, f func(strategy.Slotter, context.Context, string, []strategy.Slot) error) (failed []heldSlot) {
	type group struct {
		store     strategy.Slotter
		namespace string
	}
	groups := make(map[group][]strategy.Slot)
	for _, s := range slots {
		g := group{s.store, s.namespace}
		groups[g] = append(groups[g], s.slot)
	}
	for g, slots := range groups {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := f(g.store, ctx, g.namespace, slots)
		cancel()
		if err != nil {
			h.health.fail(err, 0)
			parts, partial := strategy.FailedParts(err)
			for _, s := range slots {
				// On a store made of parts, only the failed parts' slots.
				if !partial || slices.Contains(parts, h.health.partOf(s.Key)) {
					failed = append(failed, heldSlot{store: g.store, namespace: g.namespace, slot: s})
				}
			}
		}
	}
	return failed
}

// drain appends the slots queued for release to batch, until it holds
// limit or the queue is empty.
func (h *slotHolder) drain(batch []heldSlot, limit int) []heldSlot {
	for len(batch) < limit {
		select {
		case s := <-h.releases:
			batch = append(batch, s)
		default:
			return batch
		}
	}
	return batch
}

// releaseAll releases the slots still queued or held, at the end.
func (h *slotHolder) releaseAll() {
	h.mu.Lock()
	all := slices.AppendSeq(slices.Collect(maps.Keys(h.held)), maps.Keys(h.unreleased))
	clear(h.held)
	clear(h.unreleased)
	h.mu.Unlock()
	all = h.drain(all, cap(h.releases)+len(all))
	// The config that held a store may have closed it already: what
	// cannot be released here runs out its lease.
	h.each(all, func(st strategy.Slotter, ctx context.Context, ns string, slots []strategy.Slot) error {
		if err := st.ReleaseSlots(ctx, ns, slots); err != nil {
			h.logger.Debug("releasing concurrency slots at the end; they expire with their lease",
				zap.String("namespace", ns), zap.Int("slots", len(slots)), zap.Error(err))
		}
		return nil
	})
}

// close stops the loop, once it has released what it holds.
func (h *slotHolder) close() { h.worker.close() }
