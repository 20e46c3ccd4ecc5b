package syncapp

import (
	"context"
	"errors"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

const (
	// retryInterval is how often a synchronous namespace retries pushing
	// the hits its store could not take.
	retryInterval = time.Second
	// probeInterval is how soon a failing store is asked again, and
	// maxBackoff how far apart its probes get while it keeps failing: a
	// probe a second costs a store that is down nothing, and a node learns
	// within about that long that the store is back. While the store
	// fails, requests never ask it: the runs probe it.
	probeInterval = 250 * time.Millisecond
	maxBackoff    = time.Second
	// minLogInterval is the least time between two logs of store failures
	// of one namespace.
	minLogInterval = 10 * time.Second
)

// storeHealth is what is known of one store's health, shared by every
// namespace on it (the pooled store's): which of its parts failed since
// they last worked. A store is a set of parts: a Redis Cluster's masters
// each serve some slots and fail one at a time (strategy.Parted); any
// other store is one part, and so is a failure that names no part. A
// failure or a stall makes requests for the keys of the parts down skip
// the store until a success: no request waits out a timeout to find it
// still down, and a namespace with no call of its own (an idle one)
// applies its on_store_failure policy as soon as another finds the store
// failing.
type storeHealth struct {
	// parted is the store when it has parts that fail one at a time, nil
	// when it fails as a whole.
	parted strategy.Parted
	// failing is set from a failure of the whole store until the next
	// success; partsDown counts the parts down, so that requests look a
	// key's part up only while some are.
	failing   atomic.Bool
	partsDown atomic.Int32

	mu      lockorder.Mutex[storeHealthLock]
	down    map[int]struct{} // the parts down
	members []*health        // the namespaces on the store
}

// newStoreHealth returns the health of store s (nil: of a store of its
// own, for a namespace not yet attached to one).
func newStoreHealth(s strategy.Store) *storeHealth {
	sh := &storeHealth{}
	if p, ok := s.(strategy.Parted); ok && p.Parts() > 1 {
		sh.parted = p
	}
	return sh
}

// downFor reports whether requests for key of namespace should skip the
// store: the whole store, or key's part, failed since it last worked.
func (s *storeHealth) downFor(namespace, key string) bool {
	return s.failing.Load() || s.partDownFor(namespace, key)
}

// partDownFor reports whether key's part failed since it last worked,
// whatever the whole store does.
func (s *storeHealth) partDownFor(namespace, key string) bool {
	if s.partsDown.Load() == 0 {
		return false
	}
	p := s.parted.PartOf(namespace, key)
	s.mu.Lock()
	_, down := s.down[p]
	s.mu.Unlock()
	return down
}

// anyDownLocked reports whether the whole store or a part of it is down:
// share weighs the nodes' unsynced counts then.
func (s *storeHealth) anyDownLocked() bool { return s.failing.Load() || len(s.down) > 0 }

// change applies a change of the store's state under its lock, weighs or
// unweighs each member's counters by the state it leaves (of two changes
// racing, the one applied last read the last state), and reports whether
// it changed, with the members then, for the caller to tell outside the
// lock.
func (s *storeHealth) change(apply func() bool) (changed bool, members []*health) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if changed = apply(); !changed {
		return false, nil
	}
	down := s.anyDownLocked()
	for _, m := range s.members {
		m.applyShare(down)
	}
	return true, slices.Clone(s.members)
}

// markDown marks the whole store down, and reports whether it was up.
func (s *storeHealth) markDown() (bool, []*health) {
	return s.change(func() bool { return !s.failing.Swap(true) })
}

// markUp marks the whole store up, and reports whether it was down.
func (s *storeHealth) markUp() (bool, []*health) {
	return s.change(func() bool { return s.failing.Swap(false) })
}

// partsFailed marks parts down, and returns how many are.
func (s *storeHealth) partsFailed(parts []int) (n int) {
	s.change(func() bool {
		if s.down == nil {
			s.down = make(map[int]struct{})
		}
		for _, p := range parts {
			s.down[p] = struct{}{}
		}
		n = len(s.down)
		return s.partsDown.Swap(int32(n)) == 0
	})
	return n
}

// partsUp marks parts as working, and reports whether the last part down
// came back.
func (s *storeHealth) partsUp(parts []int) (bool, []*health) {
	if s.partsDown.Load() == 0 || len(parts) == 0 {
		return false, nil
	}
	return s.change(func() bool {
		before := len(s.down)
		for _, p := range parts {
			delete(s.down, p)
		}
		s.partsDown.Store(int32(len(s.down)))
		return before > 0 && len(s.down) == 0
	})
}

// downList returns the parts down, ascending.
func (s *storeHealth) downList() []int {
	if s.partsDown.Load() == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	parts := make([]int, 0, len(s.down))
	for p := range s.down {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	return parts
}

// join makes h a member, and applies the store's state to it.
func (s *storeHealth) join(h *health) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members = append(s.members, h)
	h.applyShare(s.anyDownLocked())
}

// leave ends h's membership.
func (s *storeHealth) leave(h *health) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members = slices.DeleteFunc(s.members, func(m *health) bool { return m == h })
}

// health is a namespace's view of its store's health (storeHealth) and
// what the namespace does about it: how far apart failing runs get, when
// to log, and its on_store_failure share. The loop is signalled on probe
// when the store starts failing, so that it probes at once, and on
// recovered at the first success after failures, so that it pushes what
// waited at once. Failures are logged once per log interval, not once per
// request nor once per outage of a flapping store.
type health struct {
	name   string
	logger *zap.Logger
	now    func() time.Time // time.Now; tests step it
	// logEvery is the least time between two logs of store failures:
	// minLogInterval, or longer in tests that count the logs.
	logEvery  time.Duration
	recovered chan struct{}
	probe     chan struct{}

	// store is the health of the store of the config attached last.
	store atomic.Pointer[storeHealth]
	// share weighs the attached config's counters while the store or a
	// part of it is down, when its on_store_failure is share; applied
	// under the store's lock.
	share atomic.Pointer[shareOnFailure]

	mu          lockorder.Mutex[healthLock]
	runFailures int // consecutive failed runs: they space runs out
	failures    int // failed runs and hits since the store last worked
	lastLog     time.Time
	unlogged    int  // failures since the last log
	logged      bool // a failure was logged since the last recovery log
}

func newHealth(name string, logger *zap.Logger) *health {
	h := &health{
		name:      name,
		logger:    logger,
		now:       time.Now,
		logEvery:  minLogInterval,
		recovered: make(chan struct{}, 1),
		probe:     make(chan struct{}, 1),
	}
	h.onStore(nil)
	return h
}

// onStore makes h a member of s (nil: of a store of its own), and no
// longer of the store it was a member of.
func (h *health) onStore(s *storeHealth) {
	if s == nil {
		s = newStoreHealth(nil)
	}
	old := h.store.Swap(s)
	if old == s {
		return
	}
	if old != nil {
		old.leave(h)
	}
	s.join(h)
}

// shareOnFailure makes p the share policy the store's failures apply
// (nil: none, the config attached is not share), unweighing the counters
// the previous one weighed.
func (h *health) shareOnFailure(p *shareOnFailure) {
	s := h.store.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := h.share.Swap(p); old != nil && (p == nil || old.counters != p.counters) {
		old.counters.SetUnsyncedWeight(1)
	}
	h.applyShare(s.anyDownLocked())
}

// applyShare weighs the attached config's counters by the fleet's size
// while the store is down, and by 1 otherwise. The store's lock is held.
func (h *health) applyShare(down bool) {
	p := h.share.Load()
	if p == nil {
		return
	}
	m := 1
	if down {
		m = max(p.members.size(), 1) // a fleet never learned: as allow
	}
	p.counters.SetUnsyncedWeight(float64(m))
}

// down reports whether the whole store failed since it last worked.
func (h *health) down() bool { return h.store.Load().failing.Load() }

// downFor reports whether requests for key should skip the store: the
// whole store, or key's part, failed since it last worked.
func (h *health) downFor(key string) bool { return h.store.Load().downFor(h.name, key) }

// partDownFor reports whether key's part of a store made of parts failed
// since it last worked (whatever the whole store does).
func (h *health) partDownFor(key string) bool { return h.store.Load().partDownFor(h.name, key) }

// partsDown returns how many parts failed since they last worked.
func (h *health) partsDown() int { return int(h.store.Load().partsDown.Load()) }

// downParts returns the parts that failed since they last worked,
// ascending.
func (h *health) downParts() []int { return h.store.Load().downList() }

// probes signals that the store started failing, so that the loop probes
// it at once.
func (h *health) probes() <-chan struct{} { return h.probe }

// recoveries signals the first success after failures, so that the loop
// pushes what waited at once.
func (h *health) recoveries() <-chan struct{} { return h.recovered }

// parted returns the store when it has parts that fail one at a time,
// nil when it fails as a whole.
func (h *health) parted() strategy.Parted { return h.store.Load().parted }

// partOf returns the part of the store that holds key, or -1 when the
// store fails as a whole.
func (h *health) partOf(key string) int {
	if p := h.parted(); p != nil {
		return p.PartOf(h.name, key)
	}
	return -1
}

// failedRun counts a failed sync run, which spaces the next runs out, and
// then counts it as a failure.
func (h *health) failedRun(err error, logInterval time.Duration) {
	h.mu.Lock()
	h.runFailures++
	h.mu.Unlock()
	h.fail(err, logInterval)
}

// fail counts a failure of a run or a request (and, in
// store_timeouts_total, whether it was a timeout), marks the store down
// until a success (only the parts its error names, a
// strategy.PartialError, on a store made of parts), and logs, at most
// once per logInterval (or logEvery if longer), however often the store
// comes back in between. A cancelled call says nothing of the store.
func (h *health) fail(err error, logInterval time.Duration) {
	metrics.syncErrors.WithLabelValues(h.name).Inc()
	if errors.Is(err, context.Canceled) {
		return
	}
	if isTimeout(err) {
		metrics.timeouts.WithLabelValues(h.name).Inc()
	}
	s := h.store.Load()
	if parts, partial := strategy.FailedParts(err); partial && s.parted != nil {
		n := s.partsFailed(parts)
		h.logFailure(err, logInterval, "store partly unreachable: the keys of the parts that fail are limited on local counts and their hits kept for later",
			zap.Int("parts_down", n))
		return
	}
	if first, members := s.markDown(); first {
		for _, m := range members {
			signal(m.probe)
		}
	}
	h.logFailure(err, logInterval, "store unreachable: limits are enforced on local counts and hits are kept for later")
}

// stalled marks the store down because it has not answered for a while
// although calls wait for it (see hitQueue): requests skip it from now,
// without waiting for the calls in flight to time out. It is a failure
// like any other, counted in sync_errors_total and logged (throttled),
// so that what watches them sees the node count locally.
func (h *health) stalled() { h.fail(errStalled, 0) }

// isTimeout reports whether err is the store not answering in time: a
// deadline that passed, a network timeout, or a stall (see hitQueue).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errStalled) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// logFailure counts a failure since the store last worked, and logs it
// with msg unless a failure was logged within logInterval (or logEvery
// if longer).
func (h *health) logFailure(err error, logInterval time.Duration, msg string, fields ...zap.Field) {
	now := h.now()
	h.mu.Lock()
	h.failures++
	h.unlogged++
	if now.Sub(h.lastLog) < max(h.logEvery, logInterval) {
		h.mu.Unlock()
		return
	}
	unlogged := h.unlogged
	h.lastLog = now
	h.unlogged = 0
	h.logged = true
	h.mu.Unlock()
	h.logger.Error(msg, append([]zap.Field{
		zap.String("namespace", h.name),
		zap.Int("failures_since_last_log", unlogged),
		zap.Error(err)}, fields...)...)
}

// succeeded records that the store worked. Its first success after
// failures reaches every namespace on it (up).
func (h *health) succeeded() {
	s := h.store.Load()
	if !s.failing.Load() {
		return
	}
	if up, members := s.markUp(); up {
		whole := s.partsDown.Load() == 0 // else the last part back recovers
		for _, m := range members {
			m.up(whole)
		}
	}
}

// succeededFor records that a call for key worked: the store, and key's
// part.
func (h *health) succeededFor(key string) {
	h.succeeded()
	if h.partsDown() > 0 { // else no part to look up: a request's fast path
		if p := h.partOf(key); p >= 0 {
			h.partsUp([]int{p})
		}
	}
}

// partsUp records that the given parts worked. The last part back, the
// whole store working, reaches every namespace on it as its recovery.
func (h *health) partsUp(parts []int) {
	s := h.store.Load()
	if up, members := s.partsUp(parts); up && !s.failing.Load() {
		for _, m := range members {
			m.up(true)
		}
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

// up tells h that the store works again after failures: its runs are no
// longer spaced out and, when the whole store is back (recovered), its
// loop pushes what waited at once, and the recovery is logged if the
// failure was.
func (h *health) up(recovered bool) {
	h.mu.Lock()
	h.runFailures = 0
	logged := -1
	if recovered {
		if h.logged {
			logged, h.logged = h.failures, false
		}
		h.failures = 0
	}
	h.mu.Unlock()
	if recovered {
		signal(h.recovered)
	}
	if logged >= 0 {
		h.logger.Info("store reachable again", zap.String("namespace", h.name), zap.Int("failures", logged))
	}
}

// delay returns how long to wait from now for the next run of a loop that
// runs every interval: until the next multiple of interval, or while runs
// keep failing, after probeInterval doubled per failed run up to
// maxBackoff, so that a run probes the store soon after it is back
// whatever the interval.
func (h *health) delay(interval time.Duration, now time.Time) time.Duration {
	h.mu.Lock()
	failures := h.runFailures
	h.mu.Unlock()
	if failures > 0 {
		return min(probeInterval<<min(failures-1, 16), maxBackoff)
	}
	next := time.Duration((now.UnixNano()/int64(interval)+1)*int64(interval) - now.UnixNano())
	if h.partsDown() > 0 {
		// Runs probe the parts that failed: as often as a failing store.
		next = min(next, probeInterval)
	}
	return next
}
