package syncapp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

const (
	// minRunTimeout and maxRunTimeout bound one run (push and fetch).
	minRunTimeout = 5 * time.Second
	maxRunTimeout = 30 * time.Second
)

// runner does the sync runs of a config's namespace with its store. A run
// pushes what the zone and the outbox hold, fetches the counts of the keys
// touched lately (periodic mode), and syncs the bans. The loop runs the
// runner of the config attached to it on its timer; Sync and the flushes
// at stop run it too. Fetch and a reset's part in the store are the
// runner's as well: like a run, they must not fall between a push and
// what it took. One of them at a time: each holds the run lock.
//
// A config's Namespace holds its runner, made of the config's settings
// and store and of the pooled parts of the namespace's fleet state. The
// runner never calls the Namespace: what it needs of it is in its fields.
type runner struct {
	name     string
	mode     Mode
	rate     time.Duration
	logger   *zap.Logger
	counters *window.Namespace
	sizes    *windowSizes

	// The config's store, nil in a local namespace, and its pool key: the
	// loop holds a reference to the store of each runner attached.
	store       strategy.Store
	storeKey    poolKey
	storeModule string
	banner      strategy.Banner // the store, when it can hold bans
	// bansUsed says that a handler of this config bans in the namespace:
	// its runs then read the store's bans. It belongs to the config, so a
	// reload that drops the last ban handler stops the reads.
	bansUsed atomic.Bool

	// feed is the store, when it tells of keys near their limits and the
	// namespace is periodic: the runs then read its marks into near, and
	// ask it to mark a key when a push brings one of its windows to
	// nearShare of its limit.
	feed      strategy.NearFeed
	near      *nearKeys
	nearShare float64

	// roster is the store, when the namespace's on_store_failure is
	// share: the runs attend it to learn the fleet's size into members.
	roster  strategy.Roster
	members *fleetMembers
	// watched says that the namespace's on_store_failure is share or
	// deny: a run with nothing to send pings the store.
	watched bool

	lock    runLock
	outbox  *outbox
	fetched *fetchSet
	health  *health
	bans    *banTable
	slots   *slotHolder
}

// run takes the run lock and does a run; with fetch, a periodic namespace
// fetches at once.
func (r *runner) run(ctx context.Context, fetch bool) error {
	if r.store == nil {
		return nil
	}
	if err := r.lock.lock(ctx, r.name); err != nil {
		return err
	}
	defer r.lock.unlock()
	return r.runLocked(ctx, fetch, time.Time{})
}

// runLocked is run, with the run lock held; with fetch, the fetch waits
// until fetchAt, which the run's duration does not count.
func (r *runner) runLocked(ctx context.Context, fetch bool, fetchAt time.Time) error {
	start := time.Now()
	var contacted, fetched bool
	var waited time.Duration
	var err error
	// step does one part of the run, unless an earlier one failed, and
	// keeps whether it asked the store anything and its failure (partly).
	step := func(f func() (asked bool, err error)) {
		if err == nil {
			asked, stepErr := f()
			contacted, err = contacted || asked, r.partly(stepErr)
		}
	}
	step(func() (bool, error) { return r.pushPending(ctx) })
	if fetch && r.mode == Periodic {
		step(func() (_ bool, err error) {
			fetched, waited, err = r.fetchDue(ctx, fetchAt)
			return fetched, err
		})
	}
	if !fetched {
		// A fetch carries the marks asked for (getCounters); those asked
		// after it wait for the next run's.
		step(func() (bool, error) { return r.markAsked(ctx) })
	}
	step(func() (bool, error) { return r.syncBans(ctx) })
	step(func() (bool, error) {
		if r.roster == nil || r.health.partDownFor("") {
			return false, nil
		}
		return r.members.attend(ctx, r.roster, r.name, max(r.interval(), attendEvery))
	})
	switch {
	case err != nil || contacted:
	case r.health.down():
		// Requests skip the store until a run finds it back; this one
		// had nothing else to ask it.
		contacted, err = r.ping(ctx)
	case r.watched:
		// Its policy must start once the store fails, requests or not:
		// an idle run asks the store, within the stall bound.
		pctx, cancel := context.WithTimeout(ctx, stallAfter)
		contacted, err = r.ping(pctx)
		cancel()
	}
	if p := r.health.parted(); err == nil && p != nil && r.health.partsDown() > 0 {
		// So do the keys of the parts that failed.
		down := r.health.downParts()
		contacted, err = true, r.answered(down, p.PingParts(ctx, down))
	}
	if err == nil && r.slots.hasLocal() {
		// Requests admitted while the store could not be asked take
		// their slots in it before the node counts as syncing again.
		contacted, err = true, r.partly(r.slots.adopt(ctx, r.health.partDownFor))
	}
	metrics.syncDuration.WithLabelValues(r.name).Observe((time.Since(start) - waited).Seconds())
	switch {
	case err != nil:
		r.health.failedRun(err, r.rate)
	case contacted: // a run with nothing to do says nothing of the store
		r.health.succeeded()
	}
	return err
}

// maintain has the store do its housekeeping, if it has any due, after a
// run that went well: on a connection the run's calls gave back, so that
// the store's pool needs none more for it (see strategy.Maintainer).
func (r *runner) maintain(ctx context.Context) {
	if m, ok := r.store.(strategy.Maintainer); ok {
		m.Maintain(ctx)
	}
}

// partly records err, when it is the failure of some parts of a store
// made of parts (see storeHealth), as theirs, and returns nil: the run
// goes on with the other parts. Any other err it returns as is.
func (r *runner) partly(err error) error {
	if _, partial := strategy.FailedParts(err); !partial || r.health.parted() == nil {
		return err
	}
	r.health.fail(err, r.rate)
	return nil
}

// failedWhole reports whether err is a failure of a whole call, not of
// some parts of a store made of parts (strategy.PartialError), whose call
// brings back what the others answered.
func failedWhole(err error) bool {
	_, partial := strategy.FailedParts(err)
	return err != nil && !partial
}

// answered brings back the parts that a call that asked the given parts
// did not name failed in its err, and records the others as failed.
func (r *runner) answered(parts []int, err error) error {
	failed, _ := strategy.FailedParts(err)
	r.health.partsAnswered(parts, failed)
	return r.partly(err)
}

// fetchDue reads the store's counts of the keys due (and with a feed, its
// marks) once fetchAt has come, and reports whether it asked the store
// anything and how long it waited for fetchAt. With no key due, a node
// with a feed rests (nearKeys.rest) and asks nothing.
func (r *runner) fetchDue(ctx context.Context, fetchAt time.Time) (contacted bool, waited time.Duration, err error) {
	keys := r.fetched.due(fetchRuns(r.interval()))
	if len(keys) == 0 && r.feed != nil {
		r.near.rest()
	}
	if r.health.partsDown() > 0 {
		// The keys of the parts down keep their counts until a ping
		// finds their parts back: nothing is asked of a dead server.
		keys = slices.DeleteFunc(keys, r.health.partDownFor)
	}
	if len(keys) == 0 {
		return false, 0, nil
	}
	if wait := time.Until(fetchAt); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false, wait, ctx.Err()
		}
		waited = wait
	}
	if err = r.apply(r.getCounters(ctx, keys)); !failedWhole(err) {
		r.fetched.fetched()
	}
	return true, waited, err
}

// markAsked makes the marks that this node's synchronous hits asked for
// (nearKeys.ask), which no push makes, when the run fetched nothing to
// carry them (getCounters): the other nodes read them with their next
// runs, as a push's. It reports whether it asked the store anything;
// marks it failed to make wait for the next run.
func (r *runner) markAsked(ctx context.Context) (asked bool, err error) {
	if r.feed == nil || r.health.partDownFor("") {
		return false, nil // the marks wait for the feed's part
	}
	marks := r.near.takeAsked()
	if len(marks) == 0 {
		return false, nil
	}
	if err := r.feed.MarkNear(ctx, r.name, marks); err != nil {
		r.near.reask(marks)
		return true, err
	}
	r.near.made(marks, r.counters.Zone().Capacity(), time.Unix(0, r.counters.Now()))
	return true, nil
}

// getCounters reads the store's counts of keys, and with a feed the marks
// made since the last read, in the same round trip, and makes the marks
// that this node's synchronous hits asked for (see markAsked) after the
// read: on PostgreSQL in its transaction.
func (r *runner) getCounters(ctx context.Context, keys []string) ([]window.Count, error) {
	now := time.Unix(0, r.counters.Now())
	if r.feed == nil || r.health.partDownFor("") {
		// Without the feed's part, the counts alone: the marks wait.
		return r.store.GetCounters(ctx, r.name, keys, r.sizes.list(), now)
	}
	asked := r.near.takeAsked()
	counts, marks, version, err := r.feed.GetCountersNear(ctx, r.name, keys, r.sizes.list(), now, r.near.known(), asked)
	if err != nil {
		r.near.reask(asked)
		if failedWhole(err) {
			return nil, err
		}
	}
	r.near.add(marks, version, r.counters.Zone().Capacity(), now)
	if err == nil {
		r.near.made(asked, r.counters.Zone().Capacity(), now)
	}
	return counts, err
}

// pushPending pushes the hits to retry, a batch whose push failed, and
// what the zone gained since the last run, and reports whether it asked
// the store anything. In a periodic namespace, the keys touched join
// those the next fetch reads.
func (r *runner) pushPending(ctx context.Context) (contacted bool, err error) {
	var probed bool
	if r.health.down() {
		// The zone's diffs stay in the zone until the store answers (what
		// the outbox holds, or a ping), rather than be taken and put back
		// at every probe: on_store_failure share weighs them there.
		if probed, err = r.probe(ctx); err != nil {
			return probed, err
		}
	}
	r.outbox.lockTake()
	diffs, keys := r.counters.Take()
	fl := r.outbox.load(r.storable(diffs))
	if fl.batch != nil && r.feed != nil {
		fl.batch.Near = r.nearShare
	}
	if r.mode == Periodic {
		r.fetched.touch(keys, r.counters.Zone().Capacity())
	}
	contacted, err = r.deliver(ctx, fl)
	return contacted || probed, err
}

// deliver pushes fl (outbox.deliver), and gives back to the zone the
// diffs that wait there.
func (r *runner) deliver(ctx context.Context, fl flight) (contacted bool, err error) {
	restore, contacted, err := r.outbox.deliver(ctx, r.store, fl, r.health)
	if len(restore) > 0 {
		r.counters.Restore(restore)
	}
	return contacted, err
}

// probe asks a failing store what the outbox holds (hits to retry, a
// failed batch), or else whether it serves, and reports whether it asked
// it anything.
func (r *runner) probe(ctx context.Context) (asked bool, err error) {
	if r.outbox.empty() {
		return r.ping(ctx)
	}
	r.outbox.lockTake()
	return r.deliver(ctx, r.outbox.load(nil))
}

// nearShare returns the share of a diff's limit at which a periodic
// namespace with sync_above (or without, at 0) has its store mark the
// diff's key near: half of sync_above's fraction, or of the limit. A
// window's count at half the threshold marks the key at least until the
// next window ends (strategy.NearFeed), so that a sliding rate (the
// current count plus a share of the previous one) reaches the threshold
// only with some window's count at half of it, which marked the key.
func nearShare(syncAbove float64) float64 {
	if syncAbove > 0 {
		return syncAbove / 2
	}
	return 0.5
}

// ping asks the store whether it serves, when it can tell, and reports
// whether it asked. A store made of parts serves when any part does: the
// others are recorded as failed, their keys alone counting locally, so
// that a node that held the whole store down (a stalled hit queue, a run
// that failed as a whole) is not kept blind by one dead master until its
// replica is promoted.
func (r *runner) ping(ctx context.Context) (asked bool, err error) {
	if p := r.health.parted(); p != nil {
		all := make([]int, p.Parts())
		for i := range all {
			all[i] = i
		}
		err := p.PingParts(ctx, all)
		var pe *strategy.PartialError
		if errors.As(err, &pe) && len(pe.Parts) == len(all) {
			return true, pe.Err // no part answered: the whole store failed
		}
		return true, r.answered(all, err)
	}
	p, ok := r.store.(strategy.Pinger)
	if !ok {
		return false, nil
	}
	return true, p.Ping(ctx)
}

// syncBans syncs the bans with the store when it holds bans and a handler
// of this config bans, and reports whether it asked the store anything.
func (r *runner) syncBans(ctx context.Context) (asked bool, err error) {
	if r.banner == nil || !r.bansUsed.Load() || r.health.partDownFor("") {
		return false, nil // without the bans' part, the node's own bans hold
	}
	return true, r.bans.sync(ctx, r.banner)
}

// useBans has the runs read the store's bans (see bansUsed).
func (r *runner) useBans() { r.bansUsed.Store(true) }

// storable drops diffs of windows the store cannot keep, which only the
// Go API can create: AddWindowSizes refuses them in configs.
func (r *runner) storable(diffs []window.Diff) []window.Diff {
	kept := slices.DeleteFunc(diffs, func(d window.Diff) bool { return !r.sizes.storable(d.Size) })
	if dropped := len(diffs) - len(kept); dropped > 0 {
		r.logger.Warn("dropping diffs of windows the store cannot keep",
			zap.String("namespace", r.name), zap.Int("diffs", dropped))
	}
	return kept
}

// fetch is Namespace.Fetch: it sets the local counts of keys to the
// store's, once a run in progress has pushed its diffs.
func (r *runner) fetch(ctx context.Context, keys []string) error {
	if r.store == nil || len(keys) == 0 {
		return nil
	}
	if err := r.lock.lock(ctx, r.name); err != nil {
		return err
	}
	defer r.lock.unlock()
	return r.apply(r.store.GetCounters(ctx, r.name, keys, r.sizes.list(), time.Unix(0, r.counters.Now())))
}

// apply sets the local counts to the store's, unless the read failed as a
// whole: on a store made of parts, to those of the parts that answered.
func (r *runner) apply(counts []window.Count, err error) error {
	if !failedWhole(err) {
		r.counters.Apply(counts)
	}
	return err
}

// reset is Namespace.Reset: it erases key's counts and ban on this node
// and in the store, between two runs.
func (r *runner) reset(ctx context.Context, key string) error {
	if r.store == nil {
		r.bans.lift(key)
		r.counters.Reset(key)
		return nil
	}
	if err := r.lock.lock(ctx, r.name); err != nil {
		return fmt.Errorf("resetting a key of namespace %q: nothing was reset: %w", r.name, err)
	}
	defer r.lock.unlock()
	// Lifted under the run lock: a run that read the store's bans before
	// the lift must not put the ban back after it.
	r.bans.lift(key)
	held := r.counters.Reset(key)
	r.outbox.dropKey(key)
	sizes := r.sizes.with(held, true)
	if err := r.store.Reset(ctx, r.name, key, sizes, time.Unix(0, r.counters.Now())); err != nil {
		return fmt.Errorf("resetting a key of namespace %q: reset on this node, but in the %s store maybe not (reset again): %w",
			r.name, r.storeModule, err)
	}
	if r.banner != nil {
		if err := r.banner.SetBans(ctx, r.name, []strategy.Ban{{Key: key}}); err != nil {
			return fmt.Errorf("resetting a key of namespace %q: its counts were reset, but its ban in the %s store maybe not (reset again): %w",
				r.name, r.storeModule, err)
		}
	}
	return nil
}

// pendingDiffs returns how many diffs wait to be pushed: those in the
// zone, of a batch whose push failed, of hits to retry, and of a push in
// flight (a store that hangs holds them there).
func (r *runner) pendingDiffs() int { return r.counters.Pending() + r.outbox.diffs() }

// hasPending reports whether a run would have anything to push, or one
// is busy pushing: a flush then waits for it.
func (r *runner) hasPending() bool {
	if r.counters.Pending() > 0 || !r.outbox.empty() || !r.lock.tryLock() {
		return true
	}
	r.lock.unlock()
	return false
}

// track has the zone keep track of the namespace's changes while it syncs:
// when its config starts, and when it runs again after a failed reload.
func (r *runner) track() { r.counters.SetTracked(r.mode != Local) }

// backlog receives when keys with diffs leave the zone faster than the
// runs take them (window.Namespace.Backlog).
func (r *runner) backlog() <-chan struct{} { return r.counters.Backlog() }

// interval is the time between two runs of the namespace's loop: its
// sync_rate, or for a synchronous namespace the retry interval of hits that
// failed.
func (r *runner) interval() time.Duration {
	if r.mode == Periodic {
		return r.rate
	}
	return retryInterval
}

// timeout bounds one sync run of the loop: two sync intervals, within
// [minRunTimeout, maxRunTimeout], so a hung store cannot hold up the
// namespace's Sync and Fetch calls and stop flushes for long.
func (r *runner) timeout() time.Duration { return min(max(minRunTimeout, 2*r.rate), maxRunTimeout) }

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
func fetchBeat(interval time.Duration) time.Duration { return min(interval/5, 10*time.Millisecond) }

// runLock serializes a namespace's runs (the loop's, Sync and Fetch
// calls, the flushes at stop, resets): what a run took from the zone is
// never pushed by two runs at once, and a reset never falls between a
// push and what the push took. It is a channel so that waiting for it can
// give up at a deadline.
type runLock chan struct{}

func newRunLock() runLock { return make(runLock, 1) }

// lock waits for the run lock, or for ctx to end.
func (l runLock) lock(ctx context.Context, namespace string) error {
	select {
	case l <- struct{}{}:
		lockorder.Held[runLockClass]()
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for a sync run of namespace %q: %w", namespace, ctx.Err())
	}
}

// tryLock takes the run lock if no run holds it.
func (l runLock) tryLock() bool {
	select {
	case l <- struct{}{}:
		lockorder.Held[runLockClass]()
		return true
	default:
		return false
	}
}

func (l runLock) unlock() {
	lockorder.Released[runLockClass]()
	<-l
}
