package window

import (
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

func TestResetZeroesEveryWindowAndDropsDiffs(t *testing.T) {
	clock := fakeclock.New(base)
	ns := mustNamespace(t, mustZone(t, 100, clock), "t")
	ns.SetTracked(true)
	ns.Increment("a", time.Minute, 4)
	ns.Increment("a", time.Second, 1)
	ns.Increment("b", time.Minute, 2)
	ns.Take() // pushed: the synced part
	ns.Apply([]Count{{Key: "a", Size: time.Minute, Start: base.UnixNano(), Value: 9}})
	clock.Advance(time.Minute + 30*time.Second) // a's minute is now the previous one
	ns.Increment("a", time.Minute, 3)           // pending
	if s := ns.Read("a", time.Minute); s.Current != 3 || s.Previous != 9 {
		t.Fatalf("before the reset: %+v, want current 3 and previous 9", s)
	}
	if ns.Pending() != 1 {
		t.Fatalf("pending = %d, want 1", ns.Pending())
	}
	ns.Take()
	ns.Increment("a", time.Minute, 1)

	sizes := ns.Reset("a")
	if !slices.Equal(sizes, []time.Duration{time.Second, time.Minute}) {
		t.Fatalf("reset returned sizes %v, want [1s 1m0s]", sizes)
	}
	for _, size := range sizes {
		if s := ns.Read("a", size); s.Current != 0 || s.Previous != 0 {
			t.Errorf("window %v after the reset: %+v, want zeros", size, s)
		}
	}
	if ns.Pending() != 0 {
		t.Fatalf("pending after the reset = %d, want 0: the diffs of a reset key are dropped", ns.Pending())
	}
	if s := ns.Read("b", time.Minute); s.Previous != 2 {
		t.Fatalf("the reset changed another key: %+v", s)
	}
	diffs, keys := ns.Take()
	if len(diffs) != 0 {
		t.Fatalf("took %+v after the reset, want nothing", diffs)
	}
	if !slices.Contains(keys, "a") {
		t.Fatalf("touched keys %q: a reset key must be fetched at the next sync", keys)
	}
	// Later hits count from zero and are pushed.
	ns.Increment("a", time.Minute, 2)
	if diffs, _ := ns.Take(); sum(diffs) != 2 {
		t.Fatalf("took %+v after a hit that followed the reset, want 2", diffs)
	}
	if s := ns.Read("a", time.Minute); s.Current != 2 || s.Previous != 0 {
		t.Fatalf("after a hit that followed the reset: %+v, want current 2", s)
	}
	// The store's reset reaches this node through Apply, as zeros.
	ns.Apply([]Count{{Key: "a", Size: time.Minute, Start: Start(clock.UnixNano(), time.Minute), Value: 0}})
	if s := ns.Read("a", time.Minute); s.Current != 0 {
		t.Fatalf("after applying a zero count: %+v", s)
	}
}

func TestResetDropsDiffsOfEvictedKeys(t *testing.T) {
	z := mustZone(t, 16, fakeclock.New(base))
	ns := mustNamespace(t, z, "o")
	ns.SetTracked(true)
	ns.Increment("a", time.Minute, 5)
	for i := range 40 {
		ns.Increment("k"+strconv.Itoa(i), time.Minute, 1)
	}
	if ns.Read("a", time.Minute).Current != 0 {
		t.Fatal("key a was not evicted; the test needs it gone")
	}
	before := ns.Pending()
	if sizes := ns.Reset("a"); sizes != nil {
		t.Fatalf("reset of a key the zone does not hold returned sizes %v", sizes)
	}
	if ns.Pending() != before-1 {
		t.Fatalf("pending %d after the reset, want %d: the evicted key's diff must go", ns.Pending(), before-1)
	}
	diffs, _ := ns.Take()
	for _, d := range diffs {
		if d.Key == "a" {
			t.Fatalf("took a diff of the reset key: %+v", d)
		}
	}
	if got := sum(diffs); got != 40 {
		t.Fatalf("took %v, want the 40 hits of the other keys", got)
	}
}

// TestResetRacesWithHits resets a key while goroutines hit it and a sync
// loop pushes to a store the test plays: the store and the zone end up
// agreeing, every hit that ended before the last reset began is erased,
// and every hit that began after it ended counts, once.
func TestResetRacesWithHits(t *testing.T) {
	ns := mustNamespace(t, mustZone(t, 100, fakeclock.New(base)), "race")
	ns.SetTracked(true)
	var store float64 // the store's count: only this goroutine writes it
	var started, done atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				started.Add(1)
				ns.Increment("k", time.Minute, 1)
				done.Add(1)
				ns.Read("k", time.Minute)
			}
		})
	}
	sync := func() {
		diffs, _ := ns.Take()
		store += sum(diffs)
	}
	var before, after int64 // hits ended before the last reset, begun by its end
	resets := 0
	lastReset, end := time.Now().Add(150*time.Millisecond), time.Now().Add(200*time.Millisecond)
	for i := 0; time.Now().Before(end); i++ {
		// As a sync loop does: a reset happens between runs, never
		// between a Take and the push of what it took.
		if i%3 == 0 && time.Now().Before(lastReset) {
			before = done.Load()
			ns.Reset("k")
			store = 0
			after = started.Load()
			resets++
		}
		sync()
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	sync()
	hits := done.Load()
	if got := ns.Read("k", time.Minute).Current; got != store {
		t.Fatalf("the zone counts %v and the store %v", got, store)
	}
	if store > float64(hits-before) || store < float64(hits-after) {
		t.Fatalf("the store counts %v: want between %d (hits begun after the last reset) and %d (hits not ended before it)",
			store, hits-after, hits-before)
	}
	t.Logf("%d hits, %d resets; %d hits began after the last reset", hits, resets, hits-after)

	// Hits not yet pushed at a reset are dropped with it.
	for range 5 {
		ns.Increment("k", time.Minute, 1)
	}
	ns.Reset("k")
	store = 0
	for range 7 {
		ns.Increment("k", time.Minute, 1)
	}
	sync()
	if got := ns.Read("k", time.Minute).Current; got != 7 || store != 7 {
		t.Fatalf("5 hits, a reset, 7 hits: zone %v, store %v; want 7 and 7", got, store)
	}
}

func TestInspect(t *testing.T) {
	clock := fakeclock.New(base.Add(15 * time.Second))
	ns := mustNamespace(t, mustZone(t, 100, clock), "i")
	ns.SetTracked(true)
	if got := ns.Inspect("a"); got != nil {
		t.Fatalf("inspecting a key the zone does not hold: %+v", got)
	}
	ns.Increment("a", time.Minute, 4)
	ns.Increment("a", time.Second, 1)
	ns.Take()
	ns.Increment("a", time.Minute, 2)
	clock.Advance(time.Minute)
	ns.Increment("a", time.Minute, 1.5)
	ns.Take() // the touched list is empty now

	got := ns.Inspect("a")
	want := []KeyWindow{
		{Sample: Sample{Current: 0, Previous: 0, Weight: 1, Start: base.Add(75 * time.Second).UnixNano(), Size: time.Second, At: base.Add(75 * time.Second).UnixNano()}},
		{Sample: Sample{Current: 1.5, Previous: 6, Weight: 0.75, Start: base.Add(time.Minute).UnixNano(), Size: time.Minute, At: base.Add(75 * time.Second).UnixNano()}},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("inspect = %+v\nwant      %+v", got, want)
	}
	ns.Increment("a", time.Minute, 1)
	ns.Restore([]Diff{{Key: "a", Size: time.Minute, Start: base.UnixNano(), Value: 2}}) // a failed push
	w := ns.Inspect("a")[1]
	if w.Current != 2.5 || w.PendingCurrent != 1 || w.Previous != 6 || w.PendingPrevious != 2 {
		t.Fatalf("pending parts: %+v, want current 2.5 of which 1 pending, previous 6 of which 2 pending", w)
	}
	ns.Take()
	ns.Inspect("a")
	if _, keys := ns.Take(); len(keys) != 0 {
		t.Fatalf("inspect touched %q: it must change nothing", keys)
	}
}

func TestLenCountsTheNamespaceKeys(t *testing.T) {
	z := mustZone(t, 1000, fakeclock.New(base))
	a, b := mustNamespace(t, z, "a"), mustNamespace(t, z, "b")
	for i := range 30 {
		a.Increment("k"+strconv.Itoa(i), time.Minute, 1)
	}
	for i := range 12 {
		b.Increment("k"+strconv.Itoa(i), time.Second, 1)
	}
	if a.Len() != 30 || b.Len() != 12 || z.Len() != 42 {
		t.Fatalf("a holds %d keys, b %d, the zone %d; want 30, 12, 42", a.Len(), b.Len(), z.Len())
	}
}
