package redis

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// hitDiffs returns the diffs of a hit of key on windows: what a caller
// whose hit failed pushes as a batch of the hit's ID.
func hitDiffs(key string, windows []strategy.WindowHit) []window.Diff {
	diffs := make([]window.Diff, len(windows))
	for i, w := range windows {
		diffs[i] = window.Diff{Key: key, Size: w.Size, Start: w.Start, Value: w.Value}
	}
	return diffs
}

// hitWithID applies a hit and checks what it returns.
func hitWithID(t *testing.T, r *Store, ns, key, id string, windows []strategy.WindowHit, undo bool, want []strategy.WindowCounts, wantRejected int) {
	t.Helper()
	counts, rejected, err := r.Hit(testCtx(t), ns, key, id, windows, undo)
	if err != nil {
		t.Fatalf("hit %q: %v", id, err)
	}
	if rejected != wantRejected || !slices.Equal(counts, want) {
		t.Errorf("hit %q = %v, rejected %d; want %v, rejected %d", id, counts, rejected, want, wantRejected)
	}
}

// A hit with an ID, then a batch of that ID with the hit's diffs (the
// caller did not get the hit's reply): the hit counts once. A batch of
// another ID counts again.
func TestHitIDThenBatch(t *testing.T) {
	srv, r := startStandalone(t)
	ctx := testCtx(t)
	windows := []strategy.WindowHit{
		{Size: time.Minute, Start: futureStart(time.Minute), Value: 1, Max: math.Inf(1)},
		{Size: time.Hour, Start: futureStart(time.Hour), Value: 2.5, Max: math.Inf(1)},
	}
	id := newID()
	hitWithID(t, r, "hb", "k", id, windows, false, []strategy.WindowCounts{{Current: 1}, {Current: 2.5}}, -1)
	if got, want := keysOf(t, srv.Client(""), "*:push:*"), []string{r.dedupeKey(bucketOf("hb", "k"), 0, id)}; !slices.Equal(got, want) {
		t.Errorf("markers after the hit: %q, want %q", got, want)
	}

	batch := strategy.Batch{ID: id, Namespace: "hb", Diffs: hitDiffs("k", windows)}
	for attempt := range 2 {
		if err := r.PushDiffs(ctx, batch); err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		checkWindows(t, r, "hb", "k", windows, 1, 2.5)
	}

	batch.ID = newID()
	if err := r.PushDiffs(ctx, batch); err != nil {
		t.Fatal(err)
	}
	checkWindows(t, r, "hb", "k", windows, 2, 5)
}

// A batch of the ID of a hit that never reached Redis is applied, once; the
// hit itself, if it arrives after all, is then only read.
func TestBatchOfUnsentHitID(t *testing.T) {
	_, r := startStandalone(t)
	ctx := testCtx(t)
	windows := []strategy.WindowHit{
		{Size: time.Second, Start: futureStart(time.Second), Value: 1, Max: 10},
		{Size: time.Hour, Start: futureStart(time.Hour), Value: 1, Max: 10},
	}
	id := newID()
	batch := strategy.Batch{ID: id, Namespace: "unsent", Diffs: hitDiffs("k", windows)}
	for attempt := range 2 {
		if err := r.PushDiffs(ctx, batch); err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		checkWindows(t, r, "unsent", "k", windows, 1, 1)
	}
	hitWithID(t, r, "unsent", "k", id, windows, false, []strategy.WindowCounts{{Current: 1}, {Current: 1}}, -1)
	checkWindows(t, r, "unsent", "k", windows, 1, 1)
}

// The same hit ID sent twice: the hit is applied once, and the second call
// returns the counts as they are, with the decision taken on them (Kong's
// order, no increment, no undo).
func TestHitIDSentTwice(t *testing.T) {
	_, r := startStandalone(t)
	windows := []strategy.WindowHit{
		{Size: time.Minute, Start: futureStart(time.Minute), Value: 1, Max: 2},
		{Size: time.Hour, Start: futureStart(time.Hour), Value: 1, Max: 100},
	}
	two := func(a, b float64) []strategy.WindowCounts {
		return []strategy.WindowCounts{{Current: a}, {Current: b}}
	}
	ids := []string{newID(), newID(), newID(), newID()}
	hitWithID(t, r, "twice", "k", ids[0], windows, false, two(1, 1), -1)
	hitWithID(t, r, "twice", "k", ids[0], windows, false, two(1, 1), -1) // sent again
	checkWindows(t, r, "twice", "k", windows, 1, 1)
	hitWithID(t, r, "twice", "k", ids[1], windows, false, two(2, 2), -1)
	hitWithID(t, r, "twice", "k", ids[2], windows, false, two(3, 2), 0) // the minute rejects
	hitWithID(t, r, "twice", "k", ids[2], windows, false, two(3, 2), 0) // 3 > 2 still
	// The first hit again: decided on today's counts, which others raised.
	hitWithID(t, r, "twice", "k", ids[0], windows, false, two(3, 2), 0)
	checkWindows(t, r, "twice", "k", windows, 3, 2)

	// With undo: a hit sent again takes nothing back, as it added nothing.
	hitWithID(t, r, "twice", "k", ids[3], windows, true, two(3, 2), 0)
	hitWithID(t, r, "twice", "k", ids[3], windows, true, two(3, 2), 0)
	checkWindows(t, r, "twice", "k", windows, 3, 2)

	// A rejected hit that was undone comes back admitted when the counts
	// it is decided on are within the limits.
	windows[0].Max = 1
	undone := newID()
	hitWithID(t, r, "twice", "undone", newID(), windows, true, two(1, 1), -1)
	hitWithID(t, r, "twice", "undone", undone, windows, true, two(1, 1), 0)
	hitWithID(t, r, "twice", "undone", undone, windows, true, two(1, 1), -1)
	checkWindows(t, r, "twice", "undone", windows, 1, 1)
}

// A hit's marker: none without an ID; with one, the key of group 0 of the
// hit's bucket, living a minute, or as long as the hit's counters when
// they live longer. IDs of more than 256 bytes are refused.
func TestHitIDMarker(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	second := []strategy.WindowHit{{Size: time.Second, Start: futureStart(time.Second), Value: 1, Max: math.Inf(1)}}
	hour := []strategy.WindowHit{second[0], {Size: time.Hour, Start: futureStart(time.Hour), Value: 1, Max: math.Inf(1)}}

	if _, _, err := r.Hit(ctx, "marker", "none", "", hour, false); err != nil {
		t.Fatal(err)
	}
	if keys := keysOf(t, c, "*:push:*"); len(keys) != 0 {
		t.Errorf("a hit without an ID wrote markers %q", keys)
	}

	for _, tc := range []struct {
		name    string
		windows []strategy.WindowHit
		min     time.Duration
	}{
		{"a second", second, time.Minute},
		{"a second and an hour", hour, strategy.MaxHitIDLife},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := newID()
			before := time.Now().UnixMilli()
			if _, _, err := r.Hit(ctx, "marker", "k", id, tc.windows, false); err != nil {
				t.Fatal(err)
			}
			after := time.Now().UnixMilli()
			expiry := func(key string) int64 {
				ms, err := c.Do(ctx, "PEXPIRETIME", key).Int64()
				if err != nil {
					t.Fatal(err)
				}
				return ms
			}
			marker := expiry(r.dedupeKey(bucketOf("marker", "k"), 0, id))
			last := tc.windows[len(tc.windows)-1]
			counter := expiry(counterKeyOf(r, "marker", "k", last.Size, last.Start))
			// At least tc.min and as long as the counter, but never past
			// the longest a marker lives. Absolute times, so that a slow
			// machine cannot make it look short.
			if marker < before+tc.min.Milliseconds() || marker > after+strategy.MaxHitIDLife.Milliseconds() ||
				marker < min(counter, before+strategy.MaxHitIDLife.Milliseconds()) {
				t.Errorf("the marker expires %dms after the hit, want about %v (the counter: %dms)", marker-before, tc.min, counter-before)
			}
		})
	}

	ws := slices.Clone(second)
	ws[0].Start = futureStart(time.Hour) // a new counter
	if _, _, err := r.Hit(ctx, "marker", "long", strings.Repeat("i", 256), ws, false); err != nil {
		t.Errorf("an ID of 256 bytes: %v", err)
	}
	_, rejected, err := r.Hit(ctx, "marker", "too-long", strings.Repeat("i", 257), ws, false)
	if !errors.Is(err, strategy.ErrRejected) || rejected != -1 || !strings.Contains(err.Error(), "257 bytes") {
		t.Errorf("an ID of 257 bytes: rejected %d, err = %v; want ErrRejected", rejected, err)
	}
	if keys := keysOf(t, c, "*too-long*"); len(keys) != 0 {
		t.Errorf("a refused hit wrote %q", keys)
	}
	if keys := keysOf(t, c, "*:push:*"+strings.Repeat("i", 257)); len(keys) != 0 {
		t.Errorf("a refused hit wrote %q", keys)
	}
}
