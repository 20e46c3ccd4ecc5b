package strategytest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// testRateBatch runs the tests of strategy.RateBatcher if the store
// implements it: rates decided within batches of hits, and pushed as a
// Batch's Rates. Every decision is checked against the GCRA at the
// store's own clock (RateReply.Now), so the tests hold however slow the
// machine is.
func testRateBatch(t *testing.T, h Harness) {
	rb, ok := h.open(t).(strategy.RateBatcher)
	if !ok {
		t.Log("the store decides no rates in batches (it is not a strategy.RateBatcher): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, strategy.RateBatcher)
	}{
		{"RateThenLimits", testRateBatchRateThenLimits},
		{"Undo", testRateBatchUndo},
		{"ManyKeys", testRateBatchManyKeys},
		{"BatchThenPush", testRateBatchThenPush},
		{"PushThenBatch", testRateBatchPushThenBatch},
		{"BadInput", testRateBatchBadInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, rb) })
	}
}

// rateBatchCase is a batchCase whose store decides rates in batches, with
// a rateCase on the same namespace to read TATs.
type rateBatchCase struct {
	*batchCase
	rc *rateCase
}

func newRateBatchCase(t *testing.T, s strategy.RateBatcher) *rateBatchCase {
	c := &rateBatchCase{batchCase: newBatchCase(t, s), rc: newRateCase(t, s)}
	c.rc.ns = c.ns
	return c
}

// rateHit is a hit of key under r, with the limits of windows.
func rateHit(key string, r strategy.RateRequest, undo bool, windows ...strategy.WindowHit) strategy.HitRequest {
	return strategy.HitRequest{Key: key, Windows: windows, Undo: undo, Rate: &r}
}

// checkRates checks each result's rate against the GCRA, from the TAT the
// hits of its key found (from, by key, updated as the hits go): a hit
// that its rate admitted and no window rejected moves the TAT; any other
// leaves it. wantOK lists whether each rate should admit its hit.
func checkRates(t *testing.T, hits []strategy.HitRequest, results []strategy.HitResult, from map[string]int64, wantOK []bool) {
	t.Helper()
	for i, h := range hits {
		r, rep := h.Rate, results[i].Rate
		if rep.Now <= 0 {
			t.Fatalf("hits[%d] (key %q): the rate's answer has no clock: %+v", i, h.Key, rep)
		}
		before := from[h.Key]
		due := max(before, rep.Now) + int64(r.Increment)
		ok := due-rep.Now <= int64(r.Tolerance)
		want := before
		if ok && results[i].Rejected < 0 {
			want = due
		}
		if rep.OK != ok || rep.TAT != want || ok != wantOK[i] {
			t.Fatalf("hits[%d] (key %q): from TAT %d at now %d: got ok %v, TAT %d; want ok %v (the test expects %v), TAT %d",
				i, h.Key, before, rep.Now, rep.OK, rep.TAT, ok, wantOK[i], want)
		}
		from[h.Key] = want
	}
}

// rejections returns each result's Rejected.
func rejections(results []strategy.HitResult) []int {
	r := make([]int, len(results))
	for i := range results {
		r[i] = results[i].Rejected
	}
	return r
}

// currents returns the current count of each result's first window, or
// -1 for a hit without windows.
func currents(results []strategy.HitResult) []float64 {
	c := make([]float64, len(results))
	for i := range results {
		c[i] = -1
		if len(results[i].Counts) > 0 {
			c[i] = results[i].Counts[0].Current
		}
	}
	return c
}

// testRateBatchRateThenLimits checks the order of a request under a rate
// and a limit, in one batch: the rate first; a hit it refuses counts in
// no window; one a limit then rejects gives its turn back, so that the
// next hit finds the turn free; hits without windows are decided by the
// rate alone.
func testRateBatchRateThenLimits(t *testing.T, s strategy.RateBatcher) {
	c := newRateBatchCase(t, s)
	r := req(hour, 2, 1) // three at once
	limit := func() strategy.WindowHit { return c.w(hour, 1, 2, 0) }
	hits := []strategy.HitRequest{
		rateHit("k", r, false, limit()), // rate 1, count 1
		rateHit("k", r, false, limit()), // rate 2, count 2
		rateHit("k", r, false, limit()), // rate 3, count 3 > 2: rejected, turn back
		rateHit("k", r, false, limit()), // rate 3 again, count 4: rejected, turn back
		rateHit("k", r, false),          // rate 3, no limit: admitted
		rateHit("k", r, false),          // rate 4 > burst: refused
		rateHit("k", r, false, limit()), // refused: the limit only read
	}
	res := c.batch(c.ns, newID(), hits)
	checkRates(t, hits, res, map[string]int64{}, []bool{true, true, true, true, true, false, false})
	if got, want := fmt.Sprint(rejections(res)), fmt.Sprint([]int{-1, -1, 0, 0, -1, -1, -1}); got != want {
		t.Fatalf("rejected windows: got %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(currents(res)), fmt.Sprint([]float64{1, 2, 3, 4, -1, -1, 4}); got != want {
		t.Fatalf("the limit's current counts: got %s, want %s", got, want)
	}
	c.expect("after the batch", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: 4})
	if got, want := c.rc.tat("k", hour), res[4].Rate.TAT; got != want {
		t.Fatalf("the store's TAT after the batch: %d, want %d (the third admitted turn)", got, want)
	}
}

// testRateBatchUndo checks a hit with undo that a limit rejects after its
// rate admitted it: neither its windows nor its rate keep anything.
func testRateBatchUndo(t *testing.T, s strategy.RateBatcher) {
	c := newRateBatchCase(t, s)
	r := req(hour, 5, 1)
	hits := []strategy.HitRequest{
		rateHit("k", r, true, c.w(hour, 1, 1, 0), c.w(day, 1, 10, 0)),
		rateHit("k", r, true, c.w(hour, 1, 1, 0), c.w(day, 1, 10, 0)), // rejected by the hour: undone
		rateHit("k", r, true, c.w(hour, 0.5, 10, 0)),
	}
	res := c.batch(c.ns, newID(), hits)
	checkRates(t, hits, res, map[string]int64{}, []bool{true, true, true})
	if got, want := fmt.Sprint(rejections(res)), fmt.Sprint([]int{-1, 0, -1}); got != want {
		t.Fatalf("rejected windows: got %s, want %s", got, want)
	}
	if got := res[1].Counts; got[0].Current != 1 || got[1].Current != 1 {
		t.Fatalf("the undone hit's counts: got %v, want the hour and the day at 1, as it found them", got)
	}
	c.expect("after the batch", "k", []time.Duration{hour, day}, counts{{"k", hour, cur(c.at, hour)}: 1.5, {"k", day, cur(c.at, day)}: 1})
	if got, want := c.rc.tat("k", hour), res[2].Rate.TAT; got != want || res[2].Rate.TAT != res[0].Rate.TAT+int64(r.Increment) {
		t.Fatalf("the TAT after two admitted turns and one given back: %d (the last hit's answer %d), want %d",
			got, res[2].Rate.TAT, res[0].Rate.TAT+int64(r.Increment))
	}
}

// testRateBatchManyKeys checks a batch of many keys' rates, spread over
// a Cluster's slots, each key's hits seeing only its own.
func testRateBatchManyKeys(t *testing.T, s strategy.RateBatcher) {
	c := newRateBatchCase(t, s)
	r := req(hour, 1, 1) // two at once
	var hits []strategy.HitRequest
	var want []bool
	for round := range 3 {
		for k := range 40 {
			hits = append(hits, rateHit(fmt.Sprintf("key-%d", k), r, false, c.w(hour, 1, 10, 0)))
			want = append(want, round < 2)
		}
	}
	res := c.batch(c.ns, newID(), hits)
	checkRates(t, hits, res, map[string]int64{}, want)
	for k := range 40 {
		key := fmt.Sprintf("key-%d", k)
		c.expect("after the batch", key, []time.Duration{hour}, counts{{key, hour, cur(c.at, hour)}: 2})
	}
}

// testRateBatchThenPush checks the ID rule for rates: a Batch that
// carries the rates of an applied HitBatch, under its ID, moves no TAT.
func testRateBatchThenPush(t *testing.T, s strategy.RateBatcher) {
	c := newRateBatchCase(t, s)
	r := req(hour, 3, 1)
	id := newID()
	hits := []strategy.HitRequest{rateHit("a", r, false, c.w(hour, 1, 10, 0)), rateHit("b", r, false)}
	res := c.batch(c.ns, id, hits)
	checkRates(t, hits, res, map[string]int64{}, []bool{true, true})
	retry := strategy.Batch{ID: id, Namespace: c.ns,
		Diffs: []window.Diff{{Key: "a", Size: hour, Start: cur(c.at, hour), Value: 1}},
		Rates: []strategy.RateDiff{{Key: "a", Window: hour, Increment: r.Increment}, {Key: "b", Window: hour, Increment: r.Increment}}}
	if err := c.s.PushDiffs(c.ctx, retry); err != nil {
		t.Fatalf("pushing the batch's retry: %v", err)
	}
	for i, key := range []string{"a", "b"} {
		if got := c.rc.tat(key, hour); got != res[i].Rate.TAT {
			t.Fatalf("key %s: TAT %d after the retry of an applied batch, want %d, as the batch left it", key, got, res[i].Rate.TAT)
		}
	}
	c.expect("after the retry", "a", []time.Duration{hour}, counts{{"a", hour, cur(c.at, hour)}: 1})
}

// testRateBatchPushThenBatch checks the other side of the ID rule: a
// Batch of rates pushed first takes its turns, forced past the burst,
// and the HitBatch of its ID then moves nothing and decides on the TAT as
// it is.
func testRateBatchPushThenBatch(t *testing.T, s strategy.RateBatcher) {
	c := newRateBatchCase(t, s)
	r := req(hour, 0, 1) // one at a time
	id := newID()
	push := strategy.Batch{ID: id, Namespace: c.ns,
		Rates: []strategy.RateDiff{{Key: "a", Window: hour, Increment: r.Increment}, {Key: "a", Window: hour, Increment: r.Increment}}}
	if err := c.s.PushDiffs(c.ctx, push); err != nil {
		t.Fatalf("pushing rates: %v", err)
	}
	pushed := c.rc.tat("a", hour)
	// Two forced turns: the TAT is about two hours ahead, past any burst.
	if ahead := time.Duration(pushed - time.Now().UnixNano()); ahead < 2*hour-time.Minute || ahead > 2*hour+time.Minute {
		t.Fatalf("TAT after two forced turns of an hour: %v ahead, want about 2h", ahead)
	}
	if err := c.s.PushDiffs(c.ctx, push); err != nil {
		t.Fatalf("pushing the rates again: %v", err)
	}
	if got := c.rc.tat("a", hour); got != pushed {
		t.Fatalf("the same Batch pushed twice moved the TAT from %d to %d", pushed, got)
	}
	hits := []strategy.HitRequest{rateHit("a", strategy.RateRequest{Window: hour, Increment: r.Increment, Tolerance: 3 * hour}, false)}
	res := c.batch(c.ns, id, hits)
	if rep := res[0].Rate; !rep.OK || rep.TAT != pushed {
		t.Fatalf("a HitBatch whose ID was pushed first: got %+v, want admitted on the TAT as it is (%d), moving nothing", rep, pushed)
	}
	if got := c.rc.tat("a", hour); got != pushed {
		t.Fatalf("the HitBatch of a pushed ID moved the TAT from %d to %d", pushed, got)
	}
}

// testRateBatchBadInput checks that a hit with a bad rate is
// refused alone, and that a Batch with a bad rate is refused whole,
// before anything changes.
func testRateBatchBadInput(t *testing.T, s strategy.RateBatcher) {
	c := newRateBatchCase(t, s)
	good := req(hour, 1, 1)
	zeroTol := good
	zeroTol.Tolerance = 0
	hits := []strategy.HitRequest{
		rateHit("a", good, false),
		rateHit("c", zeroTol, false),
		{Key: "d"}, // no rate and no window
	}
	results := make([]strategy.HitResult, len(hits))
	c.bs.HitBatch(c.ctx, c.ns, newID(), hits, results)
	if results[0].Err != nil || !results[0].Rate.OK {
		t.Fatalf("the good hit beside bad ones: %+v", results[0])
	}
	for i := 1; i < len(hits); i++ {
		if !errors.Is(results[i].Err, strategy.ErrRejected) {
			t.Fatalf("hits[%d]: got error %v, want one that wraps ErrRejected", i, results[i].Err)
		}
	}
	bad := strategy.Batch{ID: newID(), Namespace: c.ns,
		Diffs: []window.Diff{{Key: "e", Size: hour, Start: cur(c.at, hour), Value: 1}},
		Rates: []strategy.RateDiff{{Key: "e", Window: hour, Increment: time.Nanosecond}}}
	if err := c.s.PushDiffs(c.ctx, bad); !errors.Is(err, strategy.ErrRejected) {
		t.Fatalf("a Batch with a rate of 1ns: got %v, want an error that wraps ErrRejected", err)
	}
	c.expect("after the refused Batch", "e", []time.Duration{hour}, counts{})
}
