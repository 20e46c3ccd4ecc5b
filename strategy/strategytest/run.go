package strategytest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// The window sizes of the tests that check counts. They are long, so that
// the windows a test writes stay current, and its previous windows alive,
// while it runs; steadyNow keeps a test from starting just before they
// roll over. Every one is a multiple of an hour, so they roll together.
const (
	hour     = time.Hour
	twoHours = 2 * time.Hour
	day      = 24 * time.Hour
)

// callTimeout bounds every subtest's calls to the store, so that a hung
// store fails the test instead of the whole run.
const callTimeout = time.Minute

// Run runs the conformance suite against the store that h opens, as
// subtests of t (see the package documentation). They run one after the
// other, so that Harness.Cost sees only the work of the fetch it measures.
// Stores that implement strategy.Hitter, strategy.Slotter or
// strategy.Banner are checked as such too.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("strategytest: Harness.Open is nil")
	}
	if h.Counters == nil {
		t.Fatal("strategytest: Harness.Counters is nil: the expiry test needs it")
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Harness)
	}{
		{"PushFetch", testPushFetch},
		{"RetriedBatch", testRetriedBatch},
		{"PartialFailure", testPartialFailure},
		{"ManyDiffs", testManyDiffs},
		{"HostileKeys", testHostileKeys},
		{"Reset", testReset},
		{"Expiry", testExpiry},
		{"FetchCost", testFetchCost},
		{"ConcurrentPushes", testConcurrentPushes},
		{"InvalidWindows", testInvalidWindows},
		{"CalendarWindows", testCalendarWindows},
		{"Hit", testHit},
		{"HitBatch", testHitBatch},
		{"Slots", testSlots},
		{"Bans", testBans},
		{"Roster", testRoster},
		{"Near", testNear},
		{"Rate", testRate},
		{"RateBatch", testRateBatch},
		{"SlotBatch", testSlotBatch},
		{"Close", testClose},
		{"Parts", testParts}, // last: a part it fails comes back empty
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, h) })
	}
}

// open opens a store and closes it when the test ends.
func (h Harness) open(t *testing.T) strategy.Store {
	t.Helper()
	s := h.Open(t)
	if s == nil {
		t.Fatal("Harness.Open returned a nil store")
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	return s
}

// testContext returns a context for a test's calls to the store.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// unique returns a name no other test uses, so that tests (and test runs)
// sharing one server never see each other's counters.
func unique(what string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	return "strategytest-" + what + "-" + hex.EncodeToString(b[:])
}

// newID returns a new batch or hit ID.
func newID() string { return unique("id") }

// steadyNow returns the time at which a test chooses its windows: now,
// unless the hour-long windows are about to roll over, in which case it
// waits for the new hour (see SteadyNow). A previous window expires when
// the window after the current one starts, so a test that chose its
// windows a moment before that could see its previous-window counters
// skipped as expired.
func steadyNow() time.Time { return SteadyNow(5 * time.Second) }

// SteadyNow returns now, unless the current hour (and so the current
// window of every size that divides an hour) ends within margin, in which
// case it waits for the new hour and returns the time then: a test that
// counts in the windows of now and takes less than margin never sees
// them roll over.
func SteadyNow(margin time.Duration) time.Time {
	now := time.Now()
	end := window.Start(now.UnixNano(), hour) + int64(hour)
	if left := time.Duration(end - now.UnixNano()); left < margin {
		time.Sleep(left + 10*time.Millisecond) // the hour's end: a deadline, not an event
		now = time.Now()
	}
	return now
}

// cur and prev return the starts of the current and previous windows of a
// size at now (Unix nanoseconds).
func cur(now int64, size time.Duration) int64  { return window.Start(now, size) }
func prev(now int64, size time.Duration) int64 { return window.Start(now, size) - int64(size) }

// win names one counter of a namespace.
type win struct {
	key   string
	size  time.Duration
	start int64
}

func (w win) String() string {
	key := w.key
	if len(key) > 40 {
		key = fmt.Sprintf("%s...(%d bytes)", key[:40], len(key))
	}
	return fmt.Sprintf("(key %q, size %v, start %d)", key, w.size, w.start)
}

// counts are counter values by counter.
type counts map[win]float64

// add adds diffs to the counts, as a store should.
func (c counts) add(diffs ...window.Diff) counts {
	for _, d := range diffs {
		c[win{d.Key, d.Size, d.Start}] += d.Value
	}
	return c
}

// push pushes diffs as a batch of a new ID and returns the ID.
func push(t *testing.T, ctx context.Context, s strategy.Store, namespace string, diffs ...window.Diff) string {
	t.Helper()
	id := newID()
	if err := s.PushDiffs(ctx, strategy.Batch{ID: id, Namespace: namespace, Diffs: diffs}); err != nil {
		t.Fatalf("pushing %d diffs: %v", len(diffs), err)
	}
	return id
}

// fetch fetches counters and checks that the store returned only counters
// that were asked for, each once.
func fetch(t *testing.T, ctx context.Context, s strategy.Store, namespace string, keys []string, sizes []time.Duration, now time.Time) counts {
	t.Helper()
	list, err := s.GetCounters(ctx, namespace, keys, sizes, now)
	if err != nil {
		t.Fatalf("fetching %d keys: %v", len(keys), err)
	}
	asked := make(map[win]bool, 2*len(keys)*len(sizes))
	for _, key := range keys {
		for _, size := range sizes {
			asked[win{key, size, cur(now.UnixNano(), size)}] = true
			asked[win{key, size, prev(now.UnixNano(), size)}] = true
		}
	}
	got := make(counts, len(list))
	for _, c := range list {
		w := win{c.Key, c.Size, c.Start}
		if !asked[w] {
			t.Errorf("the store returned counter %v = %v, which was not asked for", w, c.Value)
			continue
		}
		if _, dup := got[w]; dup {
			t.Errorf("the store returned counter %v twice", w)
		}
		got[w] = c.Value
	}
	return got
}

// assertCounts fails the test unless got and want hold the same counters
// with the same values, exactly: the tests add binary fractions, which
// every store sums without rounding.
func assertCounts(t *testing.T, what string, got, want counts) {
	t.Helper()
	var problems []string
	for w, v := range want {
		g, ok := got[w]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("counter %v is missing, want %v", w, v))
		case g != v:
			problems = append(problems, fmt.Sprintf("counter %v = %v, want %v", w, g, v))
		}
	}
	for w, g := range got {
		if _, ok := want[w]; !ok {
			problems = append(problems, fmt.Sprintf("counter %v = %v, want it omitted", w, g))
		}
	}
	if len(problems) == 0 {
		return
	}
	slices.Sort(problems)
	const most = 20
	if n := len(problems); n > most {
		problems = append(problems[:most], fmt.Sprintf("and %d more", n-most))
	}
	t.Errorf("%s: %d counters differ:\n\t%s", what, len(problems), strings.Join(problems, "\n\t"))
}

// keysOf returns the distinct keys of a set of counts, sorted.
func keysOf(c counts) []string {
	var keys []string
	for w := range c {
		keys = append(keys, w.key)
	}
	slices.SortFunc(keys, cmp.Compare)
	return slices.Compact(keys)
}
