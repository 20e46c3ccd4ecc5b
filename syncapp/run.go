package syncapp

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// A run is one sync of a namespace with its store: it pushes what the
// zone and the outbox hold, fetches the counts of the keys touched lately
// (periodic mode), and syncs the bans. The loop runs it on its timer;
// Sync, the flushes at stop and the admin API run it too. One run at a
// time: the callers hold the run lock.

// run takes the run lock and does a run; with fetch, a periodic namespace
// fetches at once.
func (n *Namespace) run(ctx context.Context, fetch bool) error {
	if n.store == nil {
		return nil
	}
	if err := n.runs.lock(ctx, n.name); err != nil {
		return err
	}
	defer n.runs.unlock()
	return n.runLocked(ctx, fetch, time.Time{})
}

// runLocked is run, with the run lock held; with fetch, the fetch waits
// until fetchAt, which the run's duration does not count.
func (n *Namespace) runLocked(ctx context.Context, fetch bool, fetchAt time.Time) error {
	start := time.Now()
	contacted, waited, err := n.pushAndFetch(ctx, fetch && n.mode == Periodic, fetchAt)
	if err == nil {
		var asked bool
		asked, err = n.syncBans(ctx)
		contacted = contacted || asked
	}
	if err == nil && !contacted && n.health.down() {
		// Requests skip the store until a run finds it back; this one
		// had nothing else to ask it.
		contacted, err = n.ping(ctx)
	}
	if err == nil && n.slots.hasLocal() {
		// Requests admitted while the store could not be asked take
		// their slots in it before the node counts as syncing again.
		contacted, err = true, n.slots.adopt(ctx)
	}
	metrics.syncDuration.WithLabelValues(n.name).Observe((time.Since(start) - waited).Seconds())
	switch {
	case err != nil:
		n.health.failedRun(err, n.rate)
	case contacted: // a run with nothing to do says nothing of the store
		n.health.succeeded()
	}
	return err
}

// pushAndFetch does one run's work on counts, and reports whether it
// asked the store anything and how long it waited for fetchAt.
func (n *Namespace) pushAndFetch(ctx context.Context, fetch bool, fetchAt time.Time) (contacted bool, waited time.Duration, err error) {
	contacted, err = n.pushPending(ctx)
	if err != nil || !fetch {
		return contacted, 0, err
	}
	keys := n.fetched.due(fetchRuns(n.runInterval()))
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
	counts, err := n.store.GetCounters(ctx, n.name, keys, n.WindowSizes(), time.Now())
	if err != nil {
		return true, waited, err
	}
	n.counters.Apply(counts)
	n.fetched.fetched()
	return true, waited, nil
}

// pushPending pushes the hits to retry, a batch whose push failed, and
// what the zone gained since the last run, and reports whether it asked
// the store anything. In a periodic namespace, the keys touched join
// those the next fetch reads.
func (n *Namespace) pushPending(ctx context.Context) (contacted bool, err error) {
	n.outbox.lockTake()
	diffs, keys := n.counters.Take()
	fl := n.outbox.load(n.storable(diffs), n.hitter != nil)
	if n.mode == Periodic {
		n.fetched.touch(keys, n.counters.Zone().Capacity())
	}
	restore, contacted, err := n.outbox.deliver(ctx, n.store, fl)
	if len(restore) > 0 {
		n.counters.Restore(restore)
	}
	return contacted, err
}

// ping asks the store whether it serves, when it can tell, and reports
// whether it asked.
func (n *Namespace) ping(ctx context.Context) (asked bool, err error) {
	p, ok := n.store.(strategy.Pinger)
	if !ok {
		return false, nil
	}
	return true, p.Ping(ctx)
}

// syncBans syncs the bans with the store when it holds bans and a handler
// of this config bans, and reports whether it asked the store anything.
func (n *Namespace) syncBans(ctx context.Context) (asked bool, err error) {
	if n.banner == nil || !n.bansUsed.Load() {
		return false, nil
	}
	return true, n.bans.sync(ctx, n.banner)
}

// storable drops diffs of windows the store cannot keep, which only the
// Go API can create: AddWindowSizes refuses them in configs.
func (n *Namespace) storable(diffs []window.Diff) []window.Diff {
	kept := diffs[:0]
	for _, d := range diffs {
		if n.validWindow == nil || n.validWindow(d.Size) == nil {
			kept = append(kept, d)
		}
	}
	if dropped := len(diffs) - len(kept); dropped > 0 {
		n.logger.Warn("dropping diffs of windows the store cannot keep",
			zap.String("namespace", n.name), zap.Int("diffs", dropped))
	}
	return kept
}

// pendingDiffs returns how many diffs wait to be pushed: those in the
// zone, of a batch whose push failed, of hits to retry, and of a push in
// flight (a store that hangs holds them there).
func (n *Namespace) pendingDiffs() int {
	return n.counters.Pending() + n.outbox.diffs()
}

// hasPending reports whether a run would have anything to push, or one
// is busy pushing: a flush then waits for it.
func (n *Namespace) hasPending() bool {
	if n.counters.Pending() > 0 || !n.outbox.empty() || !n.runs.tryLock() {
		return true
	}
	n.runs.unlock()
	return false
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

// backlog receives when keys with diffs leave the zone faster than the
// runs take them (window.Namespace.Backlog).
func (n *Namespace) backlog() <-chan struct{} { return n.counters.Backlog() }

// runInterval is the time between two runs of the namespace's loop: its
// sync_rate, or for a synchronous namespace the retry interval of hits that
// failed.
func (n *Namespace) runInterval() time.Duration {
	if n.mode == Periodic {
		return n.rate
	}
	return retryInterval
}

// runTimeout bounds one sync run of the loop: two sync intervals, within
// [minRunTimeout, maxRunTimeout], so a hung store cannot hold up the
// namespace's Sync and Fetch calls and stop flushes for long.
func (n *Namespace) runTimeout() time.Duration {
	return min(max(minRunTimeout, 2*n.rate), maxRunTimeout)
}
