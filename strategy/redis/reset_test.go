package redis

import (
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// Reset zeroes the current and previous windows of every size of one key,
// in one round trip, with the usual expiry; other keys keep their counts.
func TestReset(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	now := steadyNow()
	sizes := []time.Duration{time.Minute, time.Hour}
	const ns = "reset"
	var diffs []window.Diff
	for _, key := range []string{"k", "other"} {
		for _, size := range sizes {
			cur := window.Start(now.UnixNano(), size)
			diffs = append(diffs,
				window.Diff{Key: key, Size: size, Start: cur, Value: 3},
				window.Diff{Key: key, Size: size, Start: cur - int64(size), Value: 2})
		}
	}
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs}); err != nil {
		t.Fatal(err)
	}

	h := new(hookCounts)
	r.client.AddHook(h)
	if err := c.Ping(ctx).Err(); err != nil { // connect the stats client
		t.Fatal(err)
	}
	resetStats(t, c)
	h.reset()
	if err := r.Reset(ctx, ns, "k", sizes, now); err != nil {
		t.Fatal(err)
	}
	if process, pipelines, _ := h.get(); process != 0 || pipelines != 1 {
		t.Errorf("Reset sent %d commands and %d pipelines, want one pipeline", process, pipelines)
	}
	// One SET ... PXAT per counter: its value and its expiry.
	want := map[string]int{"multi": 1, "exec": 1, "set": 4}
	if calls := serverCalls(t, c); !maps.Equal(calls, want) {
		t.Errorf("Reset ran %v on the server, want %v", calls, want)
	}

	counts, err := r.GetCounters(ctx, ns, []string{"k", "other"}, sizes, now)
	if err != nil {
		t.Fatal(err)
	}
	got := countsByWindow(t, counts)
	if len(got) != 8 {
		t.Errorf("GetCounters reported %d counters, want 8: %v", len(got), got)
	}
	for _, size := range sizes {
		cur := window.Start(now.UnixNano(), size)
		for _, w := range []struct {
			start    int64
			k, other float64
		}{{cur, 0, 3}, {cur - int64(size), 0, 2}} {
			if v, ok := got[winKey{"k", size, w.start}]; !ok || v != w.k {
				t.Errorf("k, %v window at %d: %v (present %v), want %v present", size, w.start, v, ok, w.k)
			}
			if v := got[winKey{"other", size, w.start}]; v != w.other {
				t.Errorf("other, %v window at %d: %v, want %v", size, w.start, v, w.other)
			}
			key := counterKeyOf(r, ns, "k", size, w.start)
			exp, err := c.PExpireTime(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			// PEXPIRETIME: Unix milliseconds, as a Duration.
			if want := expireAtMs(size.Milliseconds(), w.start/int64(time.Millisecond)); exp != time.Duration(want)*time.Millisecond {
				t.Errorf("%s expires at %d ms, want %d", key, exp.Milliseconds(), want)
			}
		}
	}

	// Diffs pushed after a reset add to zero.
	cur := window.Start(now.UnixNano(), time.Minute)
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: ns, Diffs: []window.Diff{
		{Key: "k", Size: time.Minute, Start: cur, Value: 1.5},
	}}); err != nil {
		t.Fatal(err)
	}
	if v, err := r.GetWindow(ctx, ns, "k", time.Minute, cur); err != nil || v != 1.5 {
		t.Errorf("after a reset and a push of 1.5: %v, %v; want 1.5", v, err)
	}

	// A key the store never held reads as zero too.
	if err := r.Reset(ctx, ns, "new", sizes[:1], now); err != nil {
		t.Fatal(err)
	}
	counts, err = r.GetCounters(ctx, ns, []string{"new"}, sizes[:1], now)
	if err != nil {
		t.Fatal(err)
	}
	if got := countsByWindow(t, counts); len(got) != 2 || got[winKey{"new", time.Minute, cur}] != 0 {
		t.Errorf("a reset of a new key: GetCounters = %v, want two zeros", counts)
	}

	// Bad windows are refused before anything is sent; no sizes send
	// nothing.
	h.reset()
	err = r.Reset(ctx, ns, "k", []time.Duration{time.Minute, 1500 * time.Microsecond}, now)
	if !errors.Is(err, ErrInvalidWindow) || !errors.Is(err, strategy.ErrRejected) {
		t.Errorf("Reset of a 1.5ms window: err = %v, want ErrInvalidWindow", err)
	}
	if err := r.Reset(ctx, ns, "k", nil, now); err != nil {
		t.Errorf("Reset of no sizes: %v", err)
	}
	if process, pipelines, _ := h.get(); process != 0 || pipelines != 0 {
		t.Errorf("refused and empty resets sent %d commands and %d pipelines, want none", process, pipelines)
	}
}
