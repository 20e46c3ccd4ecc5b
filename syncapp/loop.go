package syncapp

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
)

// loop is a namespace's sync timer and its reload hand-off, pooled with
// the rest of the namespace's fleet state (fleetState) so that it
// outlives config reloads. Configs attach their namespace's runner when
// they start and detach it when they stop; the loop always runs the most
// recently attached one, so that while an old and a new config overlap
// only one loop pushes, and a new config that fails to start hands the
// loop back to the old one.
//
// A run is the runner's (run.go): the loop only says when, and never
// sees a Namespace. It also holds a reference to the stores of the
// runners attached, so that a store outlives every run of the loop that
// uses it.
type loop struct {
	name   string
	logger *zap.Logger
	pool   *caddy.UsagePool
	health *health // failures space runs out; a recovery runs at once
	runs   runLock

	mu       lockorder.Mutex[loopLock]
	attached []*runner
	// held are the pool keys of the stores the loop holds a reference to:
	// those of the attached runners, and of runners detached since the
	// last run ended.
	held []poolKey

	wake   chan struct{} // the attached runner changed
	worker worker
}

func newLoop(name string, logger *zap.Logger, pool *caddy.UsagePool, h *health, runs runLock) *loop {
	return &loop{
		name:   name,
		logger: logger,
		pool:   pool,
		health: h,
		runs:   runs,
		wake:   make(chan struct{}, 1),
		worker: newWorker("syncing namespace"),
	}
}

// attach makes r the runner the loop runs, takes a reference to its
// store, and starts the loop the first time a runner needs one.
func (l *loop) attach(r *runner) {
	l.mu.Lock()
	l.attached = append(l.attached, r)
	hold := r.store != nil && !slices.Contains(l.held, r.storeKey)
	l.mu.Unlock()
	if hold {
		l.holdStore(r.storeKey)
	}
	if r.mode != Local {
		l.worker.start(l.logger, l.loop)
	}
	signal(l.wake)
}

// holdStore takes the loop's reference to the store of key, which an
// attached runner's config holds. It takes the pool's lock without
// loop.mu: the metrics' collector takes loop.mu (through current) under
// the pool's lock.
func (l *loop) holdStore(key poolKey) {
	if _, loaded, _ := l.pool.LoadOrNew(key, noNewStore); !loaded {
		return
	}
	l.mu.Lock()
	twice := slices.Contains(l.held, key) // another attach took it meanwhile
	if !twice {
		l.held = append(l.held, key)
	}
	l.mu.Unlock()
	if twice {
		_, _ = l.pool.Delete(key)
	}
}

// noNewStore is the constructor of a pool look-up that only takes a
// reference to a store that is there.
func noNewStore() (caddy.Destructor, error) { return nil, errors.New("the store is not open") }

// detach forgets r, whose config is stopping, and returns the runner the
// loop runs now: the next config's, or on a failed reload the one that
// keeps running; nil if none.
func (l *loop) detach(r *runner) (next *runner) {
	l.mu.Lock()
	if i := slices.Index(l.attached, r); i >= 0 {
		l.attached = slices.Delete(l.attached, i, i+1)
	}
	l.mu.Unlock()
	signal(l.wake)
	return l.current()
}

// current returns the runner the loop runs, or nil.
func (l *loop) current() *runner {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.attached); n > 0 {
		return l.attached[n-1]
	}
	return nil
}

// releaseStores gives back the references to stores that no attached
// runner uses any more (all of them when all is set). The caller holds
// the run lock, or the loop has ended, so no run uses them.
func (l *loop) releaseStores(all bool) {
	l.mu.Lock()
	var release []poolKey
	l.held = slices.DeleteFunc(l.held, func(k poolKey) bool {
		used := !all && slices.ContainsFunc(l.attached, func(r *runner) bool { return r.storeKey == k })
		if !used {
			release = append(release, k)
		}
		return !used
	})
	l.mu.Unlock()
	for _, k := range release {
		if _, err := l.pool.Delete(k); err != nil {
			l.logger.Error("releasing a store", zap.String("namespace", l.name), zap.Error(err))
		}
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// loop runs the namespace's syncs until the loop is closed. Periodic runs
// are aligned to multiples of sync_rate, and the next one is armed only
// when a run ends, so runs never pile up. A wake (a config attached or
// detached) never puts the next run off: reloads that come faster than
// the runs would otherwise starve them, and with them the bans and the
// diffs they carry.
func (l *loop) loop() {
	stop := l.worker.stopping()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // ends with this call of loop, or a panic's would pile up
		select {
		case <-stop:
			cancel() // abandon a run in flight
		case <-ctx.Done():
		}
	}()
	var due time.Time // when the next run is due; zero once one ran
	for {
		r := l.current()
		syncs := r != nil && r.mode != Local
		var timer *time.Timer
		var wait <-chan time.Time
		var backlog <-chan struct{}
		if syncs {
			now := time.Now()
			if next := now.Add(l.health.delay(r.interval(), now)); due.IsZero() || next.Before(due) {
				due = next
			}
			timer = time.NewTimer(due.Sub(now))
			wait = timer.C
			backlog = r.backlog()
		}
		run, early, woken := false, false, false
		select {
		case <-stop:
		case <-l.wake:
			woken = true
		case <-l.health.recoveries():
			run = syncs
		case <-l.health.probes():
			// The store just failed a request: probe it now, so that
			// requests use it again at once if it was a blip.
			early = syncs
		case <-wait:
			run = true
		case <-backlog:
			// Keys with diffs leave the zone faster than the runs take
			// them: push now, unless the store is failing (then the
			// zone drops the oldest past twice its capacity).
			early = !l.health.down()
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-stop:
			return
		default:
		}
		if woken && l.runs.lock(ctx, l.name) == nil {
			l.releaseStores(false)
			l.runs.unlock()
		}
		if run || early {
			runCtx, cancelRun := context.WithTimeout(ctx, r.timeout())
			l.runCurrent(runCtx, !early)
			cancelRun()
			due = time.Time{}
		}
	}
}

// runCurrent does one run of the runner attached once the run lock is
// taken (a runner detached meanwhile has its config's Stop and Cleanup
// push for it): a periodic run, or with periodic false a push alone.
func (l *loop) runCurrent(ctx context.Context, periodic bool) {
	defer recoverAndLog(l.logger, "syncing namespace")
	if l.runs.lock(ctx, l.name) != nil {
		return
	}
	defer l.runs.unlock()
	if r := l.current(); r != nil && r.store != nil {
		var fetchAt time.Time
		if periodic {
			fetchAt = fetchAfter(time.Now(), r.interval())
		}
		if r.runLocked(ctx, periodic, fetchAt) == nil {
			r.maintain(ctx)
		}
	}
}

// close stops the loop, and gives back its references to stores.
func (l *loop) close() {
	l.worker.close()
	l.releaseStores(true)
}
