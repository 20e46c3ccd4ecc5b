package syncapp

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

const (
	// batchTrips is how many round trips of synchronous hits a namespace
	// whose store takes batches has in flight at once: one. The hits
	// that arrive while it is out wait, and go together in the next,
	// which costs the store less per hit than two smaller round trips
	// would; a hit waits for at most one round trip ahead of it. The
	// next round trip's sender is not made to run sooner: that made round
	// trips smaller and costlier, and served no more (docs/performance.md
	// has the figures).
	batchTrips = 1
	// singleTrips is the same for a store that takes one hit at a time:
	// two, so that a hit goes while another one's round trip is out.
	singleTrips = 2
	// maxBatchHits bounds the hits of one round trip.
	maxBatchHits = 256
	// stallAfter is how long hits may wait for a round trip while the
	// store answers none: past it the store is held stalled, the hits
	// waiting count locally, and requests skip the store until it
	// answers again. Only the hits of the round trips in flight wait out
	// their timeout.
	stallAfter = 250 * time.Millisecond
)

// errStalled is the error of a hit that left the queue unsent because the
// store stalled.
var errStalled = fmt.Errorf("%w: the store answers nothing while hits wait", strategy.ErrNotSent)

// hitQueue sends a namespace's synchronous hits to its store, coalescing
// them: a hit goes at once while fewer than maxTrips round trips are in
// flight; otherwise it waits, to go with the hits that waited with it in
// one HitBatch when a round trip ends. No timer delays a hit: an idle node
// sends each hit alone, and a busy one sends bigger batches, which cost
// the store less per hit; a hit waits for at most one round trip ahead of
// it.
//
// The goroutine whose round trip ends takes the next batch off the queue
// and hands it to the batch's first hit, whose goroutine, once it runs,
// adds the hits that queued meanwhile, sends it and hands the results out;
// a hit that finds room sends its own, with the hits that queue while it
// yields once to the goroutines that are ready. So a round trip is always
// run by a request that waits for it.
//
// The queue is the namespace's fleet state's, so that while an old and a
// new config overlap in a reload their hits share it; each hit goes to
// its own config's store, and a round trip carries the hits of one.
type hitQueue struct {
	namespace string
	health    *health
	sizes     prometheus.Observer

	// answered is when a round trip last came back (Unix nanoseconds).
	answered atomic.Int64

	mu     lockorder.Mutex[hitQueueLock]
	queued []*queuedHit
	trips  int // round trips in flight; > 0 whenever hits are queued
	// stall is closed, and replaced, when the store stalls: the hits
	// waiting then leave the queue.
	stall    chan struct{}
	watching bool // a stall check is armed
}

// queuedHit is one hit on its way: its request, and once its round trip
// ended, its result and the retry that carries it if the round trip
// failed after it may have been applied.
type queuedHit struct {
	store *tripStore
	req   strategy.HitRequest
	res   strategy.HitResult
	retry retrySlot
	state atomic.Int32 // hitWaiting, hitTaken or hitLeft
	// done receives one value when the hit's result is in, or when lead
	// is set: only a taken hit gets one, and only once, so that the
	// channel serves the hit's next use too (see queuedHits).
	done chan struct{}
	// lead, when set, is the batch this hit's goroutine must send.
	lead []*queuedHit
}

// tripBuffers are the requests and results of a round trip, which
// tripBufs recycles: a busy node sends thousands of round trips a second,
// of a few kilobytes each.
type tripBuffers struct {
	reqs    []strategy.HitRequest
	results []strategy.HitResult
}

var tripBufs = sync.Pool{New: func() any { return new(tripBuffers) }}

// queuedHits recycles queued hits, with their channels: a busy node queues
// thousands of hits a second. A hit goes back once its goroutine has its
// result, which nothing else then reads; one that left the queue unsent
// may still be in it, and is left to the garbage collector.
var queuedHits = sync.Pool{New: func() any { return &queuedHit{done: make(chan struct{}, 1)} }}

// newQueuedHit returns a waiting hit of req.
func newQueuedHit(store *tripStore, req strategy.HitRequest) *queuedHit {
	h := queuedHits.Get().(*queuedHit)
	h.store, h.req = store, req
	h.state.Store(hitWaiting)
	return h
}

// free gives h back to queuedHits, once its goroutine has its result.
func (h *queuedHit) free() {
	h.store, h.req, h.res, h.retry, h.lead = nil, strategy.HitRequest{}, strategy.HitResult{}, retrySlot{}, nil
	queuedHits.Put(h)
}

// result returns h's result and retry, and frees h.
func (h *queuedHit) result() (strategy.HitResult, retrySlot) {
	res, retry := h.res, h.retry
	h.free()
	return res, retry
}

// States of a queued hit: a batch takes a waiting hit, or the hit leaves
// the queue (the store stalled, or its request ended); whichever comes
// first.
const (
	hitWaiting int32 = iota
	hitTaken
	hitLeft
)

func newHitQueue(namespace string, h *health) *hitQueue {
	return &hitQueue{
		namespace: namespace,
		health:    h,
		stall:     make(chan struct{}),
		sizes:     metrics.hitBatch.WithLabelValues(namespace),
	}
}

// tripStore is the store a config's synchronous hits go to, with how many
// hits a round trip carries and how many round trips may be out at once.
type tripStore struct {
	strategy.BatchHitter
	maxBatch int // maxBatchHits, or 1 for a store without HitBatch
	maxTrips int // batchTrips, or singleTrips for a store without HitBatch
}

func newTripStore(s strategy.Hitter) *tripStore {
	if b, ok := s.(strategy.BatchHitter); ok {
		return &tripStore{b, maxBatchHits, batchTrips}
	}
	return &tripStore{oneHitAtATime{s}, 1, singleTrips}
}

// do sends one hit and returns its result, and for a hit whose round trip
// failed after it may have been applied, the retry that must carry the
// increments it is counted with locally (see batchRetry). ctx bounds the
// wait in the queue; a round trip, once it carries the hit, runs for up to
// hitTimeout whatever ctx does, so that every hit of it learns its result.
func (q *hitQueue) do(ctx context.Context, store *tripStore, req strategy.HitRequest) (strategy.HitResult, retrySlot) {
	q.mu.Lock()
	if q.trips < store.maxTrips { // nothing waits while there is room
		q.trips++
		q.mu.Unlock()
		h := newQueuedHit(store, req)
		batch := []*queuedHit{h}
		if store.maxBatch > 1 {
			// Let the goroutines that are ready run first, and take the
			// hits they queue meanwhile: on a busy node, those of the
			// requests that the last round trip answered, which would
			// otherwise wait for this one to end. An idle node has none
			// ready, and goes at once.
			runtime.Gosched()
			q.mu.Lock()
			batch = q.take(batch)
			q.mu.Unlock()
		}
		q.send(ctx, h, batch)
		return h.result()
	}
	h := newQueuedHit(store, req)
	q.queued = append(q.queued, h)
	stall := q.stall
	if !q.watching {
		q.watching = true
		q.watchFrom(time.Now())
	}
	q.mu.Unlock()
	select {
	case <-h.done:
	case <-stall:
		if h.state.CompareAndSwap(hitWaiting, hitLeft) {
			return strategy.HitResult{Err: errStalled}, retrySlot{} // h may still be queued: not freed
		}
		<-h.done
	case <-ctx.Done():
		if h.state.CompareAndSwap(hitWaiting, hitLeft) {
			return strategy.HitResult{Err: fmt.Errorf("%w: %w", strategy.ErrNotSent, ctx.Err())}, retrySlot{}
		}
		<-h.done
	}
	if batch := h.lead; batch != nil {
		// The hits that queued since the batch was taken go too: on a
		// busy node, this goroutine runs some time after it is handed
		// the batch, and they would wait for the next round trip.
		q.mu.Lock()
		batch = q.take(batch)
		q.mu.Unlock()
		q.send(ctx, h, batch)
	}
	return h.result()
}

// send runs one round trip for batch, which holds own, the caller's hit,
// hands the results out, and passes the round trip on to the next batch.
func (q *hitQueue) send(ctx context.Context, own *queuedHit, batch []*queuedHit) {
	buf := tripBufs.Get().(*tripBuffers)
	reqs := slices.Grow(buf.reqs[:0], len(batch))[:len(batch)]
	results := slices.Grow(buf.results[:0], len(batch))[:len(batch)]
	for i, h := range batch {
		reqs[i], results[i] = h.req, strategy.HitResult{}
	}
	id := newBatchID()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hitTimeout)
	own.store.HitBatch(ctx, q.namespace, id, reqs, results)
	cancel()
	q.answered.Store(time.Now().UnixNano())
	q.sizes.Observe(float64(len(batch)))

	var retry *batchRetry
	for i, h := range batch {
		h.res = results[i]
		if err := h.res.Err; err != nil && !errors.Is(err, strategy.ErrNotSent) && !errors.Is(err, strategy.ErrRejected) {
			if retry == nil {
				retry = &batchRetry{id: id, namespace: q.namespace}
			}
			h.retry = retrySlot{retry, len(retry.hits)}
			retry.hits = append(retry.hits, retryHit{})
		}
	}
	if retry != nil {
		retry.pending.Store(int32(len(retry.hits)))
	}
	clear(reqs) // let go of what they point to
	clear(results)
	buf.reqs, buf.results = reqs, results
	tripBufs.Put(buf)
	for _, h := range batch {
		if h != own {
			h.done <- struct{}{} // the last use of h here: its goroutine may free it
		}
	}
	q.next()
}

// take appends the hits waiting to batch, up to a batch, and takes them
// off the queue: those of the store of the batch's first hit. The caller
// holds q.mu.
func (q *hitQueue) take(batch []*queuedHit) []*queuedHit {
	var store *tripStore
	if len(batch) > 0 {
		store = batch[0].store
	}
	kept := q.queued[:0]
	for i, h := range q.queued {
		if store != nil && len(batch) >= store.maxBatch {
			kept = append(kept, q.queued[i:]...) // a full batch: the rest wait
			break
		}
		if store != nil && h.store != store {
			kept = append(kept, h) // another config's: it goes with a later take
			continue
		}
		if h.state.CompareAndSwap(hitWaiting, hitTaken) {
			batch = append(batch, h)
			store = h.store
		}
	}
	clear(q.queued[len(kept):])
	q.queued = kept
	return batch
}

// next hands the hits waiting, up to a batch, to the first of them to
// send; with none waiting, the round trip ends.
func (q *hitQueue) next() {
	q.mu.Lock()
	batch := q.take(nil)
	if len(batch) == 0 {
		q.trips--
		q.mu.Unlock()
		return
	}
	q.mu.Unlock()
	batch[0].lead = batch
	batch[0].done <- struct{}{}
}

// watchFrom arms a check, stallAfter from since, of whether the store
// answered since then. The caller holds q.mu.
func (q *hitQueue) watchFrom(since time.Time) {
	time.AfterFunc(stallAfter-time.Since(since), func() { q.checkStall(since.UnixNano()) })
}

// checkStall runs stallAfter after hits started waiting, or after the
// last check: if round trips came back since, it looks again later;
// otherwise the store is stalled, and the hits waiting leave the queue.
func (q *hitQueue) checkStall(since int64) {
	q.mu.Lock()
	if len(q.queued) == 0 {
		q.watching = false
		q.mu.Unlock()
		return
	}
	if answered := q.answered.Load(); answered > since {
		q.watchFrom(time.Unix(0, answered))
		q.mu.Unlock()
		return
	}
	q.watching = false
	stall := q.stall
	q.stall = make(chan struct{}) // the hits queued from now wait for the next check
	q.mu.Unlock()
	q.health.stalled() // first, so that the hits that leave find the store down
	close(stall)
}

// batchRetry gathers the increments of the hits of one round trip that
// failed after it may have been applied: each hit, counted locally, adds
// the increments it made in its own slot, and the last one queues them in
// the outbox as one batch under the round trip's ID, which the store
// skips if it applied the round trip. One batch, because the store
// records the ID once per part of its data, not once per hit.
type batchRetry struct {
	id, namespace string
	hits          []retryHit   // one per hit in doubt, set up before they leave
	pending       atomic.Int32 // hits still to add theirs
}

// retryHit is what one hit of a batchRetry added: its increments and its
// rate's turn, if it took one.
type retryHit struct {
	diffs []window.Diff
	rate  *strategy.RateDiff
}

// retrySlot is a hit's place in the retry of its round trip, when r is
// not nil.
type retrySlot struct {
	r *batchRetry
	i int
}

// add adds a hit's increments and its rate's turn, if it took one, and
// returns the batch to retry once every hit of the round trip added its
// own, or false.
func (s retrySlot) add(diffs []window.Diff, rate *strategy.RateDiff) (strategy.Batch, bool) {
	return s.r.add(s.i, retryHit{diffs, rate})
}

// add sets the hit of slot i, and returns the batch once it is the last.
func (r *batchRetry) add(i int, h retryHit) (strategy.Batch, bool) {
	r.hits[i] = h
	if r.pending.Add(-1) != 0 {
		return strategy.Batch{}, false
	}
	b := strategy.Batch{ID: r.id, Namespace: r.namespace}
	for _, h := range r.hits {
		b.Diffs = append(b.Diffs, h.diffs...)
		if h.rate != nil {
			b.Rates = append(b.Rates, *h.rate)
		}
	}
	return b, true
}

// oneHitAtATime is a store without HitBatch, sent batches of one hit:
// each is one Hit under the batch's ID.
type oneHitAtATime struct{ strategy.Hitter }

func (s oneHitAtATime) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	for i, h := range hits {
		r := &results[i]
		r.Counts, r.Rejected, r.Err = s.Hit(ctx, namespace, h.Key, id, h.Windows, h.Undo)
	}
}
