package redis

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// failoverBound is how soon after a Cluster's replica is promoted the
// store must serve every key again.
const failoverBound = 5 * time.Second

// A Cluster master killed with SIGKILL and its replica promoted with
// CLUSTER FAILOVER TAKEOVER: within failoverBound of the promotion, the
// store pushes, fetches and hits keys of the failed master's slots and of
// the healthy masters, in calls that mix both, and takes and releases
// concurrency slots, and a batch tried again
// through the failover is applied once. The keys of the healthy masters
// are applied by the first attempt of a push that mixes them with keys of
// the failed master.
//
// The test keeps trying for a long time, so that a failure says how long
// the store took; before the store reloaded the slot map after connection
// failures, that was about a minute (go-redis's periodic reload).
func TestClusterFailover(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	// The masters are the seeds, as in a typical configuration; the
	// timeouts are the defaults. Pushes, fetches and hits go through
	// stores of their own, so that none gains from another's reload.
	masters := cl.Masters(t)
	var seeds []string
	for _, m := range masters {
		seeds = append(seeds, m.Addr)
	}
	r := open(t, &Redis{Addresses: seeds})
	fetcher := open(t, &Redis{Addresses: seeds})
	hitter := open(t, &Redis{Addresses: seeds})
	slotter := open(t, &Redis{Addresses: seeds})
	cc := r.client.(*goredis.ClusterClient)
	ctx := testCtx(t)
	now := steadyNow()
	size := time.Hour
	start := window.Start(now.UnixNano(), size)

	victim := masters[0]
	replica := cl.ReplicaOf(t, victim)
	// Keys of the victim's slots and of the other masters.
	var dead, healthy []string
	for i := 0; len(dead) < 40 || len(healthy) < 40; i++ {
		k := fmt.Sprintf("client-%d", i)
		c, err := cc.MasterForKey(ctx, counterKeyOf(r, "after", k, size, start))
		if err != nil {
			t.Fatal(err)
		}
		if c.Options().Addr == victim.Addr {
			dead = append(dead, k)
		} else {
			healthy = append(healthy, k)
		}
	}
	dead, healthy = dead[:40], healthy[:40]
	all := append(append([]string(nil), dead...), healthy...)
	batchOf := func(ns string, keys []string) strategy.Batch {
		b := strategy.Batch{ID: newID(), Namespace: ns}
		for _, k := range keys {
			b.Diffs = append(b.Diffs, window.Diff{Key: k, Size: size, Start: start, Value: 1})
		}
		return b
	}
	// Hits go to counters of the keys' own slots, in windows of their
	// own.
	hitSize := 2 * time.Hour
	hitStart := window.Start(now.UnixNano(), hitSize)
	hit := func(ctx context.Context, key string) error {
		_, _, err := hitter.Hit(ctx, "after", key, newID(), []strategy.WindowHit{{Size: hitSize, Start: hitStart, Value: 1, Max: math.Inf(1)}}, false)
		return err
	}
	// Every node serves the store's pooled connections.
	if err := r.PushDiffs(ctx, batchOf("before", all)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{r, fetcher} {
		if _, err := s.GetCounters(ctx, "before", all, []time.Duration{size}, now); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range all {
		if err := hit(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	slot := func(ctx context.Context, key string) error {
		id := newID()
		if _, ok, err := slotter.AcquireSlot(ctx, "after", key, id, 1000, time.Minute); err != nil || !ok {
			return fmt.Errorf("acquiring a slot: %v, taken %v", err, ok)
		}
		return slotter.ReleaseSlots(ctx, "after", []strategy.Slot{{Key: key, ID: id}})
	}
	if err := slot(ctx, dead[0]); err != nil {
		t.Fatal(err)
	}

	victim.Kill()
	cl.Promote(t, replica)
	promoted := time.Now()

	// A push that mixes both kinds of keys, tried again under its ID
	// until it succeeds, as the sync app does.
	batch := batchOf("after", all)
	try := func(op func(context.Context) error) error {
		// Not testCtx: the test may take longer than it allows.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return op(ctx)
	}
	push := func(ctx context.Context) error { return r.PushDiffs(ctx, batch) }
	fetch := func(ctx context.Context) error {
		_, err := fetcher.GetCounters(ctx, "after", all, []time.Duration{size}, now)
		return err
	}
	// A key of a healthy master is hit at every attempt, and never fails.
	var healthyErr error
	hits := func(ctx context.Context) error {
		if err := hit(ctx, healthy[0]); err != nil && healthyErr == nil {
			healthyErr = err
		}
		return hit(ctx, dead[0])
	}

	firstErr := try(push)
	firstTook := time.Since(promoted)
	// Whatever the first attempt answered, it applied the healthy
	// masters' keys.
	counts, err := r.GetCounters(ctx, "after", healthy, []time.Duration{size}, now)
	if err != nil {
		t.Fatalf("fetching keys of the healthy masters: %v", err)
	}
	if got := countsByWindow(t, counts); len(got) != len(healthy) {
		t.Errorf("the first attempt of the push (error %v) applied %d of %d keys of the healthy masters", firstErr, len(got), len(healthy))
	}

	ops := []struct {
		name string
		op   func(context.Context) error
		ok   time.Duration // after the promotion
		err  error         // the first error
	}{
		{name: "push", op: push}, {name: "fetch", op: fetch}, {name: "hits", op: hits},
		{name: "slots", op: func(ctx context.Context) error { return slot(ctx, dead[0]) }},
	}
	if firstErr == nil {
		ops[0].ok = firstTook
	} else {
		ops[0].err = firstErr
	}
	// Long enough to see go-redis's own minute-long reload, so that a
	// failure says how long the store took.
	poll.For(time.Until(promoted.Add(90*time.Second)), func() bool {
		done := true
		for i := range ops {
			o := &ops[i]
			if o.ok != 0 {
				continue
			}
			if err := try(o.op); err != nil {
				if o.err == nil {
					o.err = err
				}
				done = false
				continue
			}
			o.ok = time.Since(promoted)
		}
		return done
	}) // the checks below say which operation never came back
	if healthyErr != nil {
		t.Errorf("a hit of a key of a healthy master failed: %v", healthyErr)
	}
	for _, o := range ops {
		if o.ok == 0 {
			t.Errorf("%s still failed %v after the promotion (first error: %v)", o.name, time.Since(promoted).Round(time.Millisecond), o.err)
			continue
		}
		t.Logf("%s served every key %v after the promotion (first error: %v)", o.name, o.ok.Round(time.Millisecond), o.err)
		if o.ok > failoverBound {
			t.Errorf("%s served every key %v after the promotion, want within %v (first error: %v)", o.name, o.ok.Round(time.Millisecond), failoverBound, o.err)
		}
	}

	// The batch counted once, whatever its failed attempts applied.
	counts, err = r.GetCounters(testCtx(t), "after", all, []time.Duration{size}, now)
	if err != nil {
		t.Fatal(err)
	}
	got := countsByWindow(t, counts)
	for _, k := range all {
		if v := got[winKey{k, size, start}]; v != 1 {
			t.Errorf("key %q holds %v after the batch, want 1", k, v)
		}
	}
}

// A Cluster master that stays down, with no replica to promote: every
// call that touches its slots fails, and has the slot map reloaded, but
// at most once per minReloadInterval, however many calls fail.
func TestClusterNodeDownReloadsRateLimited(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r := open(t, &Redis{Addresses: cl.Addrs})
	ctx := testCtx(t)
	now := steadyNow()
	size := time.Hour
	start := window.Start(now.UnixNano(), size)
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("client-%d", i))
	}
	b := strategy.Batch{ID: newID(), Namespace: "ns"}
	for _, k := range keys {
		b.Diffs = append(b.Diffs, window.Diff{Key: k, Size: size, Start: start, Value: 1})
	}
	if err := r.PushDiffs(ctx, b); err != nil {
		t.Fatal(err)
	}
	victim := cl.Servers[0]
	var clients []*goredis.Client
	for _, s := range cl.Servers[1:] {
		c := s.Client("")
		resetStats(t, c)
		clients = append(clients, c)
	}
	victim.Kill()

	began := time.Now()
	var failures int
	for range 10 {
		if err := r.PushDiffs(ctx, b); err != nil {
			failures++
		}
		if _, err := r.GetCounters(ctx, "ns", keys, []time.Duration{size}, now); err != nil {
			failures++
		}
	}
	r.topo.close() // no reload in the background after the count
	took := time.Since(began)
	if failures != 20 {
		t.Errorf("%d of 20 calls failed with a master down, want all", failures)
	}
	var reloads int
	for _, c := range clients {
		reloads += serverCalls(t, c)["cluster|slots"]
	}
	// At most one reload per interval, plus the one in flight at the end.
	if most := int(took/minReloadInterval) + 1; reloads > most || reloads == 0 {
		t.Errorf("%d reloads of the slot map in %v, want 1 to %d", reloads, took, most)
	}
	t.Logf("%d failed calls in %v, %d reloads", failures, took, reloads)
}
