package strategytest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// testPushFetch checks that pushed diffs add up, per counter, across
// batches and within one; that a fetch returns the current and previous
// windows at the time it is given, for each size asked; and that it omits
// the counters the store does not hold.
func testPushFetch(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("push")
	now := steadyNow()
	at := now.UnixNano()
	first := []window.Diff{
		{Key: "a", Size: hour, Start: cur(at, hour), Value: 1},
		{Key: "a", Size: hour, Start: cur(at, hour), Value: 2.5}, // the same counter twice
		{Key: "a", Size: hour, Start: prev(at, hour), Value: -0.25},
		{Key: "a", Size: day, Start: cur(at, day), Value: 0.125},
		{Key: "b", Size: twoHours, Start: cur(at, twoHours), Value: -2},
		{Key: "zero", Size: hour, Start: cur(at, hour), Value: 1},
	}
	second := []window.Diff{
		{Key: "a", Size: hour, Start: cur(at, hour), Value: 0.5},
		{Key: "a", Size: hour, Start: prev(at, hour), Value: 1},
		{Key: "b", Size: twoHours, Start: cur(at, twoHours), Value: 0.5},
		{Key: "zero", Size: hour, Start: cur(at, hour), Value: -1},
		{Key: "c", Size: day, Start: prev(at, day), Value: 1_000_000.5},
	}
	push(t, ctx, s, ns, first...)
	push(t, ctx, s, ns, second...)
	want := counts{}.add(first...).add(second...)
	if want[win{"a", hour, cur(at, hour)}] != 4 || want[win{"zero", hour, cur(at, hour)}] != 0 {
		t.Fatal("the test's expected sums are wrong")
	}

	sizes := []time.Duration{hour, twoHours, day}
	keys := []string{"a", "b", "zero", "c", "absent"}
	// A counter that sums to zero is held: a node must take the store's
	// zero, not keep its own count.
	assertCounts(t, "all keys and sizes", fetch(t, ctx, s, ns, keys, sizes, now), want)
	assertCounts(t, "key b, hour windows", fetch(t, ctx, s, ns, []string{"b"}, []time.Duration{hour}, now), counts{})
	assertCounts(t, "key a, day windows", fetch(t, ctx, s, ns, []string{"a"}, []time.Duration{day}, now),
		counts{{"a", day, cur(at, day)}: 0.125})
	assertCounts(t, "key absent", fetch(t, ctx, s, ns, []string{"absent"}, sizes, now), counts{})
	assertCounts(t, "no keys", fetch(t, ctx, s, ns, nil, sizes, now), counts{})
	assertCounts(t, "another namespace", fetch(t, ctx, s, unique("push-other"), keys, sizes, now), counts{})

	// An hour later the current hour is the previous one, and the hour
	// before it is not asked for; two hours later neither is.
	later := now.Add(hour)
	assertCounts(t, "an hour later", fetch(t, ctx, s, ns, keys, []time.Duration{hour}, later), counts{
		{"a", hour, cur(at, hour)}:    4,
		{"zero", hour, cur(at, hour)}: 0,
	})
	assertCounts(t, "two hours later", fetch(t, ctx, s, ns, keys, []time.Duration{hour}, now.Add(2*hour)), counts{})
}

// testRetriedBatch checks that a batch pushed again under its ID, even with
// its diffs in another order, is applied once, and that the same diffs
// under a new ID are applied again.
func testRetriedBatch(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("retry")
	at := steadyNow().UnixNano()
	var diffs []window.Diff
	for i := range 300 {
		key := fmt.Sprintf("k%d", i)
		diffs = append(diffs,
			window.Diff{Key: key, Size: hour, Start: cur(at, hour), Value: 1},
			window.Diff{Key: key, Size: twoHours, Start: prev(at, twoHours), Value: 0.5})
	}
	once := counts{}.add(diffs...)
	twice := counts{}.add(diffs...).add(diffs...)
	keys, sizes := keysOf(once), []time.Duration{hour, twoHours}
	now := time.Unix(0, at)

	id := push(t, ctx, s, ns, diffs...)
	shuffled := slices.Clone(diffs)
	rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	for _, again := range [][]window.Diff{diffs, shuffled} {
		if err := s.PushDiffs(ctx, strategy.Batch{ID: id, Namespace: ns, Diffs: again}); err != nil {
			t.Fatalf("pushing the batch again: %v", err)
		}
	}
	assertCounts(t, "after one batch pushed three times", fetch(t, ctx, s, ns, keys, sizes, now), once)

	id = push(t, ctx, s, ns, diffs...)
	assertCounts(t, "after the same diffs under a new ID", fetch(t, ctx, s, ns, keys, sizes, now), twice)
	slices.Reverse(shuffled)
	if err := s.PushDiffs(ctx, strategy.Batch{ID: id, Namespace: ns, Diffs: shuffled}); err != nil {
		t.Fatalf("pushing the second batch again: %v", err)
	}
	assertCounts(t, "after the second batch pushed again", fetch(t, ctx, s, ns, keys, sizes, now), twice)
}

// testPartialFailure checks that a push that failed, whatever it applied
// (nothing, part or all), and was then pushed again under its ID, counts
// exactly once. The first attempt runs out of time before it starts, or
// at various points while it is under way.
func testPartialFailure(t *testing.T, h Harness) {
	for _, timeout := range []time.Duration{0, 50 * time.Microsecond, 500 * time.Microsecond, 5 * time.Millisecond} {
		name := "cancelled"
		if timeout > 0 {
			name = "deadline " + timeout.String()
		}
		t.Run(name, func(t *testing.T) {
			s, ctx, ns := h.open(t), testContext(t), unique("partial")
			at := steadyNow().UnixNano()
			var diffs []window.Diff
			for i := range 2000 {
				key := fmt.Sprintf("k%d", i)
				diffs = append(diffs,
					window.Diff{Key: key, Size: hour, Start: cur(at, hour), Value: 1},
					window.Diff{Key: key, Size: day, Start: cur(at, day), Value: 0.25})
			}
			b := strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs}

			short, cancel := context.WithTimeout(ctx, timeout)
			if timeout == 0 {
				cancel()
			}
			err := s.PushDiffs(short, b)
			cancel()
			t.Logf("the first attempt returned %v", err)
			if err := s.PushDiffs(ctx, b); err != nil {
				t.Fatalf("pushing the batch again: %v", err)
			}
			want := counts{}.add(diffs...)
			got := fetch(t, ctx, s, ns, keysOf(want), []time.Duration{hour, day}, time.Unix(0, at))
			assertCounts(t, "after a failed push and its retry", got, want)
		})
	}
}

// testManyDiffs checks that every diff of a large batch lands.
func testManyDiffs(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("many")
	at := steadyNow().UnixNano()
	const nDiffs, nKeys = 5000, 2000
	diffs := make([]window.Diff, nDiffs)
	for i := range diffs {
		size := []time.Duration{hour, twoHours}[i/nKeys%2]
		diffs[i] = window.Diff{Key: fmt.Sprintf("key-%d", i%nKeys), Size: size, Start: cur(at, size), Value: 0.5 + float64(i%3)}
	}
	push(t, ctx, s, ns, diffs...)
	want := counts{}.add(diffs...)
	if len(keysOf(want)) != nKeys {
		t.Fatal("the test's batch does not cover every key")
	}
	got := fetch(t, ctx, s, ns, keysOf(want), []time.Duration{hour, twoHours}, time.Unix(0, at))
	assertCounts(t, fmt.Sprintf("after a batch of %d diffs over %d keys", nDiffs, nKeys), got, want)
}

// testHostileKeys checks that keys and namespaces are data: no separator,
// brace, NUL, invalid UTF-8, wildcard or length makes two counters one, or
// breaks a push or a fetch.
func testHostileKeys(t *testing.T, h Harness) {
	s, ctx, base := h.open(t), testContext(t), unique("hostile")
	pairs := hostilePairs(base)

	at := steadyNow().UnixNano()
	wants := make(map[string]counts)
	var allKeys []string
	for i, p := range pairs {
		if wants[p.namespace] == nil {
			wants[p.namespace] = counts{}
		}
		wants[p.namespace].add(window.Diff{Key: p.key, Size: hour, Start: cur(at, hour), Value: float64(i + 1)})
		allKeys = append(allKeys, p.key)
	}
	slices.Sort(allKeys)
	allKeys = slices.Compact(allKeys)
	for ns, want := range wants {
		var diffs []window.Diff
		for w, v := range want {
			diffs = append(diffs, window.Diff{Key: w.key, Size: w.size, Start: w.start, Value: v})
		}
		push(t, ctx, s, ns, diffs...)
	}
	// Every namespace, asked for every key, holds exactly its own.
	now := time.Unix(0, at)
	for ns, want := range wants {
		got := fetch(t, ctx, s, ns, allKeys, []time.Duration{hour}, now)
		assertCounts(t, fmt.Sprintf("namespace %q", strings.TrimPrefix(ns, base)), got, want)
	}
	for _, p := range pairs {
		got := fetch(t, ctx, s, p.namespace, []string{p.key}, []time.Duration{hour}, now)
		want := counts{{p.key, hour, cur(at, hour)}: wants[p.namespace][win{p.key, hour, cur(at, hour)}]}
		assertCounts(t, fmt.Sprintf("namespace %q, one key", strings.TrimPrefix(p.namespace, base)), got, want)
	}
}

// pair is a namespace and a key.
type pair struct{ namespace, key string }

// hostilePairs returns namespaces and keys that a store must keep apart,
// all starting with base: keys of namespace base with separators, braces
// (Redis hash tags), NULs, invalid UTF-8, wildcards, SQL and 10 KB of
// length, and namespace and key pairs that a naive concatenation would
// merge.
func hostilePairs(base string) []pair {
	long := strings.Repeat("k", 10<<10)
	var pairs []pair
	for _, key := range []string{
		"", " ", ":", "::", "a", "a:b", "b:c", "a:b:c", "{", "}", "{}", "{a}", "}{", "{a}:b", "a{b}c",
		"\x00", "\x00a", "a\x00", "a\x00b", "\xff", "\xff\xfe\xfd", "\xc3\x28", "é", "e\u0301", "\n", "\r\n",
		"*", "?", "[a]", "%", "_", "%s", "\\", "'", `"`, "';--", "$1", "rl:{1}:60000:0:1:a:b", long, long + "x",
	} {
		pairs = append(pairs, pair{base, key})
	}
	return append(pairs,
		pair{base + "a:b", "c"}, pair{base + "a", "b:c"}, pair{base + "a:b:c", ""}, pair{base + "a:", "b:c"},
		pair{base + "x:", "y"}, pair{base + "x", ":y"}, pair{base + "\x00", "k"}, pair{base, "\x00k"},
		pair{base + "{", "k}"}, pair{base + "{k", "}"}, pair{base + "3:", "a"}, pair{base + "%", "a"},
	)
}

// testReset checks that Reset sets a key's current and previous windows of
// the given sizes to zero, reported as zero rather than omitted, leaves
// other keys, sizes and namespaces alone, and that later diffs add to zero.
func testReset(t *testing.T, h Harness) {
	s, ctx, ns, other := h.open(t), testContext(t), unique("reset"), unique("reset-other")
	now := steadyNow()
	at := now.UnixNano()
	diffs := []window.Diff{
		{Key: "r", Size: hour, Start: cur(at, hour), Value: 3},
		{Key: "r", Size: hour, Start: prev(at, hour), Value: 2},
		{Key: "r", Size: twoHours, Start: cur(at, twoHours), Value: 1},
		{Key: "r", Size: day, Start: cur(at, day), Value: 7},
		{Key: "o", Size: hour, Start: cur(at, hour), Value: 5},
	}
	push(t, ctx, s, ns, diffs...)
	push(t, ctx, s, other, diffs...)

	if err := s.Reset(ctx, ns, "r", []time.Duration{hour, twoHours}, now); err != nil {
		t.Fatalf("resetting key r: %v", err)
	}
	if err := s.Reset(ctx, ns, "fresh", []time.Duration{hour}, now); err != nil {
		t.Fatalf("resetting key fresh: %v", err)
	}
	if err := s.Reset(ctx, ns, "o", nil, now); err != nil {
		t.Fatalf("resetting key o with no sizes: %v", err)
	}
	keys, sizes := []string{"r", "o", "fresh", "absent"}, []time.Duration{hour, twoHours, day}
	want := counts{
		{"r", hour, cur(at, hour)}:          0,
		{"r", hour, prev(at, hour)}:         0,
		{"r", twoHours, cur(at, twoHours)}:  0,
		{"r", twoHours, prev(at, twoHours)}: 0, // never written, reset all the same
		{"r", day, cur(at, day)}:            7,
		{"o", hour, cur(at, hour)}:          5,
		{"fresh", hour, cur(at, hour)}:      0,
		{"fresh", hour, prev(at, hour)}:     0,
	}
	assertCounts(t, "after the resets", fetch(t, ctx, s, ns, keys, sizes, now), want)
	assertCounts(t, "another namespace", fetch(t, ctx, s, other, keys, sizes, now), counts{}.add(diffs...))

	more := []window.Diff{
		{Key: "r", Size: hour, Start: cur(at, hour), Value: 1.5},
		{Key: "r", Size: twoHours, Start: prev(at, twoHours), Value: -0.5},
	}
	push(t, ctx, s, ns, more...)
	assertCounts(t, "after a push that follows the reset", fetch(t, ctx, s, ns, keys, sizes, now), want.add(more...))
}

// testExpiry checks that counters expire on their own, so that a store
// never grows without bound, and that diffs of windows that have expired
// already are not held.
func testExpiry(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("expiry")
	const short, long = 20 * time.Millisecond, time.Second
	now := time.Now()
	at, old := now.UnixNano(), now.Add(-time.Minute).UnixNano()
	var diffs []window.Diff
	const nKeys = 10
	for i := range nKeys {
		key := fmt.Sprintf("k%d", i)
		for _, size := range []time.Duration{short, long} {
			diffs = append(diffs,
				window.Diff{Key: key, Size: size, Start: cur(at, size), Value: 1},
				window.Diff{Key: key, Size: size, Start: prev(at, size), Value: 1},
				window.Diff{Key: key, Size: size, Start: cur(old, size), Value: 1}) // long expired
		}
	}
	push(t, ctx, s, ns, diffs...)
	n := h.Counters(t, s, ns)
	// The current windows of a second live until two seconds after they
	// start; only a test that stalled longer may see fewer of them.
	if live := time.Duration(cur(at, long) + 2*int64(long) - time.Now().UnixNano()); live > 0 && n < nKeys {
		t.Errorf("the store holds %d counters of namespace %s right after the push, want at least %d", n, ns, nKeys)
	}
	if most := 4 * nKeys; n > most {
		t.Errorf("the store holds %d counters of namespace %s right after the push, want at most %d: windows that had expired were kept", n, ns, most)
	}
	poll.Until(t, 10*time.Second, "the counters of namespace "+ns+" to expire", func() bool {
		return h.Counters(t, s, ns) == 0
	})
	keys := keysOf(counts{}.add(diffs...))
	got := fetch(t, ctx, s, ns, keys, []time.Duration{short, long}, now)
	assertCounts(t, "after expiry", got, counts{})
}

// testFetchCost checks that a fetch costs in proportion to the keys asked
// for, not to the size of the namespace: fetching 10 keys costs about the
// same whether the namespace holds them alone or 5,000 other keys as well.
func testFetchCost(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("cost")
	now := steadyNow()
	at := now.UnixNano()
	var asked []window.Diff
	for i := range 10 {
		asked = append(asked, window.Diff{Key: fmt.Sprintf("asked-%d", i), Size: hour, Start: cur(at, hour), Value: float64(i + 1)})
	}
	push(t, ctx, s, ns, asked...)
	want := counts{}.add(asked...)
	keys := keysOf(want)
	sizes := []time.Duration{hour}

	measure := func(what string) int64 {
		var before int64
		if h.Cost != nil {
			before = h.Cost(t)
		}
		assertCounts(t, what, fetch(t, ctx, s, ns, keys, sizes, now), want)
		if h.Cost == nil {
			return 0
		}
		return h.Cost(t) - before
	}
	alone := measure("the 10 keys alone")
	for b := range 5 {
		var others []window.Diff
		for i := range 1000 {
			key := fmt.Sprintf("other-%d-%d", b, i)
			others = append(others,
				window.Diff{Key: key, Size: hour, Start: cur(at, hour), Value: 1},
				window.Diff{Key: key, Size: hour, Start: prev(at, hour), Value: 1})
		}
		push(t, ctx, s, ns, others...)
	}
	crowded := measure("the 10 keys among 5,000 others")
	if h.Cost == nil {
		t.Log("Harness.Cost is nil: checked what the fetches return only")
		return
	}
	t.Logf("fetching 10 keys cost %d alone and %d among 5,000 other keys", alone, crowded)
	if alone <= 0 {
		t.Errorf("Harness.Cost reported %d for a fetch of 10 keys: it measures nothing", alone)
	}
	if crowded > 2*alone+8 {
		t.Errorf("fetching 10 keys cost %d among 5,000 other keys and %d alone: the cost grows with the namespace", crowded, alone)
	}
}

// testConcurrentPushes checks that pushes from many goroutines at once all
// count, in full.
func testConcurrentPushes(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("concurrent")
	at := steadyNow().UnixNano()
	const workers, batches = 8, 25
	want := counts{}
	var wg sync.WaitGroup
	for g := range workers {
		diffs := []window.Diff{
			{Key: "shared", Size: hour, Start: cur(at, hour), Value: 1},
			{Key: fmt.Sprintf("own-%d", g), Size: hour, Start: cur(at, hour), Value: 0.5},
		}
		for range batches {
			want.add(diffs...)
		}
		wg.Go(func() {
			for range batches {
				b := strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs}
				if err := s.PushDiffs(ctx, b); err != nil {
					t.Errorf("pushing from goroutine %d: %v", g, err)
					return
				}
			}
		})
	}
	wg.Wait()
	got := fetch(t, ctx, s, ns, keysOf(want), []time.Duration{hour}, time.Unix(0, at))
	assertCounts(t, "after concurrent pushes", got, want)
}

// testInvalidWindows checks that windows no store can hold (a size that is
// not positive, a start that is not a multiple of the size) are refused
// with an error that wraps strategy.ErrRejected, so that callers drop the
// request rather than retry it forever, and that none panics.
func testInvalidWindows(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("invalid")
	now := steadyNow()
	at := now.UnixNano()
	for _, d := range []window.Diff{
		{Key: "k", Size: 0, Start: 0, Value: 1},
		{Key: "k", Size: -hour, Start: cur(at, hour), Value: 1},
		{Key: "k", Size: hour, Start: cur(at, hour) + int64(time.Millisecond), Value: 1},
	} {
		err := s.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: ns, Diffs: []window.Diff{d}})
		if !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("pushing a diff of size %v and start %d: got error %v, want one that wraps ErrRejected", d.Size, d.Start, err)
		}
	}
	for _, size := range []time.Duration{0, -hour} {
		sizes := []time.Duration{hour, size}
		if _, err := s.GetCounters(ctx, ns, []string{"k"}, sizes, now); !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("fetching windows of size %v: got error %v, want one that wraps ErrRejected", size, err)
		}
		if err := s.Reset(ctx, ns, "k", sizes, now); !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("resetting windows of size %v: got error %v, want one that wraps ErrRejected", size, err)
		}
	}
}

// testClose checks that the calls made on a closed store fail with an
// error that wraps strategy.ErrNotSent, and so change nothing.
func testClose(t *testing.T, h Harness) {
	ctx, ns := testContext(t), unique("close")
	now := steadyNow()
	at := now.UnixNano()
	s := h.Open(t)
	if s == nil {
		t.Fatal("Harness.Open returned a nil store")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("closing the store: %v", err)
	}
	sizes := []time.Duration{hour}
	d := window.Diff{Key: "k", Size: hour, Start: cur(at, hour), Value: 1}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, strategy.ErrNotSent) {
			t.Errorf("%s after Close: got error %v, want one that wraps ErrNotSent", what, err)
		}
	}
	check("PushDiffs", s.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: ns, Diffs: []window.Diff{d}}))
	_, err := s.GetCounters(ctx, ns, []string{"k"}, sizes, now)
	check("GetCounters", err)
	check("Reset", s.Reset(ctx, ns, "r", sizes, now))
	if hs, ok := s.(strategy.Hitter); ok {
		_, _, err := hs.Hit(ctx, ns, "h", newID(), []strategy.WindowHit{
			{Size: hour, Start: cur(at, hour), Value: 1, Max: 10},
		}, false)
		check("Hit", err)
	}
	if bs, ok := s.(strategy.BatchHitter); ok {
		hits := []strategy.HitRequest{{Key: "b", Windows: []strategy.WindowHit{{Size: hour, Start: cur(at, hour), Value: 1, Max: 10}}}}
		for range 2 { // a batch of one hit, and of two
			results := make([]strategy.HitResult, len(hits))
			bs.HitBatch(ctx, ns, newID(), hits, results)
			for i := range results {
				check("HitBatch", results[i].Err)
			}
			hits = append(hits, hits[0])
		}
	}
	// Nothing was sent, so nothing counted.
	fresh := h.open(t)
	got := fetch(t, ctx, fresh, ns, []string{"k", "r", "h", "b"}, sizes, now)
	assertCounts(t, "after calls on a closed store", got, counts{})
}
