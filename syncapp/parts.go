package syncapp

import (
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// partHealth is what a namespace knows of the parts of a store made of
// parts that fail one at a time (strategy.Parted: a Redis Cluster, whose
// masters each serve some slots): which parts failed since they last
// worked. The keys of those parts count locally, and their diffs wait in
// the zone, while every other key keeps syncing: one dead master blinds
// only its own slots. A failure of the whole store is health's own.
type partHealth struct {
	// store is the Parted store of the config attached, when it has more
	// than one part: a reload to another store forgets the parts.
	store atomic.Pointer[partedStore]
	// count is how many parts are down: requests look a key's part up
	// only while some are.
	count atomic.Int32

	mu   lockorder.Mutex[partHealthLock]
	down map[int]struct{}
}

type partedStore struct{ strategy.Parted }

// use makes s the store whose parts are tracked, forgetting the parts of
// another, and reports whether it changed.
func (ph *partHealth) use(s strategy.Store) bool {
	p, ok := s.(strategy.Parted)
	if !ok || p.Parts() < 2 {
		p = nil
	}
	old := ph.store.Load()
	if old != nil && p != nil && old.Parted == p || old == nil && p == nil {
		return false
	}
	if p == nil {
		ph.store.Store(nil)
	} else {
		ph.store.Store(&partedStore{p})
	}
	ph.mu.Lock()
	ph.down = nil
	ph.count.Store(0)
	ph.mu.Unlock()
	return true
}

// parted returns the store whose parts are tracked, nil when none is.
func (ph *partHealth) parted() strategy.Parted {
	if p := ph.store.Load(); p != nil {
		return p.Parted
	}
	return nil
}

// of returns the part that holds key of namespace, or -1 when the store
// fails as a whole.
func (ph *partHealth) of(namespace, key string) int {
	if p := ph.store.Load(); p != nil {
		return p.PartOf(namespace, key)
	}
	return -1
}

// isDown reports whether part p failed since it last worked.
func (ph *partHealth) isDown(p int) bool {
	if p < 0 || ph.count.Load() == 0 {
		return false
	}
	ph.mu.Lock()
	_, down := ph.down[p]
	ph.mu.Unlock()
	return down
}

// downCount returns how many parts are down.
func (ph *partHealth) downCount() int { return int(ph.count.Load()) }

// list returns the parts down, ascending.
func (ph *partHealth) list() []int {
	if ph.count.Load() == 0 {
		return nil
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	parts := make([]int, 0, len(ph.down))
	for p := range ph.down {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	return parts
}

// markDown marks parts down, and returns how many are and whether none
// was before.
func (ph *partHealth) markDown(parts []int) (n int, first bool) {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.down == nil {
		ph.down = make(map[int]struct{})
	}
	for _, p := range parts {
		ph.down[p] = struct{}{}
	}
	n = len(ph.down)
	return n, ph.count.Swap(int32(n)) == 0
}

// markUp marks parts as working, and reports whether the last part down
// came back.
func (ph *partHealth) markUp(parts []int) (allUp bool) {
	if ph.count.Load() == 0 || len(parts) == 0 {
		return false
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	before := len(ph.down)
	for _, p := range parts {
		delete(ph.down, p)
	}
	n := len(ph.down)
	ph.count.Store(int32(n))
	return n == 0 && before > 0
}

// useStore makes s the store whose parts health tracks, forgetting the
// parts of another.
func (h *health) useStore(s strategy.Store) {
	if h.parts.use(s) {
		h.share.apply(h.anyDown)
	}
}

// parted returns the store whose parts health tracks, nil when the store
// fails as a whole.
func (h *health) parted() strategy.Parted { return h.parts.parted() }

// allParts returns the parts of a store of n parts: 0 to n-1.
func allParts(n int) []int {
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	return parts
}

// partOf returns the part of the store that holds key, or -1 when the
// store fails as a whole.
func (h *health) partOf(key string) int { return h.parts.of(h.name, key) }

// downFor reports whether requests for key should skip the store: the
// whole store, or key's part, failed since it last worked.
func (h *health) downFor(key string) bool {
	return h.failing.Load() || h.partDownFor(key)
}

// partDownFor reports whether key's part of a store made of parts failed
// since it last worked (whatever the whole store does).
func (h *health) partDownFor(key string) bool {
	return h.parts.downCount() > 0 && h.partIsDown(h.partOf(key))
}

// partIsDown reports whether part p failed since it last worked.
func (h *health) partIsDown(p int) bool { return h.parts.isDown(p) }

// downParts returns the parts that failed since they last worked.
func (h *health) downParts() []int { return h.parts.list() }

// partsDown returns how many parts failed since they last worked.
func (h *health) partsDown() int { return h.parts.downCount() }

// anyDown reports whether the whole store or any part of it is down:
// share weighs the node's unsynced counts then (a part's keys' diffs wait
// in the zone; the others' leave it every run).
func (h *health) anyDown() bool { return h.failing.Load() || h.parts.downCount() > 0 }

// fail counts a failure of a call, as failed does: of the parts its
// error names (strategy.PartialError) when the store is made of parts,
// or else of the whole store.
func (h *health) fail(err error, logInterval time.Duration) {
	parts, partial := strategy.FailedParts(err)
	if !partial || h.parted() == nil {
		h.failed(err, logInterval)
		return
	}
	if !h.countFailure(err) {
		return
	}
	n, first := h.parts.markDown(parts)
	if first {
		h.share.apply(h.anyDown)
	}
	h.logFailure(err, logInterval, "store partly unreachable: the keys of the parts that fail are limited on local counts and their hits kept for later",
		zap.Int("parts_down", n))
}

// succeededFor records that a call for key worked: the store, and key's
// part.
func (h *health) succeededFor(key string) {
	h.succeeded()
	if h.parts.downCount() > 0 {
		if p := h.partOf(key); p >= 0 {
			h.partsUp([]int{p})
		}
	}
}

// partsUp records that the given parts worked. The last part back is
// logged and signalled as a recovery, as the whole store's.
func (h *health) partsUp(parts []int) {
	if h.parts.markUp(parts) {
		h.share.apply(h.anyDown)
		h.recover()
	}
}

// partsAnswered records that a call that asked the given parts failed
// only for those of failed (ascending, as strategy.PartialError's): the
// others worked.
func (h *health) partsAnswered(asked, failed []int) {
	h.partsUp(slices.DeleteFunc(asked, func(p int) bool {
		_, found := slices.BinarySearch(failed, p)
		return found
	}))
}
