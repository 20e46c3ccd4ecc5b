package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r := open(t, &Redis{Addresses: cl.Addrs, ReadTimeout: caddy.Duration(5 * time.Second)})
	if _, ok := r.client.(*goredis.ClusterClient); !ok {
		t.Fatalf("several addresses made a %T, want a cluster client", r.client)
	}
	ctx := testCtx(t)
	now := steadyNow()
	size := time.Hour
	start := window.Start(now.UnixNano(), size)
	const ns = "api"

	// Enough diffs for several pipelines, plus the hostile keys.
	keys := hostileKeys()
	for i := range 3000 {
		keys = append(keys, fmt.Sprintf("client-%d", i))
	}
	var diffs []window.Diff
	for i, k := range keys {
		diffs = append(diffs,
			window.Diff{Key: k, Size: size, Start: start, Value: float64(i%7) + 0.5},
			window.Diff{Key: k, Size: size, Start: start - int64(size), Value: 1})
	}
	batch := strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs}
	if err := r.PushDiffs(ctx, batch); err != nil {
		t.Fatal(err)
	}
	// A retry of the batch changes nothing, on a cluster too.
	if err := r.PushDiffs(ctx, batch); err != nil {
		t.Fatal(err)
	}

	t.Run("fetch", func(t *testing.T) {
		counts, err := r.GetCounters(ctx, ns, keys, []time.Duration{size}, now)
		if err != nil {
			t.Fatal(err)
		}
		got := countsByWindow(t, counts)
		if len(got) != 2*len(keys) {
			t.Errorf("got %d counts, want %d", len(got), 2*len(keys))
		}
		for i, k := range keys {
			if v := got[winKey{k, size, start}]; v != float64(i%7)+0.5 {
				t.Errorf("key %d current = %v, want %v", i, v, float64(i%7)+0.5)
			}
			if v := got[winKey{k, size, start - int64(size)}]; v != 1 {
				t.Errorf("key %d previous = %v, want 1", i, v)
			}
		}
	})

	t.Run("hit and get window", func(t *testing.T) {
		for i, k := range keys[:50] {
			cur, prev, err := hitOne(ctx, r, ns, k, size, start, 2)
			if err != nil {
				t.Fatal(err)
			}
			if want := float64(i%7) + 2.5; cur != want || prev != 1 {
				t.Errorf("Hit of key %d = %v, %v; want %v, 1", i, cur, prev, want)
			}
			if v, err := r.GetWindow(ctx, ns, k, size, start); err != nil || v != cur {
				t.Errorf("GetWindow of key %d = %v, %v; want %v", i, v, err, cur)
			}
		}
	})

	t.Run("a hit of three windows", func(t *testing.T) {
		// Keys whose braces must not choose the slot, and keys spread
		// over the nodes; the hour window's previous counter holds 0.25.
		multi := append(hostileKeys()[:14], "multi-0", "multi-1", "multi-2", "multi-3")
		var prev []window.Diff
		for _, k := range multi {
			prev = append(prev, window.Diff{Key: k, Size: size, Start: start - int64(size), Value: 0.25})
		}
		if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "multi", Diffs: prev}); err != nil {
			t.Fatal(err)
		}
		ws := []strategy.WindowHit{
			// Far ahead, so the counter cannot expire however slow the run.
			{Size: time.Second, Start: window.Start(now.Add(time.Hour).UnixNano(), time.Second), Value: 1, Max: 10},
			{Size: time.Minute, Start: window.Start(now.UnixNano(), time.Minute), Value: 1, Max: 10},
			{Size: size, Start: start, Value: 1, Max: 1.5, Weight: 1},
		}
		three := func(n float64) []strategy.WindowCounts {
			return []strategy.WindowCounts{{Current: n}, {Current: n}, {Current: n, Previous: 0.25}}
		}
		for i, k := range multi {
			ids := []string{newID(), newID()}
			for hit, want := range []struct {
				id       string
				counts   []strategy.WindowCounts
				rejected int
			}{
				{ids[0], three(1), -1}, // 1 + 0.25 <= 1.5
				{ids[1], three(1), 2},  // 2 + 0.25 > 1.5: rejected by the hour, taken back
				{ids[0], three(1), -1}, // sent again: only read, 1 + 0.25 <= 1.5
			} {
				counts, rejected, err := r.Hit(ctx, "multi", k, want.id, ws, true)
				if err != nil {
					t.Fatalf("key %d, hit %d: %v", i, hit, err)
				}
				if rejected != want.rejected || !slices.Equal(counts, want.counts) {
					t.Errorf("key %d, hit %d = %v, rejected %d; want %v, rejected %d", i, hit, counts, rejected, want.counts, want.rejected)
				}
			}
			// The hit's marker lives on the node of the counters, in their
			// slot, for at least a minute, and at most two with an hour's
			// counter.
			marker := r.layout.dedupeKey(bucketOf("multi", k), 0, ids[0])
			counter := counterKeyOf(r, "multi", k, size, start)
			markerTTL, err := r.client.PTTL(ctx, marker).Result()
			if err != nil {
				t.Fatal(err)
			}
			counterTTL, err := r.client.PTTL(ctx, counter).Result()
			if err != nil {
				t.Fatal(err)
			}
			if markerTTL < strategy.MaxHitIDLife-5*time.Second || markerTTL > strategy.MaxHitIDLife || counterTTL < strategy.MaxHitIDLife {
				t.Errorf("key %d: the hit's marker lives %v (the counter %v), want about %v", i, markerTTL, counterTTL, strategy.MaxHitIDLife)
			}
			for _, key := range []string{marker, counterKeyOf(r, "multi", k, time.Second, ws[0].Start)} {
				if got, want := slotOf(t, r, key), slotOf(t, r, counter); got != want {
					t.Errorf("key %d: %q is in slot %d, want the counters' %d", i, key, got, want)
				}
			}
			for _, w := range ws {
				if v, err := r.GetWindow(ctx, "multi", k, w.Size, w.Start); err != nil || v != 1 {
					t.Errorf("key %d: window %v holds %v, %v; want 1", i, w.Size, v, err)
				}
			}
		}
	})

	t.Run("one namespace spreads over the cluster", func(t *testing.T) {
		slots := make(map[int64]bool)
		var mu sync.Mutex
		perNode := make(map[string]int64)
		err := r.client.(*goredis.ClusterClient).ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			n, err := c.DBSize(ctx).Result()
			mu.Lock()
			perNode[c.Options().Addr] = n
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(perNode) != 3 {
			t.Fatalf("counted keys on %d nodes, want 3", len(perNode))
		}
		for addr, n := range perNode {
			// 6,000 counters over 3 nodes: about 2,000 each.
			if n < 1000 {
				t.Errorf("node %s holds %d keys, want about a third of the namespace", addr, n)
			}
		}
		for _, k := range keys {
			slot, err := r.client.ClusterKeySlot(ctx, counterKeyOf(r, ns, k, size, start)).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots[slot] = true
		}
		t.Logf("keys per node: %v; slots used by the namespace: %d", perNode, len(slots))
		// 1,024 buckets hash to about as many slots.
		if len(slots) < 900 {
			t.Errorf("the namespace's counters use %d slots, want about 1,000", len(slots))
		}
	})

	t.Run("client keys do not choose the slot", func(t *testing.T) {
		for _, k := range []string{"{x}", "{tag}suffix", "prefix{tag}", "{", "}{", strings.Repeat("{", 100)} {
			key := counterKeyOf(r, ns, k, size, start)
			got, err := r.client.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			tag := strconv.Itoa(bucketOf(ns, k))
			want, err := r.client.ClusterKeySlot(ctx, tag).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("key %q: slot %d, want the slot of its bucket tag {%s}, %d", k, got, tag, want)
			}
		}
	})

	t.Run("reset", func(t *testing.T) {
		// A key's counters of every size share its slot, so one
		// transaction resets them on a Cluster too.
		sizes := []time.Duration{time.Minute, size}
		reset := keys[:len(hostileKeys())+50]
		for _, k := range reset {
			if err := r.Reset(ctx, ns, k, sizes, now); err != nil {
				t.Fatalf("resetting %q: %v", k, err)
			}
		}
		counts, err := r.GetCounters(ctx, ns, reset, sizes, now)
		if err != nil {
			t.Fatal(err)
		}
		got := countsByWindow(t, counts)
		if len(got) != 4*len(reset) {
			t.Errorf("got %d counts, want %d", len(got), 4*len(reset))
		}
		for w, v := range got {
			if v != 0 {
				t.Errorf("%+v holds %v after the reset, want 0", w, v)
			}
		}
		// The keys after them keep their counts.
		if v, err := r.GetWindow(ctx, ns, keys[len(reset)], size, start); err != nil || v != float64(len(reset)%7)+0.5 {
			t.Errorf("a key not reset holds %v, %v; want %v", v, err, float64(len(reset)%7)+0.5)
		}
	})
}

// counterKeyOf returns the Redis key of a counter.
func counterKeyOf(r *Store, ns, key string, size time.Duration, start int64) string {
	k, _ := r.layout.counterKey(nil, bucketOf(ns, key), size.Milliseconds(), start/int64(time.Millisecond), nsPart(ns), key)
	return k
}

// slotOf returns the Cluster slot of a Redis key.
func slotOf(t *testing.T, r *Store, key string) int64 {
	t.Helper()
	slot, err := r.client.ClusterKeySlot(testCtx(t), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return slot
}
