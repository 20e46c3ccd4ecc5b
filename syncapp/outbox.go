package syncapp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// outbox holds what a namespace took from its zone for the store and the
// store may not have yet: the batch whose push failed (pushed again as
// is), the synchronous hits that failed after they may have been applied
// (pushed again under their own IDs), and the sum of all that is on its
// way per counter, which synchronous answers add to the store's counts.
// It is part of the namespace's fleetState, so it outlives reloads.
//
// A run takes the zone's diffs between lockTake and load, and pushes them
// with deliver; the namespace's run lock keeps runs from overlapping.
type outbox struct {
	name   string
	logger *zap.Logger

	// taking is held by a run from taking the zone's diffs until inflight
	// has them, and shared by the reads of inflight (view): a diff is
	// then always in the zone, in inflight, or in the store.
	taking   sync.RWMutex
	inflight inflight

	retries retryQueue
	// flying counts the diffs and turns that a run took out of the zone
	// and the retry queue and is pushing: pending until the store has
	// them, or back in the outbox.
	flying atomic.Int64

	mu     sync.Mutex
	failed *strategy.Batch // a batch whose push failed, retried as is
}

func newOutbox(name string, logger *zap.Logger) *outbox {
	return &outbox{name: name, logger: logger}
}

// flight is what one run pushes, in this order: the hits to retry, the
// batch whose push failed, the new batch.
type flight struct {
	retries []strategy.Batch
	failed  *strategy.Batch
	batch   *strategy.Batch
	tracked bool
}

// lockTake starts a run's take of the zone's diffs: views wait until load
// records them as on their way.
func (o *outbox) lockTake() { o.taking.Lock() }

// load ends the take that lockTake started with the diffs taken, and
// returns what the run pushes. With track (the namespace answers hits
// from the store) inflight records all of it.
func (o *outbox) load(diffs []window.Diff, track bool) flight {
	defer o.taking.Unlock()
	fl := flight{retries: o.retries.take()}
	o.flying.Store(int64(len(diffs) + diffsIn(fl.retries)))
	if len(diffs) > 0 {
		fl.batch = &strategy.Batch{ID: newBatchID(), Namespace: o.name, Diffs: diffs}
	}
	o.mu.Lock()
	fl.failed = o.failed
	o.mu.Unlock()
	if track || len(fl.retries) > 0 {
		fl.tracked = true
		o.inflight.set(fl.retries, fl.failed, fl.batch)
	}
	return fl
}

// deliver pushes a flight to store, and reports whether it asked the
// store anything. On a failure what was not pushed waits for the next
// run: hits to retry stay queued, and a new batch becomes the failed one,
// unless one already waits or the push surely never reached the store;
// then restore returns the new batch's diffs, for the zone to take back:
// at most one batch waits. The caller holds the run lock.
func (o *outbox) deliver(ctx context.Context, store strategy.Store, fl flight) (restore []window.Diff, contacted bool, err error) {
	defer o.flying.Store(0) // pushed, or back in the retry queue, the failed batch or the zone
	if fl.tracked {
		defer func() {
			o.mu.Lock()
			failed := o.failed
			o.mu.Unlock()
			o.inflight.set(o.retries.queued(), failed)
		}()
	}
	var newDiffs []window.Diff
	if fl.batch != nil {
		newDiffs = fl.batch.Diffs
	}
	for i, r := range fl.retries {
		if err := o.push(ctx, store, r); err != nil {
			o.retries.putBack(fl.retries[i:])
			return newDiffs, true, fmt.Errorf("retrying failed hits: %w", err)
		}
		contacted = true
	}
	if fl.failed != nil {
		if err := o.push(ctx, store, *fl.failed); err != nil {
			return newDiffs, true, fmt.Errorf("retrying a failed push: %w", err)
		}
		o.setFailed(nil)
		contacted = true
	}
	if fl.batch != nil {
		if err := o.push(ctx, store, *fl.batch); err != nil {
			if errors.Is(err, strategy.ErrNotSent) {
				// Surely not applied: back to the zone, as new diffs.
				return fl.batch.Diffs, true, err
			}
			o.setFailed(fl.batch)
			return nil, true, err
		}
		contacted = true
	}
	return nil, contacted, nil
}

func (o *outbox) setFailed(b *strategy.Batch) {
	o.mu.Lock()
	o.failed = b
	o.mu.Unlock()
}

// push pushes a batch. A batch the store rejects for its content would
// fail on every retry, so it is logged and dropped.
func (o *outbox) push(ctx context.Context, store strategy.Store, batch strategy.Batch) error {
	err := store.PushDiffs(ctx, batch)
	if errors.Is(err, strategy.ErrRejected) {
		metrics.syncErrors.WithLabelValues(o.name).Inc()
		o.logger.Error("the store rejected a batch of diffs; dropping it",
			zap.String("namespace", o.name), zap.Int("diffs", len(batch.Diffs)), zap.Error(err))
		return nil
	}
	return err
}

// retry queues a synchronous hit that failed after it may have been
// applied, for the next run to push under the hit's own ID.
func (o *outbox) retry(b strategy.Batch) { o.retries.add(b) }

// dropKey takes key's diffs out of the failed batch and out of the hits
// queued for a retry, so that they are not pushed after a reset. A batch
// keeps its ID: a store that applied it skips it whole, one that did not
// applies the rest. With track, inflight no longer counts them either.
// The caller holds the run lock.
func (o *outbox) dropKey(key string, track bool) {
	o.mu.Lock()
	if o.failed != nil {
		if diffs := withoutKey(o.failed.Diffs, key); len(diffs) == 0 {
			o.failed = nil
		} else {
			b := *o.failed
			b.Diffs = diffs
			o.failed = &b
		}
	}
	failed := o.failed
	o.mu.Unlock()
	o.retries.dropKey(key)
	if track {
		o.inflight.set(o.retries.queued(), failed)
	}
}

// withoutKey returns diffs without those of key, in a new slice when it
// drops any: a batch's diffs may be shared with a push that failed.
func withoutKey(diffs []window.Diff, key string) []window.Diff {
	if !slices.ContainsFunc(diffs, func(d window.Diff) bool { return d.Key == key }) {
		return diffs
	}
	var kept []window.Diff
	for _, d := range diffs {
		if d.Key != key {
			kept = append(kept, d)
		}
	}
	return kept
}

// diffs returns how many diffs (and rates' turns) wait in the outbox: of
// the failed batch, of hits to retry, and of a push in flight.
func (o *outbox) diffs() int {
	o.mu.Lock()
	n := 0
	if o.failed != nil {
		n = len(o.failed.Diffs)
	}
	o.mu.Unlock()
	return n + o.retries.diffs() + int(o.flying.Load())
}

// empty reports whether nothing waits in the outbox.
func (o *outbox) empty() bool {
	o.mu.Lock()
	failed := o.failed
	o.mu.Unlock()
	return failed == nil && o.retries.len() == 0
}

// view starts a read of the diffs on their way to the store. Until close,
// no run takes the zone's diffs, so a diff that left the zone before the
// view is in it.
func (o *outbox) view() unstoredView {
	o.taking.RLock()
	return unstoredView{taking: &o.taking, m: o.inflight.load()}
}

// unstoredView is a read of the diffs on their way to the store.
type unstoredView struct {
	taking *sync.RWMutex
	m      map[counterID]float64
}

// of returns the diffs of one counter on their way to the store.
func (v unstoredView) of(key string, size time.Duration, start int64) float64 {
	return v.m[counterID{key, size, start}]
}

// close ends the view.
func (v unstoredView) close() { v.taking.RUnlock() }

func newBatchID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
