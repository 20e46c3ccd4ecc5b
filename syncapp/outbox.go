package syncapp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// outbox holds what a namespace took from its zone for the store and the
// store may not have yet: the batches whose push failed (pushed again
// under their IDs: one, or on a store made of parts one per failure of
// some of them, holding those parts' diffs), the synchronous hits that
// failed after they may have been applied (pushed again under their own
// IDs), and the sum of all that is on its
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
	taking   lockorder.RWMutex[takingLock]
	inflight inflight

	// flying counts the diffs and turns that a run took out of the zone
	// and the retry queue and is pushing: pending until the store has
	// them, or back in the outbox.
	flying atomic.Int64

	mu      lockorder.Mutex[outboxLock]
	failed  []strategy.Batch // batches whose push failed, retried under their IDs
	retries []strategy.Batch // synchronous hits to push again under their own IDs
}

// maxRetries bounds the synchronous hits kept for a retry; past it the
// oldest are dropped (they still count locally).
const maxRetries = 10_000

func newOutbox(name string, logger *zap.Logger) *outbox {
	return &outbox{name: name, logger: logger}
}

// flight is what one run pushes, in this order: the hits to retry, the
// batches whose push failed, the new batch.
type flight struct {
	retries []strategy.Batch
	failed  []strategy.Batch
	batch   *strategy.Batch
}

// lockTake starts a run's take of the zone's diffs: views wait until load
// records them as on their way.
func (o *outbox) lockTake() { o.taking.Lock() }

// load ends the take that lockTake started with the diffs taken, and
// returns what the run pushes, which inflight records: the store's
// answers to this node's reads lack it until it lands.
func (o *outbox) load(diffs []window.Diff) flight {
	defer o.taking.Unlock()
	var fl flight
	o.mu.Lock()
	fl.retries, o.retries = o.retries, nil
	fl.failed = o.failed
	o.mu.Unlock()
	o.flying.Store(int64(len(diffs) + diffsIn(fl.retries)))
	if len(diffs) > 0 {
		fl.batch = &strategy.Batch{ID: newBatchID(), Namespace: o.name, Diffs: diffs}
	}
	onWay := slices.Concat(fl.retries, fl.failed)
	if fl.batch != nil {
		onWay = append(onWay, *fl.batch)
	}
	o.inflight.set(onWay)
	return fl
}

// deliver pushes a flight to store, and reports whether it asked the
// store anything. On a failure what was not pushed waits for the next
// run: hits to retry stay queued, and a new batch becomes a failed one,
// unless a failed one could not be pushed or the push surely never
// reached the store; then restore returns the new batch's diffs, for the
// zone to take back. The caller holds the run lock.
//
// On a store made of parts (see storeHealth), nothing is sent to the parts
// that are down: their diffs wait, under their batches' IDs, or in the
// zone for the new batch's, until a ping finds them back (runner.ping).
// A push that failed for some parts keeps, under its ID, only those
// parts' diffs, and the run goes on: the new batch's diffs of a part
// that failed in this run go back to the zone unsent, the others are
// pushed. err is then a strategy.PartialError of every part that failed.
func (o *outbox) deliver(ctx context.Context, store strategy.Store, fl flight, h *health) (restore []window.Diff, contacted bool, err error) {
	defer o.flying.Store(0) // pushed, or back in the retry queue, the failed batches or the zone
	defer func() { o.inflight.set(o.pending()) }()
	var newDiffs []window.Diff
	if fl.batch != nil {
		newDiffs = fl.batch.Diffs
	}
	parts := partsPush{h: h}
	// pushAll pushes batches until one fails, and returns what stays: of
	// each batch pushed, what was held back or failed in some parts; then
	// the batch that failed and those after it.
	pushAll := func(batches []strategy.Batch) (kept []strategy.Batch, err error) {
		for i, b := range batches {
			rest, sent, err := parts.push(ctx, o, store, b)
			if err != nil {
				return append(kept, batches[i:]...), err
			}
			if rest != nil {
				kept = append(kept, *rest)
			}
			contacted = contacted || sent
		}
		return kept, nil
	}
	kept, err := pushAll(fl.retries)
	o.putBack(kept)
	if err != nil {
		return newDiffs, true, fmt.Errorf("retrying failed hits: %w", err)
	}
	if kept, err = pushAll(fl.failed); err != nil {
		o.setFailed(kept)
		return newDiffs, true, fmt.Errorf("retrying a failed push: %w", err)
	}
	if fl.batch != nil {
		// The new batch's diffs of the parts down, or that failed in
		// this run, wait in the zone: nothing of them was sent.
		held, batch := splitBatch(*fl.batch, parts.held)
		restore = held.Diffs
		rest, sent, err := parts.push(ctx, o, store, batch)
		switch {
		case err == nil:
			if rest != nil && parts.unsent {
				// Surely not applied: back to the zone, as new diffs.
				restore = append(restore, rest.Diffs...)
			} else if rest != nil {
				kept = append(kept, *rest)
			}
			contacted = contacted || sent
		case errors.Is(err, strategy.ErrNotSent):
			o.setFailed(kept)
			return append(restore, batch.Diffs...), true, err
		default:
			o.setFailed(append(kept, batch))
			return restore, true, err
		}
	}
	o.setFailed(kept)
	return restore, contacted, parts.err()
}

// partsPush pushes the batches of one delivery to a store made of parts
// (see outbox.deliver): it holds back the diffs of the parts down, keeps
// what failed in some parts only, and learns which parts failed.
type partsPush struct {
	h      *health
	failed map[int]bool
	first  error // the first partial failure
	// unsent is set when the last push's failure surely sent nothing to
	// the parts that failed (strategy.ErrNotSent).
	unsent bool
}

// held reports whether key's diffs are held back: its part is down, or
// failed in this delivery.
func (p *partsPush) held(key string) bool {
	if len(p.failed) == 0 && p.h.partsDown() == 0 {
		return false
	}
	return p.failed[p.h.partOf(key)] || p.h.partDownFor(key)
}

// push pushes what of b is not held back, and returns, under b's ID, the
// batch of what is and of what failed in some parts only, whether it
// sent anything, and a nil error. Any other failure is returned as is.
func (p *partsPush) push(ctx context.Context, o *outbox, store strategy.Store, b strategy.Batch) (rest *strategy.Batch, sent bool, err error) {
	p.unsent = false
	held, b := splitBatch(b, p.held)
	if len(b.Diffs)+len(b.Rates) == 0 {
		return heldBatch(held), false, nil
	}
	err = o.push(ctx, store, b)
	failed, partial := strategy.FailedParts(err)
	if err == nil || !partial || p.h.parted() == nil {
		return heldBatch(held), true, err
	}
	if p.failed == nil {
		p.failed = make(map[int]bool)
	}
	for _, part := range failed {
		p.failed[part] = true
	}
	if p.first == nil {
		p.first = err
	}
	in, _ := splitBatch(b, func(key string) bool { return slices.Contains(failed, p.h.partOf(key)) })
	p.unsent = errors.Is(err, strategy.ErrNotSent)
	held.Diffs, held.Rates = append(held.Diffs, in.Diffs...), append(held.Rates, in.Rates...)
	return heldBatch(held), true, nil
}

// heldBatch returns b, or nil when it holds nothing to push (marks, which
// a push makes again, are not kept).
func heldBatch(b strategy.Batch) *strategy.Batch {
	if len(b.Diffs)+len(b.Rates) == 0 {
		return nil
	}
	return &b
}

// err returns the partial failure of the parts that failed, or nil.
func (p *partsPush) err() error {
	if len(p.failed) == 0 {
		return nil
	}
	return strategy.Partial(p.first, slices.Collect(maps.Keys(p.failed))...)
}

// splitBatch returns b's diffs and rates whose keys are in, and the
// others, each as a batch of b's ID.
func splitBatch(b strategy.Batch, in func(key string) bool) (inside, outside strategy.Batch) {
	inside, outside = b, b
	inside.Diffs, outside.Diffs = split(b.Diffs, func(d window.Diff) bool { return in(d.Key) })
	inside.Rates, outside.Rates = split(b.Rates, func(r strategy.RateDiff) bool { return in(r.Key) })
	return inside, outside
}

// split returns the elements of xs that are in, and the others, each nil
// when there are none.
func split[T any](xs []T, in func(T) bool) (inside, outside []T) {
	for _, x := range xs {
		if in(x) {
			inside = append(inside, x)
		} else {
			outside = append(outside, x)
		}
	}
	return inside, outside
}

func (o *outbox) setFailed(b []strategy.Batch) {
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
// applied, for the next run to push under the hit's own ID; past
// maxRetries the oldest are dropped.
func (o *outbox) retry(b strategy.Batch) {
	if len(b.Diffs)+len(b.Rates) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.retries) >= maxRetries {
		o.retries = o.retries[1:]
	}
	o.retries = append(o.retries, b)
}

// putBack queues hits to retry whose push failed, ahead of those queued
// since.
func (o *outbox) putBack(r []strategy.Batch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.retries = append(r[:len(r):len(r)], o.retries...)
	if n := len(o.retries); n > maxRetries {
		o.retries = o.retries[n-maxRetries:]
	}
}

// pending returns the hits to retry and the failed batches.
func (o *outbox) pending() []strategy.Batch {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Concat(o.retries, o.failed)
}

// dropKey takes key's diffs and rates out of the failed batches and out
// of the hits queued for a retry, so that they are not pushed after a
// reset. A batch keeps its ID: a store that applied it skips it whole,
// one that did not applies the rest. Nor does inflight count them any
// more. The caller holds the run lock.
func (o *outbox) dropKey(key string) {
	drop := func(batches []strategy.Batch) []strategy.Batch {
		var kept []strategy.Batch
		for _, b := range batches {
			// New slices: a batch's may be shared with a push that failed.
			b.Diffs = slices.DeleteFunc(slices.Clone(b.Diffs), func(d window.Diff) bool { return d.Key == key })
			b.Rates = slices.DeleteFunc(slices.Clone(b.Rates), func(r strategy.RateDiff) bool { return r.Key == key })
			if len(b.Diffs)+len(b.Rates) > 0 {
				kept = append(kept, b)
			}
		}
		return kept
	}
	o.mu.Lock()
	o.failed, o.retries = drop(o.failed), drop(o.retries)
	o.mu.Unlock()
	o.inflight.set(o.pending())
}

// diffs returns how many diffs (and rates' turns) wait in the outbox: of
// the failed batches, of hits to retry, and of a push in flight.
func (o *outbox) diffs() int { return diffsIn(o.pending()) + int(o.flying.Load()) }

// empty reports whether nothing waits in the outbox.
func (o *outbox) empty() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.failed)+len(o.retries) == 0
}

// diffsIn returns how many diffs batches hold, a rate's turn counting as
// one.
func diffsIn(batches []strategy.Batch) int {
	n := 0
	for _, b := range batches {
		n += len(b.Diffs) + len(b.Rates)
	}
	return n
}

// view starts a read of the diffs on their way to the store. Until close,
// no run takes the zone's diffs, so a diff that left the zone before the
// view is in it.
func (o *outbox) view() unstoredView {
	o.taking.RLock()
	m, epoch := o.inflight.load()
	return unstoredView{taking: &o.taking, m: m, epoch: epoch}
}

// epoch returns the epoch of the diffs on their way (see inflight): a
// reader of the store takes it before it sends its read.
func (o *outbox) epoch() uint64 { return o.inflight.epoch() }

// unstoredView is a read of the diffs on their way to the store.
type unstoredView struct {
	taking *lockorder.RWMutex[takingLock]
	m      map[counterID]float64
	epoch  uint64
}

// landedSince reports whether diffs left the outbox since epoch (see
// inflight): a read of the store sent at epoch may lack them.
func (v unstoredView) landedSince(epoch uint64) bool { return v.epoch != epoch }

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
