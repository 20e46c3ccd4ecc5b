package syncapp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// batchSizes returns how many round trips of synchronous hits namespace
// api sent so far, and how many hits they carried.
func batchSizes(t *testing.T) (trips uint64, hits float64) {
	t.Helper()
	var m dto.Metric
	if err := metrics.hitBatch.WithLabelValues("api").(prometheus.Histogram).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestFleetSynchronousBatchesAdmitExactlyTheLimit sends 450 requests of
// one key at once through three synchronous nodes, with a limit of 200 on
// a fixed window: the hits that wait for a round trip go together, and
// exactly 200 are admitted, as one hit at a time would.
func TestFleetSynchronousBatchesAdmitExactlyTheLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := synchronousNodes(t, s, 3)
		awayFromHourEnd(time.Minute)
		const limit, tries = 200, 450
		tripsBefore, hitsBefore := batchSizes(t)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		begin := make(chan struct{})
		for i := range tries {
			wg.Go(func() {
				<-begin
				out := make([]window.Sample, 1)
				if nodes[i%3].Hit(context.Background(), "k", []Limit{{Size: time.Hour, Max: limit}}, 1, true, true, out) < 0 {
					admitted.Add(1)
				}
			})
		}
		close(begin)
		wg.Wait()
		if admitted.Load() != limit {
			t.Fatalf("admitted %d of %d, want exactly %d", admitted.Load(), tries, limit)
		}
		if got := s.total(t, "k", time.Hour); got != limit {
			t.Fatalf("store holds %v, want %d (the rejected hits undone)", got, limit)
		}
		trips, hits := batchSizes(t)
		trips, hits = trips-tripsBefore, hits-hitsBefore
		t.Logf("%v hits in %d round trips (%.1f a round trip)", hits, trips, hits/float64(trips))
		if hits != tries || trips >= tries {
			t.Fatalf("%v hits in %d round trips: none went together", hits, trips)
		}
	})
}

// replyLost is a store whose round trips of synchronous hits, while lose
// is set, are applied and then fail as a timeout does: the reply is lost.
type replyLost struct {
	strategy.BatchHitter
	lose atomic.Bool
	lost atomic.Int64 // round trips whose reply was lost
}

func (r *replyLost) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	r.BatchHitter.HitBatch(ctx, namespace, id, hits, results)
	if r.lose.Load() {
		r.lost.Add(1)
		for i := range results {
			results[i] = strategy.HitResult{Err: errors.New("read tcp 127.0.0.1:6379: i/o timeout")}
		}
	}
}

// TestSynchronousBatchRetriedOnce loses the replies of round trips that
// the store applied: their hits count locally and are pushed again under
// their round trip's ID, which the store skips, so that every hit is
// counted exactly once, in the store and on the node.
func TestSynchronousBatchRetriedOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		ns := start(t, caddy.NewUsagePool(), s.config("0", "1h")).ns("api")
		lossy := &replyLost{BatchHitter: ns.road.store.BatchHitter}
		ns.road.store.BatchHitter = lossy
		ns.Increment(context.Background(), "warm-up", time.Hour, 1) // connect first
		lossy.lose.Store(true)
		const tries = 100
		var wg sync.WaitGroup
		begin := make(chan struct{})
		for range tries {
			wg.Go(func() {
				<-begin
				ns.Increment(context.Background(), "k", time.Hour, 1)
			})
		}
		close(begin)
		wg.Wait()
		lossy.lose.Store(false)
		if lossy.lost.Load() == 0 {
			t.Fatal("no round trip lost its reply")
		}
		poll.Until(t, 10*time.Second, "the retries to be pushed", func() bool {
			return ns.Sync(context.Background()) == nil && ns.runner.pendingDiffs() == 0
		})
		if got := s.total(t, "k", time.Hour); got != tries {
			t.Fatalf("store holds %v, want %d: a retried round trip was counted twice, or not at all", got, tries)
		}
		if got := both(ns.SlidingWindow("k", time.Hour, nil)); got != tries {
			t.Fatalf("the node counts %v, want %d", got, tries)
		}
	})
}

// inDoubt is a store whose round trips of synchronous hits, while on is
// set, fail as a timeout does, in turn after the store applied them (the
// reply lost: the even round trips) and before it did (the request lost):
// either way the caller cannot tell whether they were applied.
type inDoubt struct {
	strategy.BatchHitter
	on                 atomic.Bool
	trips, after, hits atomic.Int64
	// applied, unless nil, chooses the round trips applied instead.
	applied func(trip int64) bool
	// onDoubt, unless nil, runs once, when the first round trip in doubt
	// ends, before its hits learn it failed.
	onDoubt func()
	once    sync.Once
}

func (d *inDoubt) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	if !d.on.Load() {
		d.BatchHitter.HitBatch(ctx, namespace, id, hits, results)
		return
	}
	d.hits.Add(int64(len(hits)))
	if n := d.trips.Add(1); d.applied != nil && d.applied(n) || d.applied == nil && n%2 == 0 {
		d.after.Add(1)
		d.BatchHitter.HitBatch(ctx, namespace, id, hits, results)
	}
	if d.onDoubt != nil {
		d.once.Do(d.onDoubt)
	}
	for i := range results {
		results[i] = strategy.HitResult{Err: errors.New("read tcp 127.0.0.1:1: i/o timeout")}
	}
}

// turnsCase checks that the turns of a rate reach the store's TAT once
// each: a turn is a minute and the burst holds every request, so that a
// turn counted twice or lost moves the TAT by far more than a test's own
// time.
type turnsCase struct {
	t      *testing.T
	rater  strategy.RateBatcher
	ns     string
	rate   Rate
	began  time.Time
	before int64
}

func newTurnsCase(t *testing.T, ns *Namespace) *turnsCase {
	c := &turnsCase{t: t, rater: ns.store.(strategy.RateBatcher), ns: ns.name, rate: Rate{N: 1, Window: time.Minute, Burst: 1000}}
	c.began, c.before = time.Now(), c.tat()
	return c
}

// tat reads key k's TAT in the store, without taking a turn.
func (c *turnsCase) tat() int64 {
	rep, err := strategy.RateAsBatch(context.Background(), c.rater, c.ns, "k", newBatchID(), strategy.RateRequest{Window: c.rate.Window, Tolerance: time.Microsecond})
	if err != nil {
		c.t.Fatal(err)
	}
	return max(rep.TAT, rep.Now)
}

// requests sends n requests of key k together through ns, each of which
// the burst admits.
func (c *turnsCase) requests(ns *Namespace, n int) {
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-begin
			var rs RateSample
			if ok, rejected := ns.HitRate(context.Background(), "k", c.rate, 1, nil, 1, false, false, nil, &rs); !ok || rejected >= 0 {
				c.t.Errorf("a request within the burst was refused (rate %v, limit %d)", ok, rejected)
			}
		})
	}
	close(begin)
	wg.Wait()
}

// check checks that the store's TAT moved by a turn for each of the
// requests that went to the store in doubt.
func (c *turnsCase) check(d *inDoubt) {
	c.t.Helper()
	moved, took := time.Duration(c.tat()-c.before), time.Since(c.began)
	want := time.Duration(d.hits.Load()) * c.rate.Window
	c.t.Logf("%d requests in %d round trips in doubt (%d applied): the store's TAT moved %v in %v",
		d.hits.Load(), d.trips.Load(), d.after.Load(), moved, took.Round(time.Millisecond))
	if moved < want || moved > want+took {
		c.t.Fatalf("the store's TAT moved %v, want %v (a turn each) to %v: a turn was lost or counted twice", moved, want, want+took)
	}
}

// TestSynchronousRateRetriedOnce sends requests under a rate whose round
// trips end in doubt, every other one applied by the store: the node
// decides them, and the turns it admitted reach the store's TAT exactly
// once, through the round trips' retries, whichever were applied.
func TestSynchronousRateRetriedOnce(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		ns := rateFleet(t, s)[0]
		doubt := &inDoubt{BatchHitter: ns.road.store.BatchHitter}
		ns.road.store.BatchHitter = doubt
		c := newTurnsCase(t, ns)
		doubt.on.Store(true)
		// Rounds of requests together: the first failure of a round holds
		// the store down, and the round's requests after it are decided by
		// the node alone, never sent; a run then finds the store back.
		for round := 0; doubt.trips.Load() < 6; round++ {
			if round == 100 {
				t.Fatalf("%d round trips in 100 rounds", doubt.trips.Load())
			}
			c.requests(ns, 10)
			poll.Until(t, 10*time.Second, "the store to be found back", func() bool {
				return ns.Sync(context.Background()) == nil && !ns.health.down()
			})
		}
		doubt.on.Store(false)
		poll.Until(t, 10*time.Second, "the retries to be pushed", func() bool {
			return ns.Sync(context.Background()) == nil && ns.runner.pendingDiffs() == 0
		})
		c.check(doubt)
	})
}

// TestRateInDoubtOutlivesAReload decides requests under a rate whose
// round trip ends in doubt as the store goes away (so that no sync run
// of the old config can push the turns, nor its stop), then reloads the
// config: the new config pushes them once the store is back, and the
// store's TAT counts each exactly once, whether the round trip was
// applied or not.
func TestRateInDoubtOutlivesAReload(t *testing.T) {
	for _, applied := range []bool{false, true} {
		t.Run(fmt.Sprintf("applied=%v", applied), func(t *testing.T) {
			eachStore(t, func(t *testing.T, s fleetStore) {
				pool := caddy.NewUsagePool()
				cfg := s.config("0", "1h")
				old := start(t, pool, cfg)
				ns := old.ns("api")
				if err := ns.CheckRate(time.Minute); err != nil {
					t.Fatal(err)
				}
				ns.Increment(context.Background(), "warm-up", time.Hour, 1) // connect first
				doubt := &inDoubt{BatchHitter: ns.road.store.BatchHitter, applied: func(int64) bool { return applied }, onDoubt: s.down}
				ns.road.store.BatchHitter = doubt
				c := newTurnsCase(t, ns)
				doubt.on.Store(true)
				c.requests(ns, 10)
				if doubt.trips.Load() == 0 || ns.runner.pendingDiffs() == 0 {
					t.Fatalf("%d round trips in doubt, %d diffs pending: want turns waiting", doubt.trips.Load(), ns.runner.pendingDiffs())
				}
				next := start(t, pool, cfg)
				old.stop() // its push fails: the store is away
				s.up()
				ns = next.ns("api")
				poll.Until(t, 20*time.Second, "the new config to push the turns", func() bool {
					return ns.Sync(context.Background()) == nil && ns.runner.pendingDiffs() == 0
				})
				c.check(doubt)
			})
		})
	}
}
