package strategytest

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// testNear runs the tests of strategy.NearFeed if the store implements
// it. A store without a feed is fine: a periodic fleet then decides a key
// its nodes see seldom on old counts.
func testNear(t *testing.T, h Harness) {
	f, ok := h.open(t).(strategy.NearFeed)
	if !ok {
		t.Log("the store tells of no keys near their limits (it is not a strategy.NearFeed): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, strategy.NearFeed)
	}{
		{"Crossing", testNearCrossing},
		{"EveryFourthWindow", testNearEveryFourthWindow},
		{"Version", testNearVersion},
		{"RetriedBatch", testNearRetriedBatch},
		{"MarkNear", testNearMarkNear},
		{"MarkWithTheRead", testNearMarkWithTheRead},
		{"Counts", testNearCounts},
		{"Bound", testNearBound},
		{"Expiry", testNearExpiry},
		{"HostileKeys", testNearHostileKeys},
		{"RejectsInput", testNearRejectsInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, f) })
	}
}

// pushNear pushes diffs in one batch whose Near is near, and returns its
// ID.
func pushNear(t *testing.T, f strategy.NearFeed, ns string, near float64, diffs ...window.Diff) string {
	t.Helper()
	id := newID()
	if err := f.PushDiffs(testContext(t), strategy.Batch{ID: id, Namespace: ns, Diffs: diffs, Near: near}); err != nil {
		t.Fatalf("pushing %d diffs with near %v: %v", len(diffs), near, err)
	}
	return id
}

// readNear reads a namespace's marks after known, and returns them as
// "key until-in-ms" pairs, in the order they came, with the version.
func readNear(t *testing.T, f strategy.NearFeed, ns string, known int64) ([]nearRead, int64) {
	t.Helper()
	_, marks, version, err := f.GetCountersNear(testContext(t), ns, nil, nil, time.Now(), known, nil)
	if err != nil {
		t.Fatalf("reading the marks of %q after version %d: %v", ns, known, err)
	}
	got := make([]nearRead, len(marks))
	for i, m := range marks {
		got[i] = nearRead{m.Key, m.Until.UnixMilli()}
	}
	return got, version
}

// nearRead is a mark as the tests compare it: its end in whole
// milliseconds, which every store keeps.
type nearRead struct {
	key   string
	until int64
}

// nearDiff is a diff of one hour-long window of key: the current one, or
// with previous the one before it.
func nearDiff(at time.Time, key string, value, limit float64, previous bool) window.Diff {
	start := cur(at.UnixNano(), hour)
	if previous {
		start = prev(at.UnixNano(), hour)
	}
	return window.Diff{Key: key, Size: hour, Start: start, Value: value, Limit: limit}
}

// untilOf is the end of the mark that d makes, in milliseconds.
func untilOf(d window.Diff) int64 { return strategy.NearUntil(&d).UnixMilli() }

// testNearCrossing checks that a diff marks its key when it brings its
// window's count from below Near × Limit to it or more, once, until the
// window's start plus five times its size; and that a diff below it, one
// already past it, a negative one, one without a limit, and a batch
// without a Near mark nothing.
func testNearCrossing(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-crossing")
	at := steadyNow()
	if got, v := readNear(t, f, ns, 0); len(got) != 0 || v != 0 {
		t.Fatalf("a new namespace: marks %v at version %d, want none at 0", got, v)
	}
	below := nearDiff(at, "a", 3, 10, false)
	pushNear(t, f, ns, 0.5, below)
	if got, v := readNear(t, f, ns, 0); len(got) != 0 || v != 0 {
		t.Fatalf("a count of 3 of a limit 10 at near 0.5 marked %v (version %d), want nothing", got, v)
	}
	cross := nearDiff(at, "a", 2, 10, false)
	pushNear(t, f, ns, 0.5, cross)
	got, v1 := readNear(t, f, ns, 0)
	if want := []nearRead{{"a", untilOf(cross)}}; !slices.Equal(got, want) || v1 == 0 {
		t.Fatalf("a count brought to 5 of a limit 10 at near 0.5: marks %v at version %d, want %v at a version above 0", got, v1, want)
	}
	// Past the share already, a negative diff, no limit, no Near, and a
	// diff of a window that expired: nothing.
	pushNear(t, f, ns, 0.5, nearDiff(at, "a", 1, 10, false), nearDiff(at, "n", -8, 2, false), nearDiff(at, "z", 5, 0, false))
	pushNear(t, f, ns, 0, nearDiff(at, "off", 100, 1, false))
	old := window.Diff{Key: "old", Size: hour, Start: cur(at.Add(-3*hour).UnixNano(), hour), Value: 10, Limit: 1}
	pushNear(t, f, ns, 0.5, old)
	if got, v := readNear(t, f, ns, v1); len(got) != 0 || v != v1 {
		t.Fatalf("pushes that cross nothing: marks %v at version %d, want none at %d", got, v, v1)
	}
	// The previous window's count marks until the end of the current one;
	// several keys of one push come in one version.
	p := nearDiff(at, "p", 2, 4, true)
	q := nearDiff(at, "q", 7, 4, false)
	pushNear(t, f, ns, 0.5, p, q)
	got, v2 := readNear(t, f, ns, v1)
	slices.SortFunc(got, func(a, b nearRead) int { return cmp.Compare(a.key, b.key) })
	if want := []nearRead{{"p", untilOf(p)}, {"q", untilOf(q)}}; !slices.Equal(got, want) || v2 <= v1 {
		t.Fatalf("a push crossing two keys: marks %v at version %d, want %v after version %d", got, v2, want, v1)
	}
}

// testNearEveryFourthWindow checks that a crossing diff of a window
// whose number is not a multiple of four, and whose Previous (the node's
// count of the window before) came near, marks nothing, a window at most
// three before having marked the key until this one's next ends; while
// one whose Previous did not, and one of a window whose number is a
// multiple of four, mark.
func testNearEveryFourthWindow(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-period")
	at := steadyNow()
	var diffs []window.Diff
	var want []nearRead
	for number := range int64(4) {
		size := sizeNumbered(t, at, number)
		near := window.Diff{Key: fmt.Sprintf("near-%d", number), Size: size, Start: cur(at.UnixNano(), size), Value: 5, Limit: 10, Previous: 5}
		fresh := near
		fresh.Key, fresh.Previous = fmt.Sprintf("fresh-%d", number), 4
		diffs = append(diffs, near, fresh)
		want = append(want, nearRead{fresh.Key, untilOf(fresh)})
		if number == 0 {
			want = append(want, nearRead{near.Key, untilOf(near)})
		}
	}
	pushNear(t, f, ns, 0.5, diffs...)
	got, _ := readNear(t, f, ns, 0)
	slices.SortFunc(got, func(a, b nearRead) int { return cmp.Compare(a.key, b.key) })
	slices.SortFunc(want, func(a, b nearRead) int { return cmp.Compare(a.key, b.key) })
	if !slices.Equal(got, want) {
		t.Fatalf("crossings of windows numbered 0 to 3 (mod 4) after a near window (near-N) and after a far one (fresh-N): marks %v, want %v", got, want)
	}
}

// sizeNumbered returns a window size close to an hour whose window at at
// has a number (its start divided by its size) of number modulo 4, and
// neither started nor ends within a minute of at: sizes a millisecond
// apart number at's window differently this far from 1970.
func sizeNumbered(t *testing.T, at time.Time, number int64) time.Duration {
	t.Helper()
	now := at.UnixNano()
	for size := hour; size < hour+time.Second; size += time.Millisecond {
		start := cur(now, size)
		if window.Index(start, size)%4 == number && now-start > int64(time.Minute) && start+int64(size)-now > int64(time.Minute) {
			return size
		}
	}
	t.Fatalf("no size within a second of an hour numbers the window at %v %d modulo 4", at, number)
	return 0
}

// testNearVersion checks that a reader at the store's version reads no
// marks, that one behind reads exactly the marks made since, in order,
// that a reader at 0 or ahead of the store reads them all, and that a
// push that marks nothing keeps the version.
func testNearVersion(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-version")
	at := steadyNow()
	var versions []int64
	var all []nearRead
	for _, key := range []string{"k1", "k2", "k3"} {
		d := nearDiff(at, key, 1, 1, false)
		pushNear(t, f, ns, 1, d)
		all = append(all, nearRead{key, untilOf(d)})
		_, v := readNear(t, f, ns, 0)
		if len(versions) > 0 && v <= versions[len(versions)-1] {
			t.Fatalf("versions %v then %d: a marking push must give a greater version", versions, v)
		}
		versions = append(versions, v)
	}
	v := versions[2]
	if got, now := readNear(t, f, ns, v); len(got) != 0 || now != v {
		t.Fatalf("a reader at the version %d read %v at %d, want nothing at %d", v, got, now, v)
	}
	if got, _ := readNear(t, f, ns, versions[0]); !slices.Equal(got, all[1:]) {
		t.Fatalf("a reader at the first version read %v, want %v", got, all[1:])
	}
	for _, known := range []int64{0, v + 1000} {
		if got, now := readNear(t, f, ns, known); !slices.Equal(got, all) || now != v {
			t.Fatalf("a reader at %d read %v at %d, want %v at %d", known, got, now, all, v)
		}
	}
	pushNear(t, f, ns, 1, nearDiff(at, "k1", 1, 1, false))
	if _, now := readNear(t, f, ns, v); now != v {
		t.Fatalf("a push that marks nothing moved the version from %d to %d", v, now)
	}
}

// testNearMarkNear checks that MarkNear makes its marks that have not
// ended, in order, after a push's, at a greater version, and that no
// marks change nothing.
func testNearMarkNear(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-mark")
	ctx := testContext(t)
	d := nearDiff(steadyNow(), "pushed", 1, 1, false)
	pushNear(t, f, ns, 1, d)
	_, v1 := readNear(t, f, ns, 0)
	now := time.Now()
	later := now.Add(time.Hour).Truncate(time.Millisecond)
	marks := []strategy.NearMark{{Key: "a", Until: later}, {Key: "ended", Until: now.Add(-time.Minute)}, {Key: "b\x00\n", Until: later}}
	if err := f.MarkNear(ctx, ns, marks); err != nil {
		t.Fatalf("MarkNear(%v): %v", marks, err)
	}
	got, v2 := readNear(t, f, ns, v1)
	want := []nearRead{{"a", later.UnixMilli()}, {"b\x00\n", later.UnixMilli()}}
	if !slices.Equal(got, want) || v2 <= v1 {
		t.Fatalf("after MarkNear, a reader at %d read %v at %d, want %v at a greater version", v1, got, v2, want)
	}
	if got, _ := readNear(t, f, ns, 0); !slices.Equal(got, append([]nearRead{{"pushed", untilOf(d)}}, want...)) {
		t.Fatalf("a new reader read %v, want the pushed mark, then %v", got, want)
	}
	if err := f.MarkNear(ctx, ns, nil); err != nil {
		t.Fatalf("MarkNear of no marks: %v", err)
	}
	if _, v := readNear(t, f, ns, v2); v != v2 {
		t.Fatalf("MarkNear of no marks moved the version from %d to %d", v2, v)
	}
}

// testNearMarkWithTheRead checks that GetCountersNear makes the marks it
// is given after its read, as MarkNear would: it returns the counts and
// the marks made before, and a later read returns the new marks, at a
// greater version; with keys to fetch and with none.
func testNearMarkWithTheRead(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-mark-read")
	at := steadyNow()
	d := nearDiff(at, "pushed", 3, 4, false)
	pushNear(t, f, ns, 0.5, d)
	later := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	for i, keys := range [][]string{{"pushed", "none"}, nil} {
		_, v1 := readNear(t, f, ns, 0)
		key := fmt.Sprint("asked-", i)
		counts, marks, v, err := f.GetCountersNear(testContext(t), ns, keys, []time.Duration{hour}, at, 0,
			[]strategy.NearMark{{Key: key, Until: later}})
		if err != nil {
			t.Fatalf("GetCountersNear of %v, marking %s: %v", keys, key, err)
		}
		if keys != nil && (len(counts) != 1 || counts[0].Key != "pushed" || counts[0].Value != 3) {
			t.Fatalf("GetCountersNear of %v, marking %s: counts %v, want pushed's 3", keys, key, counts)
		}
		if len(marks) == 0 || marks[len(marks)-1].Key == key || v != v1 {
			t.Fatalf("GetCountersNear marking %s read %v at version %d, want the marks before it, at %d", key, marks, v, v1)
		}
		got, v2 := readNear(t, f, ns, v)
		if !slices.Equal(got, []nearRead{{key, later.UnixMilli()}}) || v2 <= v {
			t.Fatalf("after GetCountersNear marking %s, a reader at %d read %v at %d, want that mark at a greater version", key, v, got, v2)
		}
	}
}

// testNearRetriedBatch checks that a batch pushed again under its ID
// marks nothing again.
func testNearRetriedBatch(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-retry")
	d := nearDiff(steadyNow(), "k", 3, 4, false)
	b := strategy.Batch{ID: newID(), Namespace: ns, Diffs: []window.Diff{d}, Near: 0.5}
	for range 2 {
		if err := f.PushDiffs(testContext(t), b); err != nil {
			t.Fatalf("pushing: %v", err)
		}
	}
	if got, _ := readNear(t, f, ns, 0); !slices.Equal(got, []nearRead{{"k", untilOf(d)}}) {
		t.Fatalf("a batch pushed twice: marks %v, want one of k", got)
	}
}

// testNearCounts checks that GetCountersNear returns what GetCounters
// returns.
func testNearCounts(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-counts")
	at := steadyNow()
	pushNear(t, f, ns, 0.5, nearDiff(at, "a", 1.5, 100, false), nearDiff(at, "a", 2, 100, true), nearDiff(at, "b", 4, 2, false))
	keys, sizes := []string{"a", "b", "none"}, []time.Duration{hour}
	want, err := f.GetCounters(testContext(t), ns, keys, sizes, at)
	if err != nil {
		t.Fatalf("GetCounters: %v", err)
	}
	got, marks, _, err := f.GetCountersNear(testContext(t), ns, keys, sizes, at, 0, nil)
	if err != nil {
		t.Fatalf("GetCountersNear: %v", err)
	}
	sortCounts(want)
	sortCounts(got)
	if !slices.Equal(got, want) || len(want) != 3 {
		t.Fatalf("GetCountersNear counts %v, want GetCounters' %v", got, want)
	}
	if len(marks) != 1 || marks[0].Key != "b" {
		t.Fatalf("GetCountersNear marks %v, want b's", marks)
	}
}

func sortCounts(c []window.Count) {
	slices.SortFunc(c, func(a, b window.Count) int {
		if a.Key != b.Key {
			return cmp.Compare(a.Key, b.Key)
		}
		return cmp.Compare(a.Start, b.Start)
	})
}

// testNearBound checks that a feed holds a bounded number of marks, and
// the newest: a flood of marks within one window leaves a reader at 0 at
// most nearBound of them, the last one included.
func testNearBound(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-bound")
	at := steadyNow()
	const n = 2 * nearBound
	diffs := make([]window.Diff, 0, 1000)
	var last window.Diff
	for i := range n {
		last = nearDiff(at, "k"+strconv.Itoa(i), 1, 1, false)
		diffs = append(diffs, last)
		if len(diffs) == cap(diffs) || i == n-1 {
			pushNear(t, f, ns, 1, diffs...)
			diffs = diffs[:0]
		}
	}
	got, _ := readNear(t, f, ns, 0)
	if len(got) == 0 || len(got) > nearBound || got[len(got)-1].key != last.Key {
		t.Fatalf("after %d marks, a reader at 0 read %d ending %v, want at most %d ending with %q", n, len(got), got[len(got)-1:], nearBound, last.Key)
	}
}

// nearBound is the most marks of one namespace a store may hold for the
// conformance suite: a flood of twice as many must leave at most
// that many.
const nearBound = 1 << 16

// testNearExpiry checks that marks end by themselves and leave nothing:
// the namespace's version goes back to 0.
func testNearExpiry(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-expiry")
	const size = 200 * time.Millisecond
	now := time.Now().UnixNano()
	d := window.Diff{Key: "short", Size: size, Start: window.Start(now, size), Value: 1, Limit: 1}
	pushNear(t, f, ns, 1, d)
	if got, _ := readNear(t, f, ns, 0); len(got) != 1 {
		t.Fatalf("marks %v, want the short one", got)
	}
	poll.Until(t, expiryWait, "the short mark to end and its namespace to hold nothing", func() bool {
		got, v := readNear(t, f, ns, 0)
		return len(got) == 0 && v == 0
	})
}

// testNearHostileKeys marks every hostile pair and reads each namespace's
// marks back as they were made.
func testNearHostileKeys(t *testing.T, f strategy.NearFeed) {
	at := steadyNow()
	pairs := hostilePairs(unique("near-hostile"))
	want := make(map[string][]string)
	for _, p := range pairs {
		pushNear(t, f, p.namespace, 1, nearDiff(at, p.key, 1, 1, false))
		want[p.namespace] = append(want[p.namespace], p.key)
	}
	for ns, keys := range want {
		got, _ := readNear(t, f, ns, 0)
		read := make([]string, len(got))
		for i, m := range got {
			read[i] = m.key
		}
		if !slices.Equal(read, keys) {
			t.Fatalf("namespace %q: marks of %q, want %q", ns, read, keys)
		}
	}
}

// testNearRejectsInput checks that a Near below 0 or not finite is
// refused with strategy.ErrRejected, before anything is applied.
func testNearRejectsInput(t *testing.T, f strategy.NearFeed) {
	ns := unique("near-input")
	at := steadyNow()
	for _, near := range []float64{-0.5, math.NaN(), math.Inf(1)} {
		d := nearDiff(at, "k", 1, 1, false)
		err := f.PushDiffs(testContext(t), strategy.Batch{ID: newID(), Namespace: ns, Diffs: []window.Diff{d}, Near: near})
		if !errors.Is(err, strategy.ErrRejected) {
			t.Fatalf("near %v: %v, want an error wrapping ErrRejected", near, err)
		}
	}
	counts, err := f.GetCounters(testContext(t), ns, []string{"k"}, []time.Duration{hour}, at)
	if err != nil || len(counts) != 0 {
		t.Fatalf("refused pushes left counts %v (%v), want none", counts, err)
	}
	if got, _ := readNear(t, f, ns, 0); len(got) != 0 {
		t.Fatalf("refused pushes marked %v", got)
	}
}
