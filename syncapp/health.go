package syncapp

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

const (
	// retryInterval is how often a synchronous namespace retries pushing
	// the hits its store could not take, and how long hits skip a store
	// that just failed.
	retryInterval = time.Second
	// maxBackoff caps how far apart failing periodic runs get: a run every
	// two seconds costs a store that is down nothing, and a node syncs
	// again within about that long of the store coming back.
	maxBackoff = 2 * time.Second
	// minLogInterval is the least time between two logs of store failures
	// of one namespace.
	minLogInterval = 10 * time.Second
)

// health is what a namespace knows of its store's health: whether
// requests should skip the store for a moment, how far apart failing runs
// get, and when to log. Failures are logged once per log interval, not
// once per request nor once per outage of a flapping store, and the first
// success after failures is signalled on recovered, so that the loop
// pushes what waited at once.
type health struct {
	name   string
	logger *zap.Logger
	now    func() time.Time // time.Now; tests step it
	// logEvery is the least time between two logs of store failures:
	// minLogInterval, or longer in tests that count the logs.
	logEvery  time.Duration
	recovered chan struct{}

	mu          sync.Mutex
	runFailures int // consecutive failed runs: they space runs out
	failures    int // failed runs and hits since the store last worked
	lastLog     time.Time
	unlogged    int  // failures since the last log
	logged      bool // a failure was logged since the last recovery log

	// While the store is known to be down, requests count locally without
	// trying it, so that they do not each wait for a timeout. Once
	// downUntil (Unix nanoseconds) has passed, one request at a time
	// probes the store, until probeUntil; the others keep skipping it
	// until a probe succeeds or fails.
	failing    atomic.Bool
	downUntil  atomic.Int64
	probeUntil atomic.Int64
}

func newHealth(name string, logger *zap.Logger) *health {
	return &health{name: name, logger: logger, now: time.Now, logEvery: minLogInterval, recovered: make(chan struct{}, 1)}
}

// failedRun counts a failed sync run, which spaces the next runs out, and
// then counts it as a failure.
func (h *health) failedRun(err error, logInterval time.Duration) {
	h.mu.Lock()
	h.runFailures++
	h.mu.Unlock()
	h.failed(err, logInterval)
}

// failed counts a failure of a run or a request, marks the store down for
// a moment, and logs, at most once per logInterval (or logEvery if
// longer), however often the store comes back in between. A cancelled
// call says nothing of the store.
func (h *health) failed(err error, logInterval time.Duration) {
	metrics.syncErrors.WithLabelValues(h.name).Inc()
	if errors.Is(err, context.Canceled) {
		return
	}
	now := h.now()
	h.downUntil.Store(now.Add(retryInterval).UnixNano())
	h.probeUntil.Store(0)
	h.failing.Store(true)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures++
	h.unlogged++
	if now.Sub(h.lastLog) < max(h.logEvery, logInterval) {
		return
	}
	h.logger.Error("store unreachable: limits are enforced on local counts and hits are kept for later",
		zap.String("namespace", h.name),
		zap.Int("failures_since_last_log", h.unlogged),
		zap.Error(err))
	h.lastLog = now
	h.unlogged = 0
	h.logged = true
}

// down reports whether a request should skip the store for now: for
// retryInterval after a failure, and then while another request probes
// it. A request told false must report to succeeded or failed; one that
// does not (it had nothing to ask) holds the probe for at most
// hitTimeout.
func (h *health) down() bool {
	if !h.failing.Load() {
		return false
	}
	now := h.now().UnixNano()
	if h.downUntil.Load() > now {
		return true
	}
	p := h.probeUntil.Load()
	return p > now || !h.probeUntil.CompareAndSwap(p, now+int64(hitTimeout))
}

// succeeded records that the store worked. The first success after
// failures is signalled, and logged if their failure was.
func (h *health) succeeded() {
	if !h.failing.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failing.Swap(false) {
		if h.logged {
			h.logger.Info("store reachable again", zap.String("namespace", h.name), zap.Int("failures", h.failures))
			h.logged = false
		}
		signal(h.recovered)
	}
	h.runFailures, h.failures = 0, 0
	h.downUntil.Store(0)
	h.probeUntil.Store(0)
}

// ok reports whether the store worked the last time it was asked.
func (h *health) ok() bool { return !h.failing.Load() }

// recoveries signals the first success after failures, so that the loop
// pushes what waited at once.
func (h *health) recoveries() <-chan struct{} { return h.recovered }

// delay returns how long to wait from now for the next run of a loop that
// runs every interval: until the next multiple of interval, pushed back
// exponentially while runs keep failing.
func (h *health) delay(interval time.Duration, now time.Time) time.Duration {
	h.mu.Lock()
	failures := h.runFailures
	h.mu.Unlock()
	earliest := now.UnixNano()
	if failures > 0 {
		backoff := max(maxBackoff, interval)
		if shift := min(failures, 16); interval <= backoff>>shift {
			backoff = interval << shift
		}
		earliest += int64(backoff)
	}
	next := (earliest/int64(interval) + 1) * int64(interval)
	return time.Duration(next - now.UnixNano())
}
