package syncapp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/memory"
	"github.com/ratesync/caddy-ratelimit/window"
)

// gatedBatchStore is a memory store whose HitBatch reports each round
// trip on trips and waits for the test to answer it.
type gatedBatchStore struct {
	*memory.Store
	trips chan gatedTrip
}

// gatedTrip is one round trip of a gatedBatchStore: its hits, and where
// the test answers it: nil applies the hits; an error fails each of them.
type gatedTrip struct {
	hits   []strategy.HitRequest
	answer chan error
}

// newGatedBatches returns a gatedBatchStore on a data set of its own, so
// that a test run again (-count) starts from no counts.
func newGatedBatches(t *testing.T) *gatedBatchStore {
	s := memoryDataSet(fmt.Sprintf("%s-%d", t.Name(), rand.Uint64()))
	return &gatedBatchStore{Store: s, trips: make(chan gatedTrip, 100)}
}

func (g *gatedBatchStore) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	trip := gatedTrip{hits: slices.Clone(hits), answer: make(chan error, 1)}
	g.trips <- trip
	var err error
	select {
	case err = <-trip.answer:
	case <-ctx.Done():
		err = ctx.Err()
	}
	for i, h := range hits {
		r := &results[i]
		if err != nil {
			r.Err = err
			continue
		}
		r.Counts, r.Rejected, r.Err = g.Hit(ctx, namespace, h.Key, "", h.Windows, h.Undo)
	}
}

// testQueue is a hit queue whose hits all go to one store.
type testQueue struct {
	*hitQueue
	store *tripStore
}

func newTestQueue(s strategy.Hitter, h *health) testQueue {
	return testQueue{newHitQueue("api", h), newTripStore(s)}
}

// do sends one hit to the queue's store.
func (q testQueue) do(ctx context.Context, req strategy.HitRequest) (strategy.HitResult, retrySlot) {
	return q.hitQueue.do(ctx, q.store, req)
}

// queuedLen returns how many hits wait in q.
func queuedLen(q *hitQueue) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queued)
}

func oneHit(key string) strategy.HitRequest {
	return strategy.HitRequest{Key: key, Windows: []strategy.WindowHit{{
		Size: time.Hour, Start: window.Start(time.Now().UnixNano(), time.Hour), Value: 1, Max: math.Inf(1),
	}}}
}

// hitsAsync sends n hits of key through q, each from its own goroutine,
// and returns their results when all are in.
func hitsAsync(q testQueue, n int, key string) <-chan []strategy.HitResult {
	out := make(chan []strategy.HitResult, 1)
	go func() {
		results := make([]strategy.HitResult, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { results[i], _ = q.do(context.Background(), oneHit(key)) })
		}
		wg.Wait()
		out <- results
	}()
	return out
}

// neverStall keeps q from arming a stall check, for a test that holds
// round trips open longer than stallAfter on a loaded machine.
func neverStall(q *hitQueue) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.watching = true // a check counts as armed, so none is
}

// fillRoundTrips starts the round trip a queue of a batch store has in
// flight at most, with one hit of key that the test holds, sent alone as
// no round trip was out. It returns the round trips and, once they are
// answered, the results of their hits.
func fillRoundTrips(t *testing.T, q testQueue, s *gatedBatchStore, key string) ([]gatedTrip, <-chan []strategy.HitResult) {
	t.Helper()
	alone := hitsAsync(q, 1, key)
	first := <-s.trips
	if len(first.hits) != 1 {
		t.Fatalf("a hit sent while no round trip was out went in a batch of %d", len(first.hits))
	}
	return []gatedTrip{first}, alone
}

// A hit that arrives while no round trip is out goes alone, at once; the
// hits that arrive while one is out wait, however many, and go together
// in one round trip when it ends. Each hit gets its own answer, in the
// order the store applied them.
func TestHitQueueCoalescesWhileARoundTripIsOut(t *testing.T) {
	initMetrics()
	s := newGatedBatches(t)
	q := newTestQueue(s, newHealth("api", zap.NewNop()))
	neverStall(q.hitQueue) // the test holds round trips open as long as it needs
	out, alone := fillRoundTrips(t, q, s, "k")
	waiting := hitsAsync(q, 50, "k")
	poll.Until(t, 10*time.Second, "50 hits to queue", func() bool { return queuedLen(q.hitQueue) >= 50 })
	select {
	case trip := <-s.trips:
		t.Fatalf("%d hits went in a second round trip while one was out", len(trip.hits))
	default:
	}
	out[0].answer <- nil // the round trip ends: the 50 go in the next
	next := <-s.trips
	if len(next.hits) != 50 {
		t.Fatalf("the hits that waited went in a batch of %d, want 50", len(next.hits))
	}
	next.answer <- nil
	var currents []float64
	for _, r := range slices.Concat(<-alone, <-waiting) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		currents = append(currents, r.Counts[0].Current)
	}
	slices.Sort(currents)
	for i, c := range currents {
		if c != float64(i+1) {
			t.Fatalf("the hits saw counts %v, want 1 to %d once each", currents, len(currents))
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.trips != 0 || len(q.queued) != 0 {
		t.Fatalf("%d round trips and %d hits left after every hit was answered", q.trips, len(q.queued))
	}
}

// singleHitter is a gatedBatchStore seen as a store without HitBatch: each
// Hit is a round trip of its own that the test answers.
type singleHitter struct {
	strategy.Store // the gated store's, and only those of a Store
	g              *gatedBatchStore
}

func (s singleHitter) Hit(ctx context.Context, namespace, key, id string, windows []strategy.WindowHit, undo bool) ([]strategy.WindowCounts, int, error) {
	r := []strategy.HitResult{{}}
	s.g.HitBatch(ctx, namespace, id, []strategy.HitRequest{{Key: key, Windows: windows, Undo: undo}}, r)
	return r[0].Counts, r[0].Rejected, r[0].Err
}

// A store that takes one hit at a time has two round trips out at once,
// each of one hit; a third hit waits for one of them to end.
func TestHitQueueOfSingleHitsKeepsTwoRoundTripsOut(t *testing.T) {
	initMetrics()
	g := newGatedBatches(t)
	q := newTestQueue(singleHitter{g, g}, newHealth("api", zap.NewNop()))
	neverStall(q.hitQueue)
	results := hitsAsync(q, 3, "k")
	first, second := <-g.trips, <-g.trips
	poll.Until(t, 10*time.Second, "a third hit to queue", func() bool { return queuedLen(q.hitQueue) == 1 })
	select {
	case trip := <-g.trips:
		t.Fatalf("a third round trip of %d hits went while two were out", len(trip.hits))
	default:
	}
	first.answer <- nil
	third := <-g.trips
	second.answer <- nil
	third.answer <- nil
	for _, trip := range []gatedTrip{first, second, third} {
		if len(trip.hits) != 1 {
			t.Fatalf("a store without HitBatch got a round trip of %d hits", len(trip.hits))
		}
	}
	for _, r := range <-results {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}

// When the store answers nothing while hits wait, it is held stalled: the
// hits waiting leave the queue unsent, requests skip the store from then
// on, and only the hits of the round trips in flight wait out their
// timeout.
func TestHitQueueStallSendsWaitingHitsLocal(t *testing.T) {
	initMetrics()
	s := newGatedBatches(t)
	h := newHealth("api", zap.NewNop())
	q := newTestQueue(s, h)
	out, inFlight := fillRoundTrips(t, q, s, "k")
	waiting := <-hitsAsync(q, 30, "k") // returns once the stall is seen
	for _, r := range waiting {
		if !errors.Is(r.Err, errStalled) || !errors.Is(r.Err, strategy.ErrNotSent) {
			t.Fatalf("a waiting hit of a stalled store got %v, want errStalled (not sent)", r.Err)
		}
	}
	if !h.down() {
		t.Fatal("requests still try a stalled store")
	}
	select {
	case <-inFlight:
		t.Fatal("the round trips in flight ended before the store answered")
	default:
	}
	for _, trip := range out {
		trip.answer <- nil // the store resumes
	}
	for _, r := range <-inFlight {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
}

// A stall check that finds answers since it was armed looks again later
// instead of declaring a stall.
func TestHitQueueNoStallWhileAnswersCome(t *testing.T) {
	initMetrics()
	h := newHealth("api", zap.NewNop())
	q := newTestQueue(newGatedBatches(t), h)
	since := time.Now().UnixNano()
	q.answered.Store(since + 1)
	q.mu.Lock()
	q.queued = append(q.queued, newQueuedHit(nil, strategy.HitRequest{}))
	q.watching = true
	stall := q.stall
	q.mu.Unlock()
	q.checkStall(since)
	select {
	case <-stall:
		t.Fatal("a store that answered was held stalled")
	default:
	}
	if h.down() {
		t.Fatal("a store that answered is skipped")
	}
}

// A round trip that failed after it may have been applied is retried as
// one batch under its ID, once every hit of it added the increments it
// was counted with locally.
func TestBatchRetryGathersTheRoundTrip(t *testing.T) {
	initMetrics()
	s := newGatedBatches(t)
	q := newTestQueue(s, newHealth("api", zap.NewNop()))
	neverStall(q.hitQueue) // the test holds round trips open as long as it needs
	out, first := fillRoundTrips(t, q, s, "a")
	type answer struct {
		res   strategy.HitResult
		retry retrySlot
	}
	answers := make(chan answer, 3)
	for _, k := range []string{"x", "y", "z"} {
		go func() {
			res, retry := q.do(context.Background(), oneHit(k))
			answers <- answer{res, retry}
		}()
	}
	poll.Until(t, 10*time.Second, "3 hits to queue", func() bool { return queuedLen(q.hitQueue) >= 3 })
	out[0].answer <- nil
	(<-s.trips).answer <- errors.New("i/o timeout") // may have been applied
	var slots []retrySlot
	for range 3 {
		a := <-answers
		if a.retry.r == nil || (slots != nil && a.retry.r != slots[0].r) {
			t.Fatal("the hits of a failed round trip do not share one retry")
		}
		slots = append(slots, a.retry)
	}
	for i, k := range []string{"x", "y", "z"} {
		b, last := slots[i].add([]window.Diff{{Key: k, Size: time.Hour, Value: 1}}, nil)
		if last != (i == 2) {
			t.Fatalf("after %d of 3 hits added theirs, last is %v", i+1, last)
		}
		if last && len(b.Diffs) != 3 {
			t.Fatalf("the retry carries %d diffs, want 3", len(b.Diffs))
		}
	}
	for _, trip := range out[1:] {
		trip.answer <- nil
	}
	<-first
}
