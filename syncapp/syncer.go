package syncapp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

const (
	// minRunTimeout and maxRunTimeout bound one run (push and fetch).
	minRunTimeout = 5 * time.Second
	maxRunTimeout = 30 * time.Second
)

// syncer is a namespace's sync loop, pooled so it outlives config reloads.
// Configs attach their Namespace when they start and detach it when they
// stop; the loop always works for the most recently attached one, so that
// while an old and a new config overlap only one loop pushes, and a new
// config that fails to start hands the loop back to the old one.
//
// Its parts each have one job: health (store failures, backoff and their
// logs), retries (synchronous hits to push again), inflight (diffs on
// their way to the store); the syncer itself runs the pushes and fetches
// and decides who pushes what on a reload.
type syncer struct {
	name   string
	logger *zap.Logger
	pool   *caddy.UsagePool

	health   *health
	retries  retryQueue
	inflight inflight
	// taking is held by a run from taking the zone's diffs until inflight
	// has them, and shared by synchronous hits reading inflight.
	taking sync.RWMutex

	// Requests in flight per key (max_concurrent) on this node, and the
	// slots they hold in stores.
	inFlight inFlight
	slots    *slotHolder

	// The bans of the namespace this node knows of.
	bans banTable

	mu       sync.Mutex
	attached []*Namespace
	// held are the pool keys of the stores the loop holds a reference to:
	// those of the attached namespaces, and of namespaces detached since
	// the last run ended. A store so outlives every run that uses it.
	held []poolKey

	// runSem serializes runs (the loop's, Sync and Fetch calls, the flushes
	// at stop): a batch is never pushed by two runs at once. It is a
	// channel so that waiting for it can give up at a deadline.
	runSem  chan struct{}
	pending *strategy.Batch // a batch whose push failed, retried as is
	// Keys to fetch, each with the number of the fetch after which it was
	// last touched; fetches counts the fetches made. A key is fetched by
	// the fetches of fetchRuns (at least two): the second lets a node see
	// the diffs other nodes pushed in the same aligned run as its own
	// fetch, and more keep a key that a node sees less often than every
	// two runs up to date between its requests.
	fetch   map[string]int64
	fetches int64

	startOnce sync.Once
	wake      chan struct{} // the attached namespace changed
	stop      chan struct{}
	done      chan struct{}
}

func newSyncer(name string, logger *zap.Logger, pool *caddy.UsagePool) *syncer {
	h := newHealth(name, logger)
	return &syncer{
		slots:  newSlotHolder(logger, h),
		bans:   newBanTable(),
		name:   name,
		logger: logger,
		pool:   pool,
		health: h,
		runSem: make(chan struct{}, 1),
		fetch:  make(map[string]int64),
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
}

// attach makes ns the namespace the loop works for, takes a reference to
// its store, and starts the loop the first time a namespace needs one.
func (s *syncer) attach(ns *Namespace) {
	s.mu.Lock()
	s.attached = append(s.attached, ns)
	if ns.store != nil && !slices.Contains(s.held, ns.storeKey) {
		// ns's config holds the store, so this only counts a reference.
		if _, loaded, _ := s.pool.LoadOrNew(ns.storeKey, noNewStore); loaded {
			s.held = append(s.held, ns.storeKey)
		}
	}
	s.mu.Unlock()
	ns.counters.SetTracked(ns.mode != Local)
	if ns.mode != Local {
		s.startOnce.Do(func() { go s.loop() })
	}
	signal(s.wake)
}

// noNewStore is the constructor of a pool look-up that only takes a
// reference to a store that is there.
func noNewStore() (caddy.Destructor, error) {
	return nil, errors.New("the store is not open")
}

// detach forgets ns, whose config is stopping. It reports whether ns must
// push what it has pending through its own store: unless the namespace
// now attached (the next config's, or on a failed reload the one that
// keeps running) counts in the same zone and syncs, and so takes over.
func (s *syncer) detach(ns *Namespace) (flush bool) {
	s.mu.Lock()
	if i := slices.Index(s.attached, ns); i >= 0 {
		s.attached = slices.Delete(s.attached, i, i+1)
	}
	var cur *Namespace
	if n := len(s.attached); n > 0 {
		cur = s.attached[n-1]
		cur.counters.SetTracked(cur.mode != Local)
	}
	s.mu.Unlock()
	signal(s.wake)
	return !takesOver(cur, ns)
}

// takesOver reports whether next, the namespace that runs after ns, pushes
// what ns has pending: it counts in the same zone and syncs with a store.
func takesOver(next, ns *Namespace) bool {
	return next != nil && next.counters == ns.counters && next.store != nil
}

// mustFlush reports whether ns, detached, still has to push what it counts
// itself: no attached namespace takes it over.
func (s *syncer) mustFlush(ns *Namespace) bool {
	return !takesOver(s.current(), ns)
}

func (s *syncer) current() *Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.attached); n > 0 {
		return s.attached[n-1]
	}
	return nil
}

// releaseStores gives back the references to stores that no attached
// namespace uses any more (all of them when all is set). The caller holds
// the run lock, or the loop has ended, so no run uses them.
func (s *syncer) releaseStores(all bool) {
	s.mu.Lock()
	var release []poolKey
	s.held = slices.DeleteFunc(s.held, func(k poolKey) bool {
		used := !all && slices.ContainsFunc(s.attached, func(ns *Namespace) bool { return ns.storeKey == k })
		if !used {
			release = append(release, k)
		}
		return !used
	})
	s.mu.Unlock()
	for _, k := range release {
		if _, err := s.pool.Delete(k); err != nil {
			s.logger.Error("releasing a store", zap.String("namespace", s.name), zap.Error(err))
		}
	}
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
			timer = time.NewTimer(s.health.delay(ns.runInterval(), time.Now()))
			wait = timer.C
		}
		run, woken := false, false
		select {
		case <-s.stop:
		case <-s.wake:
			woken = true
		case <-s.health.recovered:
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
		if woken && s.lockRun(ctx) == nil {
			s.releaseStores(false)
			s.unlockRun()
		}
		if run {
			runCtx, cancelRun := context.WithTimeout(ctx, ns.runTimeout())
			s.runSafely(runCtx, ns)
			cancelRun()
		}
	}
}

// runSafely is the loop's run for ns. It does nothing once ns is
// detached: from then on its config's Stop and Cleanup push for it.
func (s *syncer) runSafely(ctx context.Context, ns *Namespace) {
	defer recoverAndLog(s.logger, "syncing namespace")
	if ns.store == nil || s.lockRun(ctx) != nil {
		return
	}
	defer s.unlockRun()
	if s.current() == ns {
		_ = s.runLocked(ctx, ns, true, fetchAfter(time.Now(), ns.runInterval()))
	}
}

// fetchAfter returns when the periodic run aligned at or just before now
// fetches: a beat after the instant at which every node pushes, so that
// the other nodes' pushes of that instant have landed and a node sees the
// others' hits one interval (and a beat) after they were made, not two. A
// push that takes longer is fetched by the next run: each key touched is
// fetched twice.
func fetchAfter(now time.Time, interval time.Duration) time.Time {
	iv := int64(interval)
	aligned := now.UnixNano() / iv * iv
	return time.Unix(0, aligned).Add(fetchBeat(interval))
}

// fetchBeat is how long after the aligned instant a periodic run fetches:
// a fifth of the interval, at most 10ms. A push of a few thousand keys
// lands within it on a local network, and it adds at most a fifth of an
// interval to how long the others' hits stay unseen.
func fetchBeat(interval time.Duration) time.Duration {
	return min(interval/5, 10*time.Millisecond)
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
	return s.runLocked(ctx, ns, fetch, time.Time{})
}

// runLocked is run, with the run lock held; with fetch, the fetch waits
// until fetchAt, which the run's duration does not count.
func (s *syncer) runLocked(ctx context.Context, ns *Namespace, fetch bool, fetchAt time.Time) error {
	start := time.Now()
	contacted, waited, err := s.pushAndFetch(ctx, ns, fetch && ns.mode == Periodic, fetchAt)
	if err == nil {
		var asked bool
		asked, err = s.syncBans(ctx, ns)
		contacted = contacted || asked
	}
	metrics.syncDuration.WithLabelValues(s.name).Observe((time.Since(start) - waited).Seconds())
	switch {
	case err != nil:
		s.health.failedRun(err, ns.rate)
	case contacted: // a run with nothing to do says nothing of the store
		s.health.succeeded()
	}
	return err
}

// pushAndFetch does one run's work, and reports whether it asked the store
// anything and how long it waited for fetchAt.
func (s *syncer) pushAndFetch(ctx context.Context, ns *Namespace, fetch bool, fetchAt time.Time) (contacted bool, waited time.Duration, err error) {
	contacted, err = s.pushPending(ctx, ns)
	if err != nil || !fetch {
		return contacted, 0, err
	}
	keys := s.keysToFetch(ns)
	if len(keys) == 0 {
		return contacted, 0, nil
	}
	if wait := time.Until(fetchAt); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return contacted, wait, ctx.Err()
		}
		waited = wait
	}
	return true, waited, s.fetchCounts(ctx, ns, keys)
}

// pushPending pushes the hits to retry, a batch whose push failed, and
// what the zone gained since the last run, and reports whether it asked
// the store anything. In a periodic namespace, the keys touched join
// those the next fetch reads.
func (s *syncer) pushPending(ctx context.Context, ns *Namespace) (contacted bool, err error) {
	// From Take until inflight has them, the diffs taken are in neither
	// the zone nor inflight: a near hit must not read in between.
	track := ns.hitter != nil
	if track {
		s.taking.Lock()
	}
	diffs, keys := ns.counters.Take()
	diffs = s.storable(ns, diffs)
	if ns.mode == Periodic {
		for _, k := range keys {
			if _, ok := s.fetch[k]; !ok && len(s.fetch) >= ns.counters.Zone().Capacity() {
				break // touched again, a key is fetched again
			}
			s.fetch[k] = s.fetches
		}
	}
	var batch *strategy.Batch
	if len(diffs) > 0 {
		batch = &strategy.Batch{ID: newBatchID(), Namespace: s.name, Diffs: diffs}
	}
	retries := s.retries.take()
	if track || len(retries) > 0 {
		s.inflight.set(retries, s.pending, batch)
		defer func() { s.inflight.set(s.retries.queued(), s.pending) }()
	}
	if track {
		s.taking.Unlock()
	}
	for i, r := range retries {
		if err := s.push(ctx, ns, r); err != nil {
			s.retries.putBack(retries[i:])
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
	return contacted, nil
}

// fetchSpan is how long after its last request a key stays fetched, at
// least: a node that sees a key every 30ms in a namespace synced every
// 10ms then holds the others' counts of one run ago, not of its previous
// request. Above 50ms it changes nothing: every key is fetched twice.
const fetchSpan = 100 * time.Millisecond

// fetchRuns is how many fetches read a key after a run that found it
// touched.
func fetchRuns(interval time.Duration) int64 {
	if interval <= 0 {
		return 2
	}
	return max(2, int64((fetchSpan+interval-1)/interval))
}

// keysToFetch returns the keys touched within the last fetchRuns runs,
// and forgets the others.
func (s *syncer) keysToFetch(ns *Namespace) []string {
	runs := fetchRuns(ns.runInterval())
	keys := make([]string, 0, len(s.fetch))
	for k, last := range s.fetch {
		if s.fetches-last >= runs {
			delete(s.fetch, k)
			continue
		}
		keys = append(keys, k)
	}
	return keys
}

// fetchCounts reads the store's counts of keys into the zone.
func (s *syncer) fetchCounts(ctx context.Context, ns *Namespace, keys []string) error {
	counts, err := ns.store.GetCounters(ctx, s.name, keys, ns.WindowSizes(), time.Now())
	if err != nil {
		return err
	}
	ns.counters.Apply(counts)
	s.fetches++
	return nil
}

// storable drops diffs of windows the store cannot keep, which only the
// Go API can create: AddWindowSizes refuses them in configs.
func (s *syncer) storable(ns *Namespace, diffs []window.Diff) []window.Diff {
	kept := diffs[:0]
	for _, d := range diffs {
		if ns.validWindow == nil || ns.validWindow(d.Size) == nil {
			kept = append(kept, d)
		}
	}
	if dropped := len(diffs) - len(kept); dropped > 0 {
		s.logger.Warn("dropping diffs of windows the store cannot keep",
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
	return n + s.retries.diffs()
}

// hasPending reports whether a run for ns would have anything to push.
func (s *syncer) hasPending(ns *Namespace) bool {
	if ns.counters.Pending() > 0 || len(s.retries.queued()) > 0 {
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

// Destruct stops the loop when the last config that names the namespace is
// gone (that config's cleanup already pushed what was pending), and gives
// back the loop's references to stores.
func (s *syncer) Destruct() error {
	s.slots.close()
	close(s.stop)
	started := true
	s.startOnce.Do(func() { started = false })
	if started {
		<-s.done
	}
	s.releaseStores(true)
	return nil
}

func newBatchID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
