package syncapp

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
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

// health is what a namespace knows of its store's health: whether
// requests should skip the store, how far apart failing runs get, and
// when to log. A failure (or a stall, see hitQueue) makes requests skip
// the store until a sync run, which probes it, or a call already in
// flight, succeeds: no request waits out a timeout to find the store
// still down. The loop is signalled on probe when the store starts
// failing, so that it probes at once. Failures are logged once per log
// interval, not once per request nor once per outage of a flapping store,
// and the first success after failures is signalled on recovered, so that
// the loop pushes what waited at once.
type health struct {
	name   string
	logger *zap.Logger
	now    func() time.Time // time.Now; tests step it
	// logEvery is the least time between two logs of store failures:
	// minLogInterval, or longer in tests that count the logs.
	logEvery  time.Duration
	recovered chan struct{}
	probe     chan struct{}

	mu          lockorder.Mutex[healthLock]
	runFailures int // consecutive failed runs: they space runs out
	failures    int // failed runs and hits since the store last worked
	lastLog     time.Time
	unlogged    int  // failures since the last log
	logged      bool // a failure was logged since the last recovery log

	// failing is set from a failure until the next success: requests
	// then count locally without trying the store.
	failing atomic.Bool

	// share weighs the attached config's counters while failing, when
	// its on_store_failure is share.
	share failureShare

	// parts are the parts of a store made of parts that failed.
	parts partHealth

	// store is the pooled store's health, which every namespace on the
	// store shares: the config attached last's (nil for a local one).
	store atomic.Pointer[storeHealth]
}

// storeHealth joins the healths of the namespaces that use one pooled
// store: a failure or a success that one of them sees, every other knows
// at once, so that a namespace with no call of its own (an idle one)
// applies its on_store_failure policy as soon as the store is known to
// fail. Its lock is a leaf: held only to read or change the members.
type storeHealth struct {
	mu      lockorder.Mutex[storeHealthLock]
	members map[*health]struct{}
}

// others returns the members but h.
func (s *storeHealth) others(h *health) []*health {
	s.mu.Lock()
	defer s.mu.Unlock()
	var hs []*health
	for m := range s.members {
		if m != h {
			hs = append(hs, m)
		}
	}
	return hs
}

// onStore makes h a member of s (nil: of none), and no longer of the
// store it was a member of.
func (h *health) onStore(s *storeHealth) {
	old := h.store.Swap(s)
	if old == s {
		return
	}
	if old != nil {
		old.mu.Lock()
		delete(old.members, h)
		old.mu.Unlock()
	}
	if s != nil {
		s.mu.Lock()
		if s.members == nil {
			s.members = make(map[*health]struct{})
		}
		s.members[h] = struct{}{}
		s.mu.Unlock()
	}
}

// tellStore has every other namespace on h's store learn what h learned.
func (h *health) tellStore(learn func(*health)) {
	if s := h.store.Load(); s != nil {
		for _, o := range s.others(h) {
			learn(o)
		}
	}
}

func newHealth(name string, logger *zap.Logger) *health {
	return &health{
		name:      name,
		logger:    logger,
		now:       time.Now,
		logEvery:  minLogInterval,
		recovered: make(chan struct{}, 1),
		probe:     make(chan struct{}, 1),
	}
}

// failedRun counts a failed sync run, which spaces the next runs out, and
// then counts it as a failure.
func (h *health) failedRun(err error, logInterval time.Duration) {
	h.mu.Lock()
	h.runFailures++
	h.mu.Unlock()
	h.failed(err, logInterval)
}

// failed counts a failure of a run or a request (and, in
// store_timeouts_total, whether it was a timeout), marks the store down
// until a success, and logs, at most once per logInterval (or logEvery if
// longer), however often the store comes back in between. A cancelled
// call says nothing of the store.
func (h *health) failed(err error, logInterval time.Duration) {
	if !h.countFailure(err) {
		return
	}
	h.markDown()
	h.logFailure(err, logInterval, "store unreachable: limits are enforced on local counts and hits are kept for later")
}

// countFailure counts a failure in the metrics, and reports whether it
// says anything of the store: a cancelled call does not.
func (h *health) countFailure(err error) bool {
	metrics.syncErrors.WithLabelValues(h.name).Inc()
	if errors.Is(err, context.Canceled) {
		return false
	}
	if isTimeout(err) {
		metrics.timeouts.WithLabelValues(h.name).Inc()
	}
	return true
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

// isTimeout reports whether err is the store not answering in time: a
// deadline that passed, a network timeout, or a stall (see hitQueue).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errStalled) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// stalled marks the store down because it has not answered for a while
// although calls wait for it (see hitQueue): requests skip it from now,
// without waiting for the calls in flight to time out. It is a failure
// like any other, counted in sync_errors_total and logged (throttled),
// so that what watches them sees the node count locally.
func (h *health) stalled() { h.failed(errStalled, 0) }

// markDown makes requests skip the store until a success and, when the
// store was working, has the loop probe it at once.
func (h *health) markDown() {
	if !h.failing.Swap(true) {
		h.share.apply(h.anyDown)
		signal(h.probe)
		h.tellStore((*health).markDown)
	}
}

// down reports whether requests should skip the store: from a failure
// until the next success.
func (h *health) down() bool { return h.failing.Load() }

// succeeded records that the store worked. The first success after
// failures is signalled, and logged if their failure was.
func (h *health) succeeded() {
	if h.failing.Load() && h.up() {
		h.tellStore((*health).succeeded)
	}
}

// up is succeeded for h alone, and reports whether h was down.
func (h *health) up() bool {
	h.mu.Lock()
	h.runFailures = 0
	if !h.failing.Swap(false) {
		h.mu.Unlock()
		return false
	}
	h.share.apply(h.anyDown)
	logged := -1
	if h.parts.downCount() == 0 { // else the last part back recovers
		logged = h.recoveredLocked()
	}
	h.mu.Unlock()
	h.logRecovery(logged)
	return true
}

// recover records that the last part of the store that failed works
// again, the whole store working (see partHealth).
func (h *health) recover() {
	h.mu.Lock()
	logged := -1
	if !h.failing.Load() {
		logged = h.recoveredLocked()
	}
	h.mu.Unlock()
	h.logRecovery(logged)
}

// recoveredLocked signals that the store is back, and returns the number
// of failures to log it with, or -1 when its failure was not logged. The
// caller holds h.mu, and logs (logRecovery) once it let go of it.
func (h *health) recoveredLocked() (logged int) {
	logged = -1
	if h.logged {
		logged, h.logged = h.failures, false
	}
	h.failures = 0
	signal(h.recovered)
	return logged
}

// logRecovery logs that the store is back after failures, unless
// failures is -1.
func (h *health) logRecovery(failures int) {
	if failures >= 0 {
		h.logger.Info("store reachable again", zap.String("namespace", h.name), zap.Int("failures", failures))
	}
}

// shareOnFailure makes p the share policy the store's failures apply
// (nil: none, the config attached is not share).
func (h *health) shareOnFailure(p *shareOnFailure) { h.share.set(p, h.anyDown()) }

// ok reports whether the store worked the last time it was asked.
func (h *health) ok() bool { return !h.failing.Load() }

// probes signals that the store started failing, so that the loop probes
// it at once.
func (h *health) probes() <-chan struct{} { return h.probe }

// recoveries signals the first success after failures, so that the loop
// pushes what waited at once.
func (h *health) recoveries() <-chan struct{} { return h.recovered }

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
