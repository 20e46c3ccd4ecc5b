package strategytest

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

var inf = math.Inf(1)

// testHit runs the tests of strategy.Hitter if the store implements it.
// A store without synchronous hits is fine: the app refuses sync_rate 0
// with it when a config loads.
func testHit(t *testing.T, h Harness) {
	hs, ok := h.open(t).(strategy.Hitter)
	if !ok {
		t.Log("the store has no synchronous hits (it is not a strategy.Hitter): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, strategy.Hitter)
	}{
		{"Order", testHitOrder},
		{"Weight", testHitWeight},
		{"Undo", testHitUndo},
		{"InfiniteMax", testHitInfiniteMax},
		{"SameIDTwice", testHitSameIDTwice},
		{"HitThenBatch", testHitThenBatch},
		{"BatchThenHit", testBatchThenHit},
		{"AppliedIDDecidesOnCounts", testHitAppliedIDDecides},
		{"Concurrent", testHitConcurrent},
		{"RejectsInput", testHitRejectsInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, hs) })
	}
}

// hitCase is a store, a context and a namespace of its own, with the time
// a test chose its windows at.
type hitCase struct {
	t   *testing.T
	s   strategy.Hitter
	ctx context.Context
	ns  string
	now time.Time
	at  int64
}

func newHitCase(t *testing.T, s strategy.Hitter) *hitCase {
	now := steadyNow()
	return &hitCase{t: t, s: s, ctx: testContext(t), ns: unique("hit"), now: now, at: now.UnixNano()}
}

// w returns a window of a hit, in the current window of its size.
func (c *hitCase) w(size time.Duration, value, limit, weight float64) strategy.WindowHit {
	return strategy.WindowHit{Size: size, Start: cur(c.at, size), Value: value, Max: limit, Weight: weight}
}

// hit applies a hit and checks what the store answered.
func (c *hitCase) hit(key, id string, windows []strategy.WindowHit, undo bool, want []strategy.WindowCounts, wantRejected int) {
	c.t.Helper()
	got, rejected, err := c.s.Hit(c.ctx, c.ns, key, id, windows, undo)
	if err != nil {
		c.t.Fatalf("hitting key %q: %v", key, err)
	}
	if rejected != wantRejected || !slices.Equal(got, want) {
		c.t.Fatalf("hitting key %q: got counts %v and rejected %d, want %v and %d", key, got, rejected, want, wantRejected)
	}
}

// expect checks the store's counters of a key, as a fetch sees them.
func (c *hitCase) expect(what, key string, sizes []time.Duration, want counts) {
	c.t.Helper()
	assertCounts(c.t, what, fetch(c.t, c.ctx, c.s, c.ns, []string{key}, sizes, c.now), want)
}

// wc is shorthand for one window's counts.
func wc(current, previous float64) strategy.WindowCounts {
	return strategy.WindowCounts{Current: current, Previous: previous}
}

// testHitOrder checks Kong's order: windows are incremented in the order
// given until one rejects the hit; the windows after it are only read.
func testHitOrder(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	key := "order{1}:\x00" // keys reach the store as data here too
	ws := []strategy.WindowHit{c.w(hour, 1, inf, 0), c.w(twoHours, 1, 2, 0), c.w(day, 1, inf, 0)}
	c.hit(key, "", ws, false, []strategy.WindowCounts{wc(1, 0), wc(1, 0), wc(1, 0)}, -1)
	c.hit(key, "", ws, false, []strategy.WindowCounts{wc(2, 0), wc(2, 0), wc(2, 0)}, -1)
	c.hit(key, "", ws, false, []strategy.WindowCounts{wc(3, 0), wc(3, 0), wc(2, 0)}, 1)
	sizes := []time.Duration{hour, twoHours, day}
	c.expect("after three hits", key, sizes, counts{
		{key, hour, cur(c.at, hour)}:         3,
		{key, twoHours, cur(c.at, twoHours)}: 3, // the rejecting window counts the hit
		{key, day, cur(c.at, day)}:           2, // only read
	})

	// When the first window rejects, the others are not even created.
	first := "first"
	ws = []strategy.WindowHit{c.w(hour, 1, 0, 0), c.w(twoHours, 1, inf, 0)}
	c.hit(first, "", ws, false, []strategy.WindowCounts{wc(1, 0), wc(0, 0)}, 0)
	c.expect("after a hit the first window rejected", first, sizes, counts{{first, hour, cur(c.at, hour)}: 1})
}

// testHitWeight checks that the rate is current + previous*Weight.
func testHitWeight(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	for _, key := range []string{"sliding", "fixed"} {
		push(t, c.ctx, s, c.ns, window.Diff{Key: key, Size: hour, Start: prev(c.at, hour), Value: 4})
	}
	// Rates 1 + 4*0.25 = 2, then 3 > 2.5.
	sliding := []strategy.WindowHit{c.w(hour, 1, 2.5, 0.25)}
	c.hit("sliding", "", sliding, false, []strategy.WindowCounts{wc(1, 4)}, -1)
	c.hit("sliding", "", sliding, false, []strategy.WindowCounts{wc(2, 4)}, 0)
	// A fixed window gives the previous one no weight: 1, 2, then 3 > 2.5.
	fixed := []strategy.WindowHit{c.w(hour, 1, 2.5, 0)}
	c.hit("fixed", "", fixed, false, []strategy.WindowCounts{wc(1, 4)}, -1)
	c.hit("fixed", "", fixed, false, []strategy.WindowCounts{wc(2, 4)}, -1)
	c.hit("fixed", "", fixed, false, []strategy.WindowCounts{wc(3, 4)}, 0)
	// The full weight counts all of it: 1 + 4 > 2.5 at once.
	push(t, c.ctx, s, c.ns, window.Diff{Key: "full", Size: hour, Start: prev(c.at, hour), Value: 4})
	c.hit("full", "", []strategy.WindowHit{c.w(hour, 1, 2.5, 1)}, false, []strategy.WindowCounts{wc(1, 4)}, 0)
}

// testHitUndo checks that with undo the increments of a rejected hit are
// taken back, in every window that had them, before Hit returns.
func testHitUndo(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	key, sizes := "undo", []time.Duration{hour, twoHours, day}
	ws := []strategy.WindowHit{c.w(hour, 1, inf, 0), c.w(twoHours, 1, 1, 0), c.w(day, 1, inf, 0)}
	c.hit(key, "", ws, true, []strategy.WindowCounts{wc(1, 0), wc(1, 0), wc(1, 0)}, -1)
	c.hit(key, "", ws, true, []strategy.WindowCounts{wc(1, 0), wc(1, 0), wc(1, 0)}, 1)
	at := func(size time.Duration) win { return win{key, size, cur(c.at, size)} }
	c.expect("after a rejected hit with undo", key, sizes, counts{at(hour): 1, at(twoHours): 1, at(day): 1})
	// Without undo the rejected hit stays counted.
	c.hit(key, "", ws, false, []strategy.WindowCounts{wc(2, 0), wc(2, 0), wc(1, 0)}, 1)
	c.expect("after a rejected hit without undo", key, sizes, counts{at(hour): 2, at(twoHours): 2, at(day): 1})
}

// testHitInfiniteMax checks that math.Inf(1) never rejects.
func testHitInfiniteMax(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	push(t, c.ctx, s, c.ns, window.Diff{Key: "k", Size: hour, Start: prev(c.at, hour), Value: 1e6})
	ws := []strategy.WindowHit{c.w(hour, 1000, inf, 1), c.w(day, 0.5, inf, 0)}
	for i := 1; i <= 5; i++ {
		c.hit("k", "", ws, false, []strategy.WindowCounts{wc(1000*float64(i), 1e6), wc(0.5*float64(i), 0)}, -1)
	}
}

// testHitSameIDTwice checks that a hit sent twice under one ID counts
// once, while hits of other IDs, or of none, count each time.
func testHitSameIDTwice(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	ws := []strategy.WindowHit{c.w(hour, 1, 10, 0)}
	id := newID()
	c.hit("k", id, ws, false, []strategy.WindowCounts{wc(1, 0)}, -1)
	c.hit("k", id, ws, false, []strategy.WindowCounts{wc(1, 0)}, -1)
	c.expect("after one hit sent twice", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: 1})
	c.hit("k", newID(), ws, false, []strategy.WindowCounts{wc(2, 0)}, -1)
	c.hit("k", "", ws, false, []strategy.WindowCounts{wc(3, 0)}, -1)
	c.hit("k", "", ws, false, []strategy.WindowCounts{wc(4, 0)}, -1)
	c.expect("after hits of other IDs and of none", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: 4})
}

// testHitThenBatch checks the hit ID rule when the hit was applied: the
// batch that carries its diffs under its ID applies nothing.
func testHitThenBatch(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	id := newID()
	c.hit("k", id, []strategy.WindowHit{c.w(hour, 1, 10, 0)}, false, []strategy.WindowCounts{wc(1, 0)}, -1)
	d := window.Diff{Key: "k", Size: hour, Start: cur(c.at, hour), Value: 1}
	if err := s.PushDiffs(c.ctx, strategy.Batch{ID: id, Namespace: c.ns, Diffs: []window.Diff{d}}); err != nil {
		t.Fatalf("pushing the hit's diffs under its ID: %v", err)
	}
	c.expect("after the hit and its batch", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: 1})
	push(t, c.ctx, s, c.ns, d)
	c.expect("after the same diff under a new ID", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: 2})
}

// testBatchThenHit checks the hit ID rule when the batch came first (the
// hit reached the store only after its diffs were pushed): the hit
// applies nothing and answers with the counts as they are.
func testBatchThenHit(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	id := newID()
	d := window.Diff{Key: "k", Size: hour, Start: cur(c.at, hour), Value: 1}
	if err := s.PushDiffs(c.ctx, strategy.Batch{ID: id, Namespace: c.ns, Diffs: []window.Diff{d}}); err != nil {
		t.Fatalf("pushing a hit's diffs under its ID: %v", err)
	}
	c.hit("k", id, []strategy.WindowHit{c.w(hour, 1, 10, 0)}, false, []strategy.WindowCounts{wc(1, 0)}, -1)
	c.expect("after the batch and its hit", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: 1})
}

// testHitAppliedIDDecides checks that a hit whose ID was applied decides
// on the counts as they are, incrementing and undoing nothing.
func testHitAppliedIDDecides(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	sizes := []time.Duration{hour}

	// Over the limit already: the repeated hit is rejected, adds nothing.
	id := newID()
	d := window.Diff{Key: "over", Size: hour, Start: cur(c.at, hour), Value: 3}
	if err := s.PushDiffs(c.ctx, strategy.Batch{ID: id, Namespace: c.ns, Diffs: []window.Diff{d}}); err != nil {
		t.Fatalf("pushing under an ID: %v", err)
	}
	c.hit("over", id, []strategy.WindowHit{c.w(hour, 1, 2.5, 0)}, false, []strategy.WindowCounts{wc(3, 0)}, 0)
	c.hit("over", id, []strategy.WindowHit{c.w(hour, 1, 2.5, 0)}, true, []strategy.WindowCounts{wc(3, 0)}, 0)
	c.expect("after hits of an applied ID", "over", sizes, counts{{"over", hour, cur(c.at, hour)}: 3})

	// A rejected hit that was undone comes back admitted: its count is 0.
	id = newID()
	ws := []strategy.WindowHit{c.w(hour, 1, 0.5, 0)}
	c.hit("undone", id, ws, true, []strategy.WindowCounts{wc(0, 0)}, 0)
	c.hit("undone", id, ws, true, []strategy.WindowCounts{wc(0, 0)}, -1)
	c.hit("undone", id, ws, false, []strategy.WindowCounts{wc(0, 0)}, -1)
	got := fetch(t, c.ctx, s, c.ns, []string{"undone"}, sizes, c.now)
	for w, v := range got {
		if v != 0 {
			t.Errorf("after an undone hit sent again, counter %v = %v, want 0 or omitted", w, v)
		}
	}
}

// testHitConcurrent checks that concurrent hits of one key are atomic:
// each sees its own count, none is lost, and exactly Max are admitted.
func testHitConcurrent(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	const workers, hits, limit = 8, 25, 100
	ws := []strategy.WindowHit{c.w(hour, 1, limit, 0)}
	var (
		mu       sync.Mutex
		seen     []float64
		admitted int
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for range hits {
				got, rejected, err := s.Hit(c.ctx, c.ns, "k", "", ws, false)
				if err != nil {
					t.Errorf("hitting: %v", err)
					return
				}
				mu.Lock()
				seen = append(seen, got[0].Current)
				if rejected < 0 {
					admitted++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.Sort(seen)
	for i, v := range seen {
		if v != float64(i+1) {
			t.Fatalf("concurrent hits saw counts %v, want each of 1 to %d once", seen, workers*hits)
		}
	}
	if admitted != limit {
		t.Errorf("%d of %d concurrent hits were admitted, want %d", admitted, workers*hits, limit)
	}
	c.expect("after concurrent hits", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: workers * hits})
}

// testHitRejectsInput checks that input no store can take is refused with
// an error that wraps strategy.ErrRejected, before anything is applied.
func testHitRejectsInput(t *testing.T, s strategy.Hitter) {
	c := newHitCase(t, s)
	good := c.w(hour, 1, inf, 0)
	with := func(change func(*strategy.WindowHit)) []strategy.WindowHit {
		bad := good
		change(&bad)
		return []strategy.WindowHit{good, bad} // the good window comes first
	}
	cases := []struct {
		name    string
		windows []strategy.WindowHit
	}{
		{"no windows", nil},
		{"17 windows", slices.Repeat([]strategy.WindowHit{good}, 17)},
		{"NaN value", with(func(w *strategy.WindowHit) { w.Value = math.NaN() })},
		{"infinite value", with(func(w *strategy.WindowHit) { w.Value = inf })},
		{"negative infinite value", with(func(w *strategy.WindowHit) { w.Value = math.Inf(-1) })},
		{"negative weight", with(func(w *strategy.WindowHit) { w.Weight = -0.5 })},
		{"weight above 1", with(func(w *strategy.WindowHit) { w.Weight = 1.5 })},
		{"NaN weight", with(func(w *strategy.WindowHit) { w.Weight = math.NaN() })},
		{"NaN max", with(func(w *strategy.WindowHit) { w.Max = math.NaN() })},
		{"zero size", with(func(w *strategy.WindowHit) { w.Size, w.Start = 0, 0 })},
		{"negative size", with(func(w *strategy.WindowHit) { w.Size = -hour })},
		{"misaligned start", with(func(w *strategy.WindowHit) { w.Start += int64(time.Millisecond) })},
	}
	var keys []string
	for _, tc := range cases {
		key := "bad: " + tc.name
		keys = append(keys, key)
		_, _, err := s.Hit(c.ctx, c.ns, key, newID(), tc.windows, false)
		if !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("%s: got error %v, want one that wraps ErrRejected", tc.name, err)
		}
	}
	got := fetch(t, c.ctx, s, c.ns, keys, []time.Duration{hour}, c.now)
	assertCounts(t, "after refused hits", got, counts{})
}
