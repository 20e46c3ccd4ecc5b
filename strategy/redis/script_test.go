package redis

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// Undo never changes the decision: a hit is decided on the counts in
// doubles, as every store decides (0.1 + 0.1 + 0.1 is 0.30000000000000004,
// over a limit of 0.3), with undo or without; with undo, a hit its counts
// reject writes no counter.
func TestHitUndoDecidesAsWithout(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	hit := func(key string, value float64, undo bool) (float64, int) {
		t.Helper()
		counts, rejected, err := r.Hit(ctx, "undo", key, newID(), []strategy.WindowHit{
			{Size: size, Start: start, Value: value, Max: 0.3},
		}, undo)
		if err != nil {
			t.Fatal(err)
		}
		return counts[0].Current, rejected
	}
	for _, undo := range []bool{false, true} {
		key := fmt.Sprint("undo-", undo)
		hit(key, 0.1, undo)
		if cur, rejected := hit(key, 0.1, undo); cur != 0.2 || rejected != -1 {
			t.Errorf("undo %v: the second hit of 0.1 = %v, rejected %d; want 0.2, admitted", undo, cur, rejected)
		}
		tenth := 0.1
		want := tenth + 0.2 // counted with the penalty, in doubles
		if undo {
			want = 0.2
		}
		if cur, rejected := hit(key, 0.1, undo); cur != want || rejected != 0 {
			t.Errorf("undo %v: the third hit of 0.1 = %v, rejected %d; want %v, rejected", undo, cur, rejected, want)
		}
	}
	// Rejected again with undo: it reads and sets its marker, and writes
	// no counter.
	resetStats(t, c)
	if cur, rejected := hit("undo-true", 0.1, true); cur != 0.2 || rejected != 0 {
		t.Errorf("the fourth hit = %v, rejected %d; want 0.2, rejected", cur, rejected)
	}
	if want := map[string]int{"evalsha": 1, "mget": 1, "set": 1}; !maps.Equal(serverCalls(t, c), want) {
		t.Errorf("a rejected hit with undo ran %v, want %v", serverCalls(t, c), want)
	}
	checkWindows(t, r, "undo", "undo-true", []strategy.WindowHit{{Size: size, Start: start}}, 0.2)
}

// Windows that share a counter (the same size and start given twice) add
// up, as if each were applied in turn.
func TestHitWindowsSharingACounter(t *testing.T) {
	_, r := startStandalone(t)
	size := time.Minute
	start := window.Start(steadyNow().UnixNano(), size)
	windows := []strategy.WindowHit{
		{Size: size, Start: start, Value: 1, Max: math.Inf(1)},
		{Size: size, Start: start, Value: 2, Max: 2.5},
	}
	counts, rejected, err := r.Hit(testCtx(t), "shared", "k", newID(), windows, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []strategy.WindowCounts{{Current: 1}, {Current: 3}}; rejected != 1 || !slices.Equal(counts, want) {
		t.Errorf("Hit = %v, rejected %d; want %v, rejected 1", counts, rejected, want)
	}
	checkWindows(t, r, "shared", "k", windows[:1], 3)
	// With undo, the second window rejects (3+1+2 > 2.5) and neither
	// increment stays.
	counts, rejected, err = r.Hit(testCtx(t), "shared", "k", newID(), windows, true)
	if err != nil {
		t.Fatal(err)
	}
	if want := []strategy.WindowCounts{{Current: 3}, {Current: 3}}; rejected != 1 || !slices.Equal(counts, want) {
		t.Errorf("Hit with undo = %v, rejected %d; want %v, rejected 1", counts, rejected, want)
	}
	checkWindows(t, r, "shared", "k", windows[:1], 3)
}

// A counter that refuses its increment (it holds text, or is not a string)
// fails the push with an error that says how many refused, and does not
// stop the others, in a run of one counter (SET NX first) and in a run of
// several (MGET first) alike.
func TestPushRefusedIncrement(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	if err := c.Set(ctx, counterKeyOf(r, "refuse", "text", size, start), "many", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, counterKeyOf(r, "refuse", "hash", size, start), "f", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		keys    []string
		refused int
	}{
		{"alone", []string{"text"}, 1},
		{"among others", []string{"text", "a", "hash", "b", "b"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var diffs []window.Diff
			for _, k := range tc.keys {
				diffs = append(diffs, window.Diff{Key: k, Size: size, Start: start, Value: 1})
			}
			err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "refuse", Diffs: diffs})
			if err == nil || !strings.Contains(err.Error(), fmt.Sprint(tc.refused, " counters refused their increment")) {
				t.Errorf("err = %v, want %d counters refused", err, tc.refused)
			}
		})
	}
	// "a" once, "b" twice (a counter twice in one run adds up).
	for key, want := range map[string]float64{"a": 1, "b": 2} {
		if v, err := r.GetWindow(ctx, "refuse", key, size, start); err != nil || v != want {
			t.Errorf("%s = %v, %v; want %v", key, v, err, want)
		}
	}
	if got, _ := c.Get(ctx, counterKeyOf(r, "refuse", "text", size, start)).Result(); got != "many" {
		t.Errorf("the refused counter holds %q", got)
	}
}
