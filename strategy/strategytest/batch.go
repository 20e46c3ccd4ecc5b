package strategytest

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// testHitBatch runs the tests of strategy.BatchHitter if the store
// implements it. A Hitter without batches is fine: a coalescer then sends
// its hits one at a time.
func testHitBatch(t *testing.T, h Harness) {
	bs, ok := h.open(t).(strategy.BatchHitter)
	if !ok {
		t.Log("the store has no batches of synchronous hits (it is not a strategy.BatchHitter): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, strategy.BatchHitter)
	}{
		{"AsHitsOneByOne", testBatchAsHits},
		{"AcrossWindows", testBatchAcrossWindows},
		{"BatchThenPush", testBatchThenPush},
		{"SameBatchTwice", testBatchTwice},
		{"PushThenBatch", testPushThenBatch},
		{"SpillPastOneGroup", testBatchSpill},
		{"BadHits", testBatchBadHits},
		{"Concurrent", testBatchConcurrent},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, bs) })
	}
}

// batchCase is a hitCase whose store takes batches.
type batchCase struct {
	*hitCase
	bs strategy.BatchHitter
}

func newBatchCase(t *testing.T, s strategy.BatchHitter) *batchCase {
	return &batchCase{newHitCase(t, s), s}
}

// batch applies hits in one HitBatch and returns the results, failing the
// test if any hit failed.
func (c *batchCase) batch(ns, id string, hits []strategy.HitRequest) []strategy.HitResult {
	c.t.Helper()
	results := make([]strategy.HitResult, len(hits))
	c.bs.HitBatch(c.ctx, ns, id, hits, results)
	for i, r := range results {
		if r.Err != nil {
			c.t.Fatalf("HitBatch of %d hits: hits[%d] (key %q): %v", len(hits), i, hits[i].Key, r.Err)
		}
	}
	return results
}

// oneByOne sends hits one at a time with Hit, each with an ID of its own,
// and returns what the store answered, as HitBatch's results.
func (c *batchCase) oneByOne(ns string, hits []strategy.HitRequest) []strategy.HitResult {
	c.t.Helper()
	results := make([]strategy.HitResult, len(hits))
	for i, h := range hits {
		counts, rejected, err := c.s.Hit(c.ctx, ns, h.Key, newID(), h.Windows, h.Undo)
		if err != nil {
			c.t.Fatalf("hits[%d] (key %q): %v", i, h.Key, err)
		}
		results[i] = strategy.HitResult{Counts: counts, Rejected: rejected}
	}
	return results
}

// sameResults fails the test unless a batch's results equal those of the
// same hits sent one by one.
func sameResults(t *testing.T, what string, hits []strategy.HitRequest, got, want []strategy.HitResult) {
	t.Helper()
	var problems []string
	for i := range hits {
		g, w := got[i], want[i]
		if g.Rejected != w.Rejected || !slices.Equal(g.Counts, w.Counts) {
			problems = append(problems, fmt.Sprintf("hits[%d] %s: got counts %v and rejected %d, want %v and %d",
				i, describe(hits[i]), g.Counts, g.Rejected, w.Counts, w.Rejected))
		}
	}
	if len(problems) > 0 {
		t.Errorf("%s: %d of %d hits differ from the same hits one by one:\n\t%s", what, len(problems), len(hits), strings.Join(problems, "\n\t"))
	}
}

// describe shows a hit in a failure message.
func describe(h strategy.HitRequest) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key %q undo %v:", h.Key, h.Undo)
	for _, w := range h.Windows {
		fmt.Fprintf(&b, " [%v@%d +%v max %v weight %v]", w.Size, w.Start, w.Value, w.Max, w.Weight)
	}
	return b.String()
}

// diffsOf returns the diffs that carry hits: one per window of each, of
// the hit's Value, as a caller pushes the hits of a failed batch (here
// whatever the hits' decisions, which only adds diffs).
func diffsOf(hits []strategy.HitRequest) []window.Diff {
	var diffs []window.Diff
	for _, h := range hits {
		for _, w := range h.Windows {
			diffs = append(diffs, window.Diff{Key: h.Key, Size: w.Size, Start: w.Start, Value: w.Value})
		}
	}
	return diffs
}

// nonZero drops the counters that hold 0: a store may hold a counter at 0
// where another never made it (a hit taken back, say).
func nonZero(c counts) counts {
	for w, v := range c {
		if v == 0 {
			delete(c, w)
		}
	}
	return c
}

// batchSizes are the window sizes of the batch tests: those of the hit
// tests, which roll over together.
var batchSizes = []time.Duration{hour, twoHours, day}

// testBatchAsHits checks, on random batches, that HitBatch decides and
// counts exactly as the same hits sent one at a time with Hit: several
// keys, a key hit several times in a batch, one to three windows of
// fixed or sliding weight, undo, costs, zero values (reads), and limits of
// -Inf (count_status peeks), +Inf and numbers, near the counts and far
// from them; then batches of whole values only, which a store may decide
// at once while they stay under their limits. The values are binary
// fractions, so every store sums them exactly, in any order.
func testBatchAsHits(t *testing.T, s strategy.BatchHitter) {
	c := newBatchCase(t, s)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	t.Logf("seed %d", seed)
	batchNS, hitNS := c.ns, unique("hits")
	keys := []string{"a", "b{1}", "c:\x00", "d", "e"}
	wholeKeys := []string{"f", "g{2}", "h", "i", "j", "k"}

	// The same previous windows in both namespaces.
	var prevs []window.Diff
	for _, key := range keys {
		for _, size := range batchSizes {
			if rng.IntN(3) > 0 {
				prevs = append(prevs, window.Diff{Key: key, Size: size, Start: prev(c.at, size), Value: float64(rng.IntN(8)) / 2})
			}
		}
	}
	for _, ns := range []string{batchNS, hitNS} {
		push(t, c.ctx, s, ns, prevs...)
	}

	values := []float64{0, 0.25, 0.5, 1, 1, 1, 2}
	wholeValues := []float64{0, 1, 1, 2}
	weights := []float64{0, 0, 0.25, 0.5, 1}
	// A whole hit has whole values and no limit of -Inf: a store may
	// decide a batch of such hits far from their limits at once.
	randomHit := func(whole bool) strategy.HitRequest {
		h := strategy.HitRequest{Key: keys[rng.IntN(len(keys))], Undo: rng.IntN(2) == 0}
		if whole { // keys of their own, whose counts stay whole
			h.Key = wholeKeys[rng.IntN(len(wholeKeys))]
		}
		// One to three sizes, ascending, as a handler sends them.
		sizes := slices.Clone(batchSizes)
		rng.Shuffle(len(sizes), func(i, j int) { sizes[i], sizes[j] = sizes[j], sizes[i] })
		sizes = sizes[:1+rng.IntN(len(sizes))]
		slices.Sort(sizes)
		peek := !whole && rng.IntN(10) == 0 // count_status: read, and reject
		for _, size := range sizes {
			w := c.w(size, values[rng.IntN(len(values))], float64(rng.IntN(16))/2, weights[rng.IntN(len(weights))])
			if whole {
				w.Value = wholeValues[rng.IntN(len(wholeValues))]
				w.Max = float64(10 + rng.IntN(50))
			}
			switch {
			case peek:
				w.Value, w.Max = 0, math.Inf(-1)
			case rng.IntN(6) == 0:
				w.Max = inf
			case !whole && rng.IntN(3) == 0:
				w.Max = float64(20 + rng.IntN(40)) // far from the counts
			case !whole && rng.IntN(12) == 0:
				w.Max = math.Inf(-1)
			}
			h.Windows = append(h.Windows, w)
		}
		return h
	}

	// Any hits first, then whole ones, whose counts grow until the
	// limits far from them at first reject.
	for b := range 24 {
		whole := b >= 12
		hits := make([]strategy.HitRequest, 1+rng.IntN(12))
		for i := range hits {
			if i > 0 && rng.IntN(2) == 0 {
				// A hot key: the hit before's windows again, at another
				// time, as a busy node's batch mostly holds.
				h := hits[i-1]
				h.Windows = slices.Clone(h.Windows)
				for w := range h.Windows {
					h.Windows[w].Weight = weights[rng.IntN(len(weights))]
				}
				hits[i] = h
				continue
			}
			hits[i] = randomHit(whole)
		}
		id := newID()
		if b%4 == 3 {
			id = "" // a batch without an ID decides alike
		}
		got := c.batch(batchNS, id, hits)
		want := c.oneByOne(hitNS, hits)
		sameResults(t, fmt.Sprintf("batch %d (seed %d)", b, seed), hits, got, want)
		if t.Failed() {
			return
		}
	}
	all := append(slices.Clone(keys), wholeKeys...)
	batched := fetch(t, c.ctx, s, batchNS, all, batchSizes, c.now)
	oneByOne := fetch(t, c.ctx, s, hitNS, all, batchSizes, c.now)
	assertCounts(t, fmt.Sprintf("the counters of the batches against those of the hits (seed %d)", seed), nonZero(batched), nonZero(oneByOne))
}

// testBatchAcrossWindows checks a batch whose hits of one key write a
// window that later hits of the batch read as their previous one, and a
// hit with two windows of one size: each counter is one running count.
func testBatchAcrossWindows(t *testing.T, s strategy.BatchHitter) {
	c := newBatchCase(t, s)
	p := prev(c.at, hour)
	inPrev := func(value, limit float64) strategy.WindowHit {
		return strategy.WindowHit{Size: hour, Start: p, Value: value, Max: limit}
	}
	hits := []strategy.HitRequest{
		{Key: "k", Windows: []strategy.WindowHit{inPrev(2, inf)}},
		{Key: "k", Windows: []strategy.WindowHit{c.w(hour, 1, 3.5, 0.5)}},                 // 1 + 2*0.5 = 2
		{Key: "k", Windows: []strategy.WindowHit{inPrev(1, inf), c.w(hour, 1, 3.5, 0.5)}}, // 2 + 3*0.5 = 3.5
		{Key: "k", Windows: []strategy.WindowHit{c.w(hour, 1, 3.5, 0.5)}, Undo: true},     // 3 + 1.5 > 3.5: taken back
		{Key: "k", Windows: []strategy.WindowHit{c.w(hour, 0.5, inf, 0)}},
	}
	want := []strategy.HitResult{
		{Counts: []strategy.WindowCounts{wc(2, 0)}, Rejected: -1},
		{Counts: []strategy.WindowCounts{wc(1, 2)}, Rejected: -1},
		{Counts: []strategy.WindowCounts{wc(3, 0), wc(2, 3)}, Rejected: -1},
		{Counts: []strategy.WindowCounts{wc(2, 3)}, Rejected: 0},
		{Counts: []strategy.WindowCounts{wc(2.5, 3)}, Rejected: -1},
	}
	sameResults(t, "a batch across two windows", hits, c.batch(c.ns, newID(), hits), want)
	c.expect("after the batch", "k", []time.Duration{hour}, counts{
		{"k", hour, p}:               3,
		{"k", hour, cur(c.at, hour)}: 2.5,
	})
}

// someHits returns hits of several keys, a key hit more than once, with
// two windows each, which every store applies.
func (c *batchCase) someHits() []strategy.HitRequest {
	ws := []strategy.WindowHit{c.w(hour, 1, 10, 0), c.w(day, 0.5, inf, 0)}
	return []strategy.HitRequest{{Key: "a", Windows: ws}, {Key: "b", Windows: ws}, {Key: "a", Windows: ws}, {Key: "c{x}", Windows: ws}}
}

// keysOfHits returns the distinct keys of hits.
func keysOfHits(hits []strategy.HitRequest) []string {
	var keys []string
	for _, h := range hits {
		keys = append(keys, h.Key)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// testBatchThenPush checks the hit ID rule of a batch that was applied:
// the Batch that carries its hits' diffs under its ID applies nothing.
func testBatchThenPush(t *testing.T, s strategy.BatchHitter) {
	c := newBatchCase(t, s)
	hits := c.someHits()
	keys := keysOfHits(hits)
	id := newID()
	c.batch(c.ns, id, hits)
	want := fetch(t, c.ctx, s, c.ns, keys, batchSizes, c.now)
	if err := s.PushDiffs(c.ctx, strategy.Batch{ID: id, Namespace: c.ns, Diffs: diffsOf(hits)}); err != nil {
		t.Fatalf("pushing the batch's diffs under its ID: %v", err)
	}
	assertCounts(t, "after the batch and its diffs", fetch(t, c.ctx, s, c.ns, keys, batchSizes, c.now), want)
	// Under a new ID they count.
	push(t, c.ctx, s, c.ns, diffsOf(hits)...)
	assertCounts(t, "after the diffs under a new ID", fetch(t, c.ctx, s, c.ns, keys, batchSizes, c.now), maps.Clone(want).add(diffsOf(hits)...))
}

// testBatchTwice checks that a batch sent twice under one ID counts once,
// and that the second answers with the counts as they are.
func testBatchTwice(t *testing.T, s strategy.BatchHitter) {
	c := newBatchCase(t, s)
	hits := c.someHits()
	hits[1].Windows = []strategy.WindowHit{c.w(hour, 1, 0.5, 0)} // rejected, and undone
	hits[1].Undo = true
	keys := keysOfHits(hits)
	id := newID()
	c.batch(c.ns, id, hits)
	want := fetch(t, c.ctx, s, c.ns, keys, batchSizes, c.now)
	again := c.batch(c.ns, id, hits)
	assertCounts(t, "after the same batch twice", fetch(t, c.ctx, s, c.ns, keys, batchSizes, c.now), want)
	sameResults(t, "the batch sent again", hits, again, asRead(hits, want))
}

// asRead returns the results of hits that increment nothing, decided on
// the counts held: those of a batch whose ID was applied.
func asRead(hits []strategy.HitRequest, held counts) []strategy.HitResult {
	results := make([]strategy.HitResult, len(hits))
	for i, h := range hits {
		r := strategy.HitResult{Rejected: -1}
		for j, w := range h.Windows {
			cw := wc(held[win{h.Key, w.Size, w.Start}], held[win{h.Key, w.Size, w.Start - int64(w.Size)}])
			r.Counts = append(r.Counts, cw)
			rate := cw.Current + cw.Previous*w.Weight
			if r.Rejected < 0 && !math.IsInf(w.Max, 1) && (math.IsInf(w.Max, -1) || rate > w.Max) {
				r.Rejected = j
			}
		}
		results[i] = r
	}
	return results
}

// testPushThenBatch checks the hit ID rule when the Batch came first (the
// HitBatch reached the store only after its diffs were pushed): the
// HitBatch increments nothing and answers with the counts as they are.
func testPushThenBatch(t *testing.T, s strategy.BatchHitter) {
	c := newBatchCase(t, s)
	hits := c.someHits()
	keys := keysOfHits(hits)
	id := newID()
	if err := s.PushDiffs(c.ctx, strategy.Batch{ID: id, Namespace: c.ns, Diffs: diffsOf(hits)}); err != nil {
		t.Fatalf("pushing the batch's diffs under its ID: %v", err)
	}
	want := counts{}.add(diffsOf(hits)...)
	results := c.batch(c.ns, id, hits)
	assertCounts(t, "after the diffs and their batch", fetch(t, c.ctx, s, c.ns, keys, batchSizes, c.now), want)
	sameResults(t, "the batch after its diffs", hits, results, asRead(hits, want))
}

// testBatchSpill checks the hit ID rule with batches large enough that a
// store which pushes diffs in groups (as Redis does, 256 to a script run)
// splits the diffs of one key, or of one run, over several groups: in both
// orders, a batch and the Batch of its diffs count once between them.
func testBatchSpill(t *testing.T, s strategy.BatchHitter) {
	for _, tc := range []struct {
		name string
		keys []string
		hits int
	}{
		{"one key", []string{"spill"}, 200},          // 400 windows of one key
		{"three keys", []string{"x", "y", "z"}, 150}, // 300 windows of three
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newBatchCase(t, s)
			ws := []strategy.WindowHit{c.w(hour, 1, inf, 0), c.w(day, 0.5, inf, 0)}
			hits := make([]strategy.HitRequest, tc.hits)
			for i := range hits {
				hits[i] = strategy.HitRequest{Key: tc.keys[i%len(tc.keys)], Windows: ws}
			}
			want := counts{}.add(diffsOf(hits)...)

			// The batch, then its diffs.
			id := newID()
			c.batch(c.ns, id, hits)
			if err := s.PushDiffs(c.ctx, strategy.Batch{ID: id, Namespace: c.ns, Diffs: diffsOf(hits)}); err != nil {
				t.Fatal(err)
			}
			assertCounts(t, "after the batch and its diffs", fetch(t, c.ctx, s, c.ns, tc.keys, batchSizes, c.now), want)

			// The diffs, then their batch.
			ns, id := unique("spill"), newID()
			if err := s.PushDiffs(c.ctx, strategy.Batch{ID: id, Namespace: ns, Diffs: diffsOf(hits)}); err != nil {
				t.Fatal(err)
			}
			c.batch(ns, id, hits)
			assertCounts(t, "after the diffs and their batch", fetch(t, c.ctx, s, ns, tc.keys, batchSizes, c.now), want)
		})
	}
}

// testBatchBadHits checks that a hit that Hit would refuse is refused in
// its own result, with an error that wraps strategy.ErrRejected, and
// applies nothing, while the batch's other hits are applied as usual; and
// that an ID too long fails every hit so.
func testBatchBadHits(t *testing.T, s strategy.BatchHitter) {
	c := newBatchCase(t, s)
	good := []strategy.WindowHit{c.w(hour, 1, 2, 0)}
	bad := []strategy.WindowHit{c.w(hour, math.NaN(), 2, 0)}
	hits := []strategy.HitRequest{
		{Key: "a", Windows: good},
		{Key: "bad value", Windows: bad},
		{Key: "a", Windows: good},
		{Key: "no windows"},
		{Key: "a", Windows: good},
	}
	results := make([]strategy.HitResult, len(hits))
	s.HitBatch(c.ctx, c.ns, newID(), hits, results)
	var goodHits []strategy.HitRequest
	var goodResults []strategy.HitResult
	for i, r := range results {
		if strings.HasPrefix(hits[i].Key, "a") {
			if r.Err != nil {
				t.Fatalf("hits[%d], a good hit: %v", i, r.Err)
			}
			goodHits, goodResults = append(goodHits, hits[i]), append(goodResults, r)
		} else if !errors.Is(r.Err, strategy.ErrRejected) {
			t.Errorf("hits[%d] (%s): got error %v, want one that wraps ErrRejected", i, hits[i].Key, r.Err)
		}
	}
	sameResults(t, "the good hits", goodHits, goodResults, c.oneByOne(unique("good"), goodHits))
	c.expect("after the batch", "a", []time.Duration{hour}, counts{{"a", hour, cur(c.at, hour)}: 3})
	assertCounts(t, "the bad hits' keys", fetch(t, c.ctx, s, c.ns, []string{"bad value", "no windows"}, batchSizes, c.now), counts{})

	// An ID that no store keeps refuses every hit.
	s.HitBatch(c.ctx, c.ns, strings.Repeat("i", strategy.MaxIDLen+1), hits[:1], results[:1])
	if !errors.Is(results[0].Err, strategy.ErrRejected) {
		t.Errorf("a batch with an ID of %d bytes: got error %v, want one that wraps ErrRejected", strategy.MaxIDLen+1, results[0].Err)
	}
	// An empty batch does nothing.
	s.HitBatch(c.ctx, c.ns, newID(), nil, nil)
	c.expect("after more batches", "a", []time.Duration{hour}, counts{{"a", hour, cur(c.at, hour)}: 3})
}

// testBatchConcurrent checks that concurrent batches and hits of the same
// keys, the keys of a batch in any order, are atomic: each hit sees its own
// count, none is lost, and exactly Max hits of a key are admitted.
func testBatchConcurrent(t *testing.T, s strategy.BatchHitter) {
	c := newBatchCase(t, s)
	const workers, rounds, perBatch, limit = 8, 5, 5, 60
	keys := []string{"k", "j"}
	ws := []strategy.WindowHit{c.w(hour, 1, limit, 0)}
	var (
		mu       sync.Mutex
		seen     = make(map[string][]float64)
		admitted = make(map[string]int)
		wg       sync.WaitGroup
	)
	record := func(key string, counts []strategy.WindowCounts, rejected int) {
		mu.Lock()
		defer mu.Unlock()
		seen[key] = append(seen[key], counts[0].Current)
		if rejected < 0 {
			admitted[key]++
		}
	}
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for range rounds {
				hits := make([]strategy.HitRequest, perBatch)
				for i := range hits {
					hits[i] = strategy.HitRequest{Key: keys[rng.IntN(len(keys))], Windows: ws}
				}
				results := make([]strategy.HitResult, len(hits))
				s.HitBatch(c.ctx, c.ns, newID(), hits, results)
				for i, r := range results {
					if r.Err != nil {
						t.Errorf("hits[%d] of a batch: %v", i, r.Err)
						return
					}
					record(hits[i].Key, r.Counts, r.Rejected)
				}
				key := keys[rng.IntN(len(keys))]
				counts, rejected, err := s.Hit(c.ctx, c.ns, key, newID(), ws, false)
				if err != nil {
					t.Errorf("hitting: %v", err)
					return
				}
				record(key, counts, rejected)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	total := 0
	want := counts{}
	for _, key := range keys {
		got := seen[key]
		slices.Sort(got)
		for i, v := range got {
			if v != float64(i+1) {
				t.Fatalf("key %q: concurrent hits saw counts %v, want each of 1 to %d once", key, got, len(got))
			}
		}
		if a := admitted[key]; a != min(len(got), limit) {
			t.Errorf("key %q: %d of %d concurrent hits were admitted, want %d", key, a, len(got), min(len(got), limit))
		}
		total += len(got)
		want[win{key, hour, cur(c.at, hour)}] = float64(len(got))
	}
	if total != workers*rounds*(perBatch+1) {
		t.Errorf("%d hits answered, want %d", total, workers*rounds*(perBatch+1))
	}
	assertCounts(t, "after concurrent batches", fetch(t, c.ctx, s, c.ns, keys, []time.Duration{hour}, c.now), want)
}
