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
	// maxBackoff caps how far apart failing periodic runs get.
	maxBackoff = 10 * time.Second
	// minLogInterval is the least time between two logs of store failures
	// of one namespace.
	minLogInterval = 10 * time.Second
)

// health is what a namespace knows of its store's health: whether
// synchronous hits should skip the store for a moment, how far apart
// failing runs get, and when to log. Failures are logged once per log
// interval, not once per request, and the first success after failures
// is logged and signalled on recovered, so that the loop pushes what
// waited at once.
type health struct {
	name   string
	logger *zap.Logger
	// logEvery is the least time between two logs of store failures:
	// minLogInterval, or longer in tests that count the logs.
	logEvery  time.Duration
	recovered chan struct{}

	mu          sync.Mutex
	runFailures int // consecutive failed runs: they space runs out
	failures    int // failed runs and hits since the store last worked
	lastLog     time.Time
	unlogged    int // failures since the last log

	// While the store is known to be down, synchronous hits count locally
	// without trying it, so that requests do not each wait for a timeout.
	// A hit tries again once downUntil (Unix nanoseconds) has passed.
	downUntil atomic.Int64
	failing   atomic.Bool
}

func newHealth(name string, logger *zap.Logger) *health {
	return &health{name: name, logger: logger, logEvery: minLogInterval, recovered: make(chan struct{}, 1)}
}

// failedRun counts a failed sync run, which spaces the next runs out, and
// then counts it as a failure.
func (h *health) failedRun(err error, logInterval time.Duration) {
	h.mu.Lock()
	h.runFailures++
	h.mu.Unlock()
	h.failed(err, logInterval)
}

// failed counts a failure of a run or a hit, marks the store down for a
// moment, and logs, at most once per logInterval (or logEvery if longer).
// A cancelled call says nothing of the store.
func (h *health) failed(err error, logInterval time.Duration) {
	metrics.syncErrors.WithLabelValues(h.name).Inc()
	if errors.Is(err, context.Canceled) {
		return
	}
	h.downUntil.Store(time.Now().Add(retryInterval).UnixNano())
	h.failing.Store(true)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures++
	h.unlogged++
	if time.Since(h.lastLog) < max(h.logEvery, logInterval) {
		return
	}
	h.logger.Error("store unreachable: limits are enforced on local counts and hits are kept for later",
		zap.String("namespace", h.name),
		zap.Int("failures_since_last_log", h.unlogged),
		zap.Error(err))
	h.lastLog = time.Now()
	h.unlogged = 0
}

// down reports whether synchronous hits should skip the store for now.
func (h *health) down() bool {
	return h.downUntil.Load() > time.Now().UnixNano()
}

// succeeded records that the store worked. The first success after
// failures is logged and signalled.
func (h *health) succeeded() {
	if !h.failing.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failing.Swap(false) {
		h.logger.Info("store reachable again", zap.String("namespace", h.name), zap.Int("failures", h.failures))
		signal(h.recovered)
	}
	h.runFailures, h.failures, h.unlogged = 0, 0, 0
	h.lastLog = time.Time{}
	h.downUntil.Store(0)
}

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
