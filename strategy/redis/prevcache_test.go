package redis

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// A synchronous hit sends the previous count the store remembers, and the
// script does not read it, only while that count is usable: read at least
// prevSettle after the previous window ended (at once for a fixed window),
// and less than prevRefresh ago. A reset through the store forgets it.
func TestHitRemembersPreviousCounts(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	var clock time.Time
	r.now = func() time.Time { return clock }
	at := func(d time.Duration) { clock = time.Unix(0, start).Add(d) }
	push := func(key string, v float64) {
		t.Helper()
		if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "prev", Diffs: []window.Diff{
			{Key: key, Size: size, Start: start - int64(size), Value: v},
		}}); err != nil {
			t.Fatal(err)
		}
	}
	// hit hits key and checks the previous count it saw, and whether the
	// script read the counters.
	hit := func(key string, weight float64, wantPrev float64, wantRead bool) {
		t.Helper()
		resetStats(t, c)
		counts, _, err := r.Hit(ctx, "prev", key, newID(), []strategy.WindowHit{
			{Size: size, Start: start, Value: 1, Max: 1e9, Weight: weight},
		}, false)
		if err != nil {
			t.Fatal(err)
		}
		read := serverCalls(t, c)["mget"] > 0
		if counts[0].Previous != wantPrev || read != wantRead {
			t.Errorf("at %v: previous count %v, read %v; want %v, read %v",
				clock.Sub(time.Unix(0, start)), counts[0].Previous, read, wantPrev, wantRead)
		}
	}

	// A sliding window: its previous count is read until two seconds after
	// the previous window ended, then remembered for a second.
	push("sliding", 4)
	at(time.Second)
	hit("sliding", 0.5, 4, true)
	push("sliding", 1)
	at(1900 * time.Millisecond)
	hit("sliding", 0.5, 5, true)
	at(prevSettle)
	hit("sliding", 0.5, 5, true) // read, and settled
	push("sliding", 1)           // late: a push of a node that syncs rarely
	at(prevSettle + 500*time.Millisecond)
	hit("sliding", 0.5, 5, false)
	at(prevSettle + prevRefresh - time.Millisecond)
	hit("sliding", 0.5, 5, false)
	at(prevSettle + prevRefresh)
	hit("sliding", 0.5, 6, true) // read again
	hit("sliding", 0.5, 6, false)

	// A reset through this store forgets what it remembered of the key.
	if err := r.Reset(ctx, "prev", "sliding", []time.Duration{size}, clock); err != nil {
		t.Fatal(err)
	}
	hit("sliding", 0.5, 0, true)
	hit("sliding", 0.5, 0, false)

	// A counter that a hit makes by incrementing first (the store
	// remembered a previous count, but the counter was not there) gets
	// the expiry of its window.
	at(prevSettle)
	pk := counterKeyOf(r, "prev", "made", size, start-int64(size))
	r.prevs.put(bucketOf("prev", "made"), pk, prevEntry{prev: "0", readAt: clock.UnixMilli()}, clock.UnixMilli())
	hit("made", 0.5, 0, false)
	exp, err := c.Do(ctx, "PEXPIRETIME", counterKeyOf(r, "prev", "made", size, start)).Int64()
	if want := expireAtMs(size.Milliseconds(), start/int64(time.Millisecond)); err != nil || exp != want {
		t.Errorf("the counter made by INCRBYFLOAT expires at %d, %v; want %d", exp, err, want)
	}

	// A fixed window's previous count plays no part in the decision: it
	// is remembered at once, for a second.
	push("fixed", 4)
	at(time.Second)
	hit("fixed", 0, 4, true)
	push("fixed", 1)
	hit("fixed", 0, 4, false)
	// A sliding hit of the same window does not take the unsettled count.
	hit("fixed", 0.5, 5, true)
	push("fixed", 1)
	at(time.Second + prevRefresh)
	hit("fixed", 0, 6, true)
}

// Two nodes (stores) hit one key concurrently, with undo, on a sliding
// window whose previous count they remember: exactly the hits that the
// limit leaves room for are admitted, and the counters hold them.
func TestHitRememberedPreviousAdmitsExactly(t *testing.T) {
	srv, a := startStandalone(t)
	b := open(t, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(5 * time.Second)})
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	clock := func() time.Time { return time.Unix(0, start).Add(10 * time.Second) }
	a.now, b.now = clock, clock
	if err := a.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "exact", Diffs: []window.Diff{
		{Key: "k", Size: size, Start: start - int64(size), Value: 40},
	}}); err != nil {
		t.Fatal(err)
	}
	// 40 * 0.5 + 30 = 50: room for 30 hits.
	windows := []strategy.WindowHit{{Size: size, Start: start, Value: 1, Max: 50, Weight: 0.5}}
	var (
		mu       sync.Mutex
		admitted int
		wg       sync.WaitGroup
	)
	for w := range 8 {
		s := []*Store{a, b}[w%2]
		wg.Go(func() {
			for range 10 {
				_, rejected, err := s.Hit(ctx, "exact", "k", newID(), windows, true)
				if err != nil {
					t.Error(err)
					return
				}
				if rejected == -1 {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if admitted != 30 {
		t.Errorf("%d hits admitted, want 30", admitted)
	}
	checkWindows(t, a, "exact", "k", windows, 30)
}

// The cache holds at most two generations of prevShardCap entries per
// shard, however many keys it is given, and keeps the keys in use.
func TestPrevCacheBounded(t *testing.T) {
	c := newPrevCache()
	nowMs := time.Now().UnixMilli()
	for i := range 200_000 {
		c.put(i%buckets, fmt.Sprint("key-", i), prevEntry{prev: "1", readAt: nowMs}, nowMs)
		c.put(0, "hot", prevEntry{prev: "2", readAt: nowMs}, nowMs)
	}
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		n += len(s.cur) + len(s.old)
	}
	if limit := 2 * prevShards * prevShardCap; n > limit {
		t.Errorf("the cache holds %d entries, want at most %d", n, limit)
	}
	if e, ok := c.get(0, "hot"); !ok || e.prev != "2" {
		t.Errorf("the key in use: %+v, %v", e, ok)
	}
	// A generation ends after prevRefresh: entries older than two are gone.
	c.put(1, "old", prevEntry{prev: "1", readAt: nowMs}, nowMs)
	later := nowMs + prevRefresh.Milliseconds()
	c.put(1, "a", prevEntry{}, later)
	c.put(1, "b", prevEntry{}, later+prevRefresh.Milliseconds())
	if _, ok := c.get(1, "old"); ok {
		t.Error("an entry two generations old is still there")
	}
	c.forget(1, "b")
	if _, ok := c.get(1, "b"); ok {
		t.Error("a forgotten entry is still there")
	}
}
