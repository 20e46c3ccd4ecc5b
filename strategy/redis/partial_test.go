package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// TestClusterPartialFailure kills one master of three: every call fails
// only for the buckets that master serves, names exactly them, and does
// the rest; the failed diffs pushed again under the batch's ID once the
// master is back count once.
func TestClusterPartialFailure(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r := open(t, &Redis{Addresses: cl.Addrs, DialTimeout: caddy.Duration(500 * time.Millisecond), ReadTimeout: caddy.Duration(2 * time.Second)})
	ctx := testCtx(t)
	now := steadyNow()
	size := time.Hour
	start := window.Start(now.UnixNano(), size)
	const ns = "api"
	if r.Parts() != buckets {
		t.Fatalf("a Cluster has %d parts, want %d", r.Parts(), buckets)
	}

	var keys []string
	for i := range 300 {
		keys = append(keys, fmt.Sprintf("client-%d", i))
	}
	dead := cl.Masters(t)[0]
	onDead := make(map[string]bool)
	var deadParts []int
	for _, k := range keys {
		if r.topo.masterOf(ctx, counterKeyOf(r, ns, k, size, start)) == dead.Addr {
			onDead[k] = true
			deadParts = append(deadParts, r.PartOf(ns, k))
		}
		if r.PartOf(ns, k) != bucketOf(ns, k) {
			t.Fatalf("PartOf(%q) = %d, want its bucket %d", k, r.PartOf(ns, k), bucketOf(ns, k))
		}
	}
	slices.Sort(deadParts)
	deadParts = slices.Compact(deadParts)
	if len(onDead) == 0 || len(onDead) == len(keys) {
		t.Fatalf("%d of %d keys on the master to kill", len(onDead), len(keys))
	}
	var diffs []window.Diff
	for _, k := range keys {
		diffs = append(diffs, window.Diff{Key: k, Size: size, Start: start, Value: 2})
	}
	batch := strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs}
	dead.Kill()

	parts, ok := strategy.FailedParts(r.PushDiffs(ctx, batch))
	if !ok || !slices.Equal(parts, deadParts) {
		t.Fatalf("push: failed parts %v (partial %v), want the dead master's %v", parts, ok, deadParts)
	}
	counts, err := r.GetCounters(ctx, ns, keys, []time.Duration{size}, now)
	if parts, ok := strategy.FailedParts(err); !ok || !slices.Equal(parts, deadParts) {
		t.Fatalf("fetch: failed parts %v (partial %v, %v), want the dead master's %v", parts, ok, err, deadParts)
	}
	got := countsByWindow(t, counts)
	for _, k := range keys {
		v, held := got[winKey{k, size, start}]
		switch {
		case onDead[k] && held:
			t.Errorf("fetch: key %q of the dead master has a count, %v", k, v)
		case !onDead[k] && v != 2:
			t.Errorf("fetch: key %q of a live master holds %v, want 2", k, v)
		}
	}

	hits := make([]strategy.HitRequest, 40)
	results := make([]strategy.HitResult, len(hits))
	for i := range hits {
		hits[i] = strategy.HitRequest{Key: keys[i], Windows: []strategy.WindowHit{{Size: size, Start: start, Value: 1, Max: 1e9}}}
	}
	r.HitBatch(ctx, ns, newID(), hits, results)
	for i, res := range results {
		k := keys[i]
		parts, partial := strategy.FailedParts(res.Err)
		switch {
		case onDead[k] && (!partial || !slices.Equal(parts, []int{r.PartOf(ns, k)})):
			t.Errorf("hit of %q on the dead master: %v, want a failure of its part %d", k, res.Err, r.PartOf(ns, k))
		case !onDead[k] && (res.Err != nil || res.Counts[0].Current != 3):
			t.Errorf("hit of %q on a live master: %v, %v; want 3", k, res.Counts, res.Err)
		}
	}
	if _, _, err := r.Hit(ctx, ns, keys[0], "", []strategy.WindowHit{{Size: size, Start: start, Max: 1e9}}, false); onDead[keys[0]] != errors.As(err, new(*strategy.PartialError)) {
		t.Errorf("Hit of %q (on the dead master: %v): %v", keys[0], onDead[keys[0]], err)
	}

	// The master comes back empty; the failed diffs go again under the
	// batch's ID, twice, and count once.
	dead.Restart()
	var failedDiffs []window.Diff
	for _, d := range diffs {
		if onDead[d.Key] {
			failedDiffs = append(failedDiffs, d)
		}
	}
	retry := strategy.Batch{ID: batch.ID, Namespace: ns, Diffs: failedDiffs}
	poll.Until(t, 30*time.Second, "the restarted master to take the failed diffs", func() bool {
		return r.PushDiffs(context.Background(), retry) == nil
	})
	if err := r.PushDiffs(ctx, retry); err != nil {
		t.Fatal(err)
	}
	counts, err = r.GetCounters(ctx, ns, keys, []time.Duration{size}, now)
	if err != nil {
		t.Fatal(err)
	}
	got = countsByWindow(t, counts)
	for i, k := range keys {
		want := 2.0
		if i < len(hits) && !onDead[k] {
			want = 3 // the hit
		}
		if v := got[winKey{k, size, start}]; v != want {
			t.Errorf("after the retry, key %q holds %v, want %v", k, v, want)
		}
	}
}
