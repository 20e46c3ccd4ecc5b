package syncapp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
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
	// maxRetries bounds the synchronous hits kept for a retry; past it the
	// oldest are dropped (they still count locally).
	maxRetries = 10_000
	// minRunTimeout and maxRunTimeout bound one run (push and fetch).
	minRunTimeout = 5 * time.Second
	maxRunTimeout = 30 * time.Second
)

// syncer is a namespace's sync loop, pooled so it outlives config reloads.
// Configs attach their Namespace when they start and detach it when they
// stop; the loop always works for the most recently attached one, so that
// while an old and a new config overlap only one loop pushes, and a new
// config that fails to start hands the loop back to the old one.
type syncer struct {
	name   string
	logger *zap.Logger
	// logEvery is the least time between two logs of store failures:
	// minLogInterval, or longer in tests that count the logs.
	logEvery time.Duration

	mu       sync.Mutex
	attached []*Namespace

	// runSem serializes runs (the loop's, Sync and Fetch calls, the flushes
	// at stop): a batch is never pushed by two runs at once. It is a
	// channel so that waiting for it can give up at a deadline.
	runSem  chan struct{}
	pending *strategy.Batch // a batch whose push failed, retried as is
	// running is the namespace the loop's run in progress works for, if
	// any: Cleanup waits for that run before it closes the store.
	running atomic.Pointer[Namespace]
	// retries are synchronous hits that failed after they may have been
	// applied, each to be pushed as a batch of the hit's own ID.
	retriesMu sync.Mutex
	retries   []strategy.Batch
	// Keys to fetch: those touched since the last fetch, and those touched
	// before it. Keeping a key for a second run lets a node see the diffs
	// other nodes pushed in the same aligned run as its own fetch.
	fetch, fetchPrev map[string]struct{}
	// inflight sums, per counter, the diffs taken from the zone and not yet
	// in the store, for synchronous answers, which take the store's counts.
	inflight atomic.Pointer[map[counterID]float64]

	failingMu   sync.Mutex
	runFailures int // consecutive failed runs: they space runs out
	failures    int // failed runs and hits since the store last worked
	lastLog     time.Time
	unlogged    int // failures since the last log

	// While the store is known to be down, synchronous hits count locally
	// without trying it, so that requests do not each wait for a timeout.
	// A hit tries again once downUntil (Unix nanoseconds) has passed.
	downUntil atomic.Int64
	failing   atomic.Bool

	startOnce sync.Once
	wake      chan struct{} // the attached namespace changed
	kick      chan struct{} // run now: the store is back
	stop      chan struct{}
	done      chan struct{}
}

// counterID names one counter of a namespace.
type counterID struct {
	key   string
	size  time.Duration
	start int64
}

func newSyncer(name string, logger *zap.Logger) *syncer {
	return &syncer{
		name:      name,
		logger:    logger,
		logEvery:  minLogInterval,
		runSem:    make(chan struct{}, 1),
		fetch:     make(map[string]struct{}),
		fetchPrev: make(map[string]struct{}),
		wake:      make(chan struct{}, 1),
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
}

// attach makes ns the namespace the loop works for, and starts the loop the
// first time a namespace needs one.
func (s *syncer) attach(ns *Namespace) {
	s.mu.Lock()
	s.attached = append(s.attached, ns)
	s.mu.Unlock()
	ns.counters.SetTracked(ns.mode != Local)
	if ns.mode != Local {
		s.startOnce.Do(func() { go s.loop() })
	}
	signal(s.wake)
}

// detach forgets ns, and returns the namespace the loop works for now, or
// nil when no config holds the namespace any more.
func (s *syncer) detach(ns *Namespace) *Namespace {
	s.mu.Lock()
	for i, a := range s.attached {
		if a == ns {
			s.attached = append(s.attached[:i], s.attached[i+1:]...)
			break
		}
	}
	var cur *Namespace
	if n := len(s.attached); n > 0 {
		cur = s.attached[n-1]
		cur.counters.SetTracked(cur.mode != Local)
	}
	s.mu.Unlock()
	signal(s.wake)
	return cur
}

func (s *syncer) current() *Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.attached); n > 0 {
		return s.attached[n-1]
	}
	return nil
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// loop runs the namespace's syncs until the syncer is destructed. Periodic
// runs are aligned to multiples of sync_rate, and the next one is armed
// only when a run ends, so runs never pile up.
func (s *syncer) loop() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel() // abandon a run in flight
	}()
	for {
		ns := s.current()
		var timer *time.Timer
		var wait <-chan time.Time
		if ns != nil && ns.mode != Local {
			timer = time.NewTimer(s.delay(ns, time.Now()))
			wait = timer.C
		}
		run := false
		select {
		case <-s.stop:
		case <-s.wake:
		case <-s.kick:
			run = ns != nil && ns.mode != Local
		case <-wait:
			run = true
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-s.stop:
			return
		default:
		}
		if run {
			runCtx, cancelRun := context.WithTimeout(ctx, ns.runTimeout())
			s.runSafely(runCtx, ns)
			cancelRun()
		}
	}
}

// delay returns how long to wait for the next run: until the next multiple
// of sync_rate, pushed back exponentially while the store keeps failing.
func (s *syncer) delay(ns *Namespace, now time.Time) time.Duration {
	interval := retryInterval
	if ns.mode == Periodic {
		interval = ns.rate
	}
	s.failingMu.Lock()
	failures := s.runFailures
	s.failingMu.Unlock()
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

// runSafely is the loop's run for ns. It does nothing once ns is
// detached: from then on its config's Stop and Cleanup push for it, and
// Cleanup closes its store after the last run that used it.
func (s *syncer) runSafely(ctx context.Context, ns *Namespace) {
	defer recoverAndLog(s.logger, "syncing namespace")
	if ns.store == nil || s.lockRun(ctx) != nil {
		return
	}
	defer s.unlockRun()
	// Published before the check, so that awaitRun either sees this run
	// or this run sees ns detached.
	s.running.Store(ns)
	defer s.running.Store(nil)
	if s.current() == ns {
		_ = s.runLocked(ctx, ns, true)
	}
}

// lockRun waits for the run lock, or for ctx to end.
func (s *syncer) lockRun(ctx context.Context) error {
	select {
	case s.runSem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for a sync run of namespace %q: %w", s.name, ctx.Err())
	}
}

func (s *syncer) unlockRun() { <-s.runSem }

// awaitRun waits, until ctx ends, for a loop run for the detached ns that
// is still in progress. A run for another config's namespace does not
// hold it up.
func (s *syncer) awaitRun(ctx context.Context, ns *Namespace) {
	if s.running.Load() == ns && s.lockRun(ctx) == nil {
		s.unlockRun()
	}
}

// run pushes what ns's counters gained since the last run and, in periodic
// mode and with fetch set, fetches the store's counts of the keys touched
// recently.
func (s *syncer) run(ctx context.Context, ns *Namespace, fetch bool) error {
	if ns.store == nil {
		return nil
	}
	if err := s.lockRun(ctx); err != nil {
		return err
	}
	defer s.unlockRun()
	return s.runLocked(ctx, ns, fetch)
}

// runLocked is run, with the run lock held.
func (s *syncer) runLocked(ctx context.Context, ns *Namespace, fetch bool) error {
	start := time.Now()
	contacted, err := s.pushAndFetch(ctx, ns, fetch && ns.mode == Periodic)
	metrics.syncDuration.WithLabelValues(s.name).Observe(time.Since(start).Seconds())
	switch {
	case err != nil:
		s.failingMu.Lock()
		s.runFailures++
		s.failingMu.Unlock()
		s.failed(ns, err)
	case contacted: // a run with nothing to do says nothing of the store
		s.succeeded()
	}
	return err
}

// pushAndFetch does one run's work, and reports whether it asked the store
// anything.
func (s *syncer) pushAndFetch(ctx context.Context, ns *Namespace, fetch bool) (contacted bool, err error) {
	diffs, keys := ns.counters.Take()
	diffs = s.storable(diffs)
	if fetch {
		for _, k := range keys {
			if len(s.fetch) >= ns.counters.Zone().Capacity() {
				break // touched again, a key is fetched again
			}
			s.fetch[k] = struct{}{}
		}
	}
	var batch *strategy.Batch
	if len(diffs) > 0 {
		batch = &strategy.Batch{ID: newBatchID(), Namespace: s.name, Diffs: diffs}
	}
	retries := s.takeRetries()
	if ns.mode == Synchronous || len(retries) > 0 {
		s.setInflight(retries, s.pending, batch)
		defer func() { s.setInflight(s.unpushedRetries(), s.pending) }()
	}
	for i, r := range retries {
		if err := s.push(ctx, ns, r); err != nil {
			s.putBackRetries(retries[i:])
			if batch != nil {
				ns.counters.Restore(batch.Diffs)
			}
			return true, fmt.Errorf("retrying failed hits: %w", err)
		}
		contacted = true
	}
	if s.pending != nil {
		if err := s.push(ctx, ns, *s.pending); err != nil {
			if batch != nil {
				// Its diffs go back to the zone: at most one batch waits.
				ns.counters.Restore(batch.Diffs)
			}
			return true, fmt.Errorf("retrying a failed push: %w", err)
		}
		s.pending = nil
		contacted = true
	}
	if batch != nil {
		if err := s.push(ctx, ns, *batch); err != nil {
			s.pending = batch
			return true, err
		}
		contacted = true
	}
	if !fetch || len(s.fetch)+len(s.fetchPrev) == 0 {
		return contacted, nil
	}
	keys = keys[:0]
	for k := range s.fetch {
		keys = append(keys, k)
	}
	for k := range s.fetchPrev {
		if _, dup := s.fetch[k]; !dup {
			keys = append(keys, k)
		}
	}
	counts, err := ns.store.GetCounters(ctx, s.name, keys, ns.WindowSizes(), time.Now())
	if err != nil {
		return true, err
	}
	ns.counters.Apply(counts)
	clear(s.fetchPrev)
	s.fetch, s.fetchPrev = s.fetchPrev, s.fetch
	return true, nil
}

// setInflight records the diffs of the given batches as on their way to
// the store.
func (s *syncer) setInflight(retries []strategy.Batch, batches ...*strategy.Batch) {
	m := make(map[counterID]float64)
	add := func(b strategy.Batch) {
		for _, d := range b.Diffs {
			m[counterID{d.Key, d.Size, d.Start}] += d.Value
		}
	}
	for _, b := range retries {
		add(b)
	}
	for _, b := range batches {
		if b != nil {
			add(*b)
		}
	}
	if len(m) == 0 {
		s.inflight.Store(nil)
		return
	}
	s.inflight.Store(&m)
}

// retryHit keeps a synchronous hit that failed after it may have been
// applied, to be pushed as a batch of the hit's ID: the increments the
// local decision made (nothing, if undo took them back).
func (s *syncer) retryHit(namespace, id, key string, windows []strategy.WindowHit, rejected int, undo bool) {
	b := strategy.Batch{ID: id, Namespace: namespace}
	if rejected < 0 || !undo {
		for i, w := range windows {
			if rejected >= 0 && i > rejected {
				break
			}
			b.Diffs = append(b.Diffs, window.Diff{Key: key, Size: w.Size, Start: w.Start, Value: w.Value})
		}
	}
	if len(b.Diffs) == 0 {
		return
	}
	s.retriesMu.Lock()
	defer s.retriesMu.Unlock()
	if len(s.retries) >= maxRetries {
		s.retries = s.retries[1:]
	}
	s.retries = append(s.retries, b)
}

func (s *syncer) takeRetries() []strategy.Batch {
	s.retriesMu.Lock()
	defer s.retriesMu.Unlock()
	r := s.retries
	s.retries = nil
	return r
}

// putBackRetries returns hits whose push failed, ahead of newer ones.
func (s *syncer) putBackRetries(r []strategy.Batch) {
	s.retriesMu.Lock()
	defer s.retriesMu.Unlock()
	s.retries = append(r[:len(r):len(r)], s.retries...)
	if n := len(s.retries); n > maxRetries {
		s.retries = s.retries[n-maxRetries:]
	}
}

// unpushedRetries returns the hits waiting for a retry.
func (s *syncer) unpushedRetries() []strategy.Batch {
	s.retriesMu.Lock()
	defer s.retriesMu.Unlock()
	return s.retries
}

// inflightFor returns the diffs of one counter on their way to the store.
func (s *syncer) inflightFor(key string, size time.Duration, start int64) float64 {
	if m := s.inflight.Load(); m != nil {
		return (*m)[counterID{key, size, start}]
	}
	return 0
}

// storable drops diffs of windows a store cannot keep (not whole
// milliseconds), which only the Go API can create: AddWindowSizes refuses
// them in configs.
func (s *syncer) storable(diffs []window.Diff) []window.Diff {
	kept := diffs[:0]
	for _, d := range diffs {
		if d.Size%time.Millisecond == 0 {
			kept = append(kept, d)
		}
	}
	if dropped := len(diffs) - len(kept); dropped > 0 {
		s.logger.Warn("dropping diffs of windows that are not whole milliseconds",
			zap.String("namespace", s.name), zap.Int("diffs", dropped))
	}
	return kept
}

// push pushes a batch. A batch the store rejects for its content would
// fail on every retry, so it is logged and dropped.
func (s *syncer) push(ctx context.Context, ns *Namespace, batch strategy.Batch) error {
	err := ns.store.PushDiffs(ctx, batch)
	if errors.Is(err, strategy.ErrRejected) {
		metrics.syncErrors.WithLabelValues(s.name).Inc()
		s.logger.Error("the store rejected a batch of diffs; dropping it",
			zap.String("namespace", s.name), zap.Int("diffs", len(batch.Diffs)), zap.Error(err))
		return nil
	}
	return err
}

// pendingDiffs returns how many diffs wait to be pushed: those in the zone,
// of a retained batch and of hits to retry.
func (s *syncer) pendingDiffs() int {
	n := 0
	if ns := s.current(); ns != nil {
		n += ns.counters.Pending()
	}
	select {
	case s.runSem <- struct{}{}:
		if s.pending != nil {
			n += len(s.pending.Diffs)
		}
		s.unlockRun()
	default: // a run is busy with them
	}
	s.retriesMu.Lock()
	for _, b := range s.retries {
		n += len(b.Diffs)
	}
	s.retriesMu.Unlock()
	return n
}

// hasPending reports whether a run for ns would have anything to push.
func (s *syncer) hasPending(ns *Namespace) bool {
	if ns.counters.Pending() > 0 || len(s.unpushedRetries()) > 0 {
		return true
	}
	select {
	case s.runSem <- struct{}{}:
		defer s.unlockRun()
		return s.pending != nil
	default:
		return true // a run is busy: let the flush wait for it
	}
}

// failed counts a failure of a run or a hit, marks the store down for a
// moment, and logs, at most once per log interval.
func (s *syncer) failed(ns *Namespace, err error) {
	metrics.syncErrors.WithLabelValues(s.name).Inc()
	if errors.Is(err, context.Canceled) {
		return
	}
	s.downUntil.Store(time.Now().Add(retryInterval).UnixNano())
	s.failing.Store(true)
	s.failingMu.Lock()
	defer s.failingMu.Unlock()
	s.failures++
	s.unlogged++
	interval := s.logEvery
	if ns.mode == Periodic {
		interval = max(interval, ns.rate)
	}
	if time.Since(s.lastLog) < interval {
		return
	}
	s.logger.Error("store unreachable: limits are enforced on local counts and hits are kept for later",
		zap.String("namespace", s.name),
		zap.Int("failures_since_last_log", s.unlogged),
		zap.Error(err))
	s.lastLog = time.Now()
	s.unlogged = 0
}

// storeDown reports whether synchronous hits should skip the store for now.
func (s *syncer) storeDown() bool {
	return s.downUntil.Load() > time.Now().UnixNano()
}

// succeeded records that the store worked. The first success after
// failures is logged, and has the loop push what waited at once.
func (s *syncer) succeeded() {
	if !s.failing.Load() {
		return
	}
	s.failingMu.Lock()
	defer s.failingMu.Unlock()
	if s.failing.Swap(false) {
		s.logger.Info("store reachable again", zap.String("namespace", s.name), zap.Int("failures", s.failures))
		signal(s.kick)
	}
	s.runFailures, s.failures, s.unlogged = 0, 0, 0
	s.lastLog = time.Time{}
	s.downUntil.Store(0)
}

// Destruct stops the loop when the last config that names the namespace is
// gone; that config's cleanup already pushed what was pending.
func (s *syncer) Destruct() error {
	close(s.stop)
	started := true
	s.startOnce.Do(func() { started = false })
	if started {
		<-s.done
	}
	return nil
}

func newBatchID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
