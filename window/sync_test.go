package window

import (
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
)

func TestTakeMovesDiffsIntoSynced(t *testing.T) {
	clock := fakeclock.New(base.Add(10 * time.Second))
	ns := mustNamespace(t, mustZone(t, 100, clock), "t")
	ns.SetTracked(true)
	ns.Increment("a", time.Minute, 2)
	ns.Increment("a", time.Minute, 3)
	ns.Increment("b", time.Second, 1.5)
	ns.Read("c", time.Minute) // unknown keys are not created by reads
	if ns.Pending() != 2 {
		t.Fatalf("pending = %d, want 2", ns.Pending())
	}
	diffs, keys := ns.Take()
	want := map[Diff]bool{
		{Key: "a", Size: time.Minute, Start: base.UnixNano(), Value: 5}:                         true,
		{Key: "b", Size: time.Second, Start: base.Add(10 * time.Second).UnixNano(), Value: 1.5}: true,
	}
	if len(diffs) != len(want) {
		t.Fatalf("took %+v, want %v", diffs, want)
	}
	for _, d := range diffs {
		if !want[d] {
			t.Errorf("unexpected diff %+v", d)
		}
	}
	if len(keys) != 2 {
		t.Errorf("touched keys %q, want a and b", keys)
	}
	if got := ns.Read("a", time.Minute).Current; got != 5 {
		t.Fatalf("taking changed the visible count: %v", got)
	}
	if ns.Pending() != 0 {
		t.Fatalf("pending after take = %d", ns.Pending())
	}
	ns.Read("a", time.Minute)
	diffs, keys = ns.Take()
	if len(diffs) != 0 || len(keys) != 1 || keys[0] != "a" {
		t.Fatalf("second take: diffs %+v keys %q, want no diffs and the read key", diffs, keys)
	}
}

func TestUntrackedNamespaceKeepsNoLists(t *testing.T) {
	ns := mustNamespace(t, mustZone(t, 100, fakeclock.New(base)), "local")
	ns.Increment("a", time.Minute, 1)
	if diffs, keys := ns.Take(); diffs != nil || keys != nil {
		t.Fatalf("untracked take: %v %v", diffs, keys)
	}
	ns.SetTracked(true)
	diffs, _ := ns.Take()
	if len(diffs) != 1 || diffs[0].Value != 1 {
		t.Fatalf("tracking did not pick up the earlier diff: %+v", diffs)
	}
}

func TestRestoreAfterFailedPush(t *testing.T) {
	clock := fakeclock.New(base.Add(time.Second))
	ns := mustNamespace(t, mustZone(t, 100, clock), "r")
	ns.SetTracked(true)
	ns.Increment("a", time.Minute, 4)
	first, _ := ns.Take()
	ns.Increment("a", time.Minute, 1) // arrives while the push is out
	ns.Restore(first)
	if got := ns.Read("a", time.Minute).Current; got != 5 {
		t.Fatalf("visible count after restore = %v, want 5", got)
	}
	again, _ := ns.Take()
	if len(again) != 1 || again[0].Value != 5 {
		t.Fatalf("take after restore = %+v, want one diff of 5", again)
	}
}

func TestApplySetsSyncedAndKeepsNewDiffs(t *testing.T) {
	clock := fakeclock.New(base.Add(30 * time.Second))
	ns := mustNamespace(t, mustZone(t, 100, clock), "a")
	ns.SetTracked(true)
	ns.Increment("k", time.Minute, 2)
	ns.Take()
	ns.Increment("k", time.Minute, 1) // not pushed yet
	ns.Apply([]Count{
		{Key: "k", Size: time.Minute, Start: base.UnixNano(), Value: 50},                   // 2 of ours + 48 of other nodes
		{Key: "k", Size: time.Minute, Start: base.Add(-time.Minute).UnixNano(), Value: 40}, // previous window
		{Key: "gone", Size: time.Minute, Start: base.UnixNano(), Value: 9},                 // not held: ignored
	})
	s := ns.Read("k", time.Minute)
	if s.Current != 51 || s.Previous != 40 || s.Sliding() != 71 {
		t.Fatalf("after apply: %+v (sliding %v), want current 51, previous 40, sliding 71", s, s.Sliding())
	}
	if got := ns.Read("gone", time.Minute).Current; got != 0 {
		t.Fatalf("apply created a key: %v", got)
	}
}

func TestEvictedDiffsAreStillTaken(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 16, clock)
	ns := mustNamespace(t, z, "o")
	ns.SetTracked(true)
	for i := range 40 {
		ns.Increment("k"+strconv.Itoa(i), time.Minute, 1)
	}
	if z.Evictions() != 24 {
		t.Fatalf("evictions = %d, want 24", z.Evictions())
	}
	diffs, _ := ns.Take()
	if got := sum(diffs); got != 40 {
		t.Fatalf("took %v, want every one of the 40 hits", got)
	}
	// Orphans are bounded too: past twice the zone's room they are dropped,
	// and counted.
	for i := range 1000 {
		ns.Increment("flood"+strconv.Itoa(i), time.Minute, 1)
	}
	diffs, _ = ns.Take()
	if got := sum(diffs) + float64(z.Dropped()); got != 1000 || z.Dropped() == 0 {
		t.Fatalf("took %v and dropped %d of 1000 hits", sum(diffs), z.Dropped())
	}
	// A restored diff whose key is gone waits for the next take.
	ns.Restore([]Diff{{Key: "k0", Size: time.Minute, Start: base.UnixNano(), Value: 7}})
	if diffs, _ := ns.Take(); sum(diffs) != 7 {
		t.Fatalf("restored orphan: took %+v, want 7", diffs)
	}
	// Diffs of expired windows are not worth keeping.
	ns.Restore([]Diff{{Key: "k0", Size: time.Second, Start: base.Add(-2 * time.Second).UnixNano(), Value: 1}})
	if diffs, _ := ns.Take(); len(diffs) != 0 {
		t.Fatalf("kept an expired diff: %+v", diffs)
	}
}

func TestDiffsSurviveWindowRotation(t *testing.T) {
	clock := fakeclock.New(base)
	ns := mustNamespace(t, mustZone(t, 16, clock), "rot")
	ns.SetTracked(true)
	ns.Increment("k", time.Second, 3)
	clock.Advance(time.Second)
	ns.Increment("k", time.Second, 2)
	diffs, _ := ns.Take()
	if len(diffs) != 2 || sum(diffs) != 5 {
		t.Fatalf("took %+v, want the 3 of the previous window and the 2 of this one", diffs)
	}
}

// TestSyncRace runs hits against a sync loop that takes diffs, loses half
// of its pushes (restoring them) and applies store totals for the rest.
// Every hit must reach the fake store exactly once, and the visible count
// of a key only ever grows.
func TestSyncRace(t *testing.T) {
	clock := fakeclock.New(base)
	ns := mustNamespace(t, mustZone(t, 1000, clock), "race")
	ns.SetTracked(true)
	store := map[Diff]float64{} // by (key, size, start), value 0
	push := func(diffs []Diff) {
		for _, d := range diffs {
			id := d
			id.Value = 0
			store[id] += d.Value
		}
	}
	var hits atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 20000 {
				ns.Increment("k"+strconv.Itoa(r.IntN(50)), time.Hour, 1)
				hits.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() { // one key watched for dips
		defer wg.Done()
		last := 0.0
		for {
			select {
			case <-done:
				return
			default:
			}
			c := ns.Read("k0", time.Hour).Current
			if c < last {
				t.Errorf("visible count dipped from %v to %v", last, c)
				return
			}
			last = c
		}
	}()
	syncDone := make(chan struct{})
	go func() {
		defer close(syncDone)
		r := rand.New(rand.NewPCG(9, 9))
		for {
			select {
			case <-done:
				return
			default:
			}
			diffs, keys := ns.Take()
			if r.IntN(2) == 0 {
				ns.Restore(diffs)
				continue
			}
			push(diffs)
			var counts []Count
			for _, k := range keys {
				id := Diff{Key: k, Size: time.Hour, Start: Start(clock.UnixNano(), time.Hour)}
				counts = append(counts, Count{Key: k, Size: id.Size, Start: id.Start, Value: store[id]})
			}
			ns.Apply(counts)
		}
	}()
	poll.Until(t, 2*time.Minute, "80000 hits", func() bool { return hits.Load() >= 80000 })
	close(done)
	wg.Wait()
	<-syncDone
	final, _ := ns.Take()
	push(final)
	total := 0.0
	for _, v := range store {
		total += v
	}
	if total != 80000 {
		t.Fatalf("store holds %v hits, want 80000", total)
	}
	visible := 0.0
	for i := range 50 {
		visible += ns.Read("k"+strconv.Itoa(i), time.Hour).Current
	}
	if visible != 80000 {
		t.Fatalf("zone shows %v hits, want 80000", visible)
	}
}

func sum(diffs []Diff) float64 {
	s := 0.0
	for _, d := range diffs {
		s += d.Value
	}
	return s
}

func TestObserve(t *testing.T) {
	clock := fakeclock.New(base.Add(15 * time.Second))
	ns := mustNamespace(t, mustZone(t, 10, clock), "obs")
	ns.SetTracked(true)
	s := ns.Observe("k", time.Minute, base.UnixNano(), 7, 20)
	if s.Current != 7 || s.Previous != 20 || s.Sliding() != 22 {
		t.Fatalf("observe = %+v, want current 7, previous 20, sliding 22", s)
	}
	if ns.Pending() != 0 {
		t.Fatalf("observed counts are not pending diffs: %d", ns.Pending())
	}
	ns.Increment("k", time.Minute, 1) // a hit the store did not take
	s = ns.Observe("k", time.Minute, base.UnixNano(), 8, 20)
	if s.Current != 9 {
		t.Fatalf("observe kept %v, want the store's 8 plus the pending 1", s.Current)
	}
}

func TestPendingCountsEvictedDiffs(t *testing.T) {
	z := mustZone(t, 16, fakeclock.New(base))
	ns := mustNamespace(t, z, "p")
	ns.SetTracked(true)
	for i := range 20 {
		ns.Increment("k"+strconv.Itoa(i), time.Minute, 1)
	}
	if ns.Pending() != 20 {
		t.Fatalf("pending = %d, want 16 held keys and 4 evicted", ns.Pending())
	}
	ns.Take()
	if ns.Pending() != 0 {
		t.Fatalf("pending after take = %d", ns.Pending())
	}
}

func TestIncrementSyncedIsNeverPushed(t *testing.T) {
	ns := mustNamespace(t, mustZone(t, 10, fakeclock.New(base)), "s")
	ns.SetTracked(true)
	ns.IncrementSynced("k", time.Minute, 2)
	s := ns.Increment("k", time.Minute, 1)
	if s.Current != 3 {
		t.Fatalf("current = %v, want 3", s.Current)
	}
	diffs, _ := ns.Take()
	if len(diffs) != 1 || diffs[0].Value != 1 {
		t.Fatalf("took %+v, want only the plain increment of 1", diffs)
	}
}

func TestApplyAddsNoEmptyWindows(t *testing.T) {
	ns := mustNamespace(t, mustZone(t, 10, fakeclock.New(base)), "a")
	ns.Increment("k", time.Minute, 1)
	ns.Apply([]Count{{Key: "k", Size: time.Hour, Start: Start(base.UnixNano(), time.Hour), Value: 0}})
	z := ns.Zone()
	for _, s := range z.current() {
		s.forEachLive(func(_ int32, e *entry) {
			if e.more != 0 {
				t.Fatalf("a zero count added a window size: %+v", s.extraAt(e.more-1))
			}
		})
	}
}

// TestEvictedDiffsWithinTwiceTheCapacity evicts, without a take, just
// under twice the zone's capacity of keys with a diff: however unevenly
// they fall on the shards, none is dropped (at 1,999 of them over 32
// shards, one shard holds at least 63: more than twice its share), and
// the namespace's Backlog says it is time to take them.
func TestEvictedDiffsWithinTwiceTheCapacity(t *testing.T) {
	const capacity = 1000
	z := mustZone(t, capacity, fakeclock.New(base))
	if n := len(z.current()); n != 32 {
		t.Fatalf("%d shards, want 32 for the pigeonhole below", n)
	}
	ns := mustNamespace(t, z, "o")
	ns.SetTracked(true)
	const evicted = 2*capacity - 1
	for i := range capacity + evicted {
		ns.Increment("k"+strconv.Itoa(i), time.Minute, 1)
	}
	if z.Dropped() != 0 {
		t.Fatalf("%d diffs of evicted keys dropped with %d waiting, want none under %d", z.Dropped(), evicted, 2*capacity)
	}
	select {
	case <-ns.Backlog():
	default:
		t.Fatal("no backlog signalled with more diffs of evicted keys waiting than the zone holds keys")
	}
	diffs, _ := ns.Take()
	if got := sum(diffs); got != capacity+evicted {
		t.Fatalf("took %v, want every one of the %d hits", got, capacity+evicted)
	}
	// Past twice the capacity they are dropped, and the zone's memory
	// stays bounded.
	const flood = 4 * capacity // the first capacity evict keys taken already
	for i := range flood {
		ns.Increment("flood"+strconv.Itoa(i), time.Minute, 1)
	}
	if z.Dropped() == 0 || z.orphaned.Load() > 2*capacity {
		t.Fatalf("dropped %d, %d waiting: want drops, and at most %d waiting", z.Dropped(), z.orphaned.Load(), 2*capacity)
	}
	diffs, _ = ns.Take()
	if got := sum(diffs) + float64(z.Dropped()); got != flood {
		t.Fatalf("took %v and dropped %d of %d hits", sum(diffs), z.Dropped(), flood)
	}
	if z.orphaned.Load() != 0 {
		t.Fatalf("%d diffs of evicted keys counted after the take, want 0", z.orphaned.Load())
	}
}

// A diff of a key's newest window carries the node's count of the window
// before (the store's, as last applied, plus the node's own hits); a diff
// of the window before carries none.
func TestTakeCarriesThePreviousWindowsCount(t *testing.T) {
	clock := fakeclock.New(base.Add(30 * time.Second))
	ns := mustNamespace(t, mustZone(t, 100, clock), "p")
	ns.SetTracked(true)
	ns.Increment("k", time.Minute, 2)
	ns.Take()
	ns.Apply([]Count{{Key: "k", Size: time.Minute, Start: base.UnixNano(), Value: 7}}) // 2 of ours, 5 of others
	ns.Increment("k", time.Minute, 1)                                                  // not pushed: counts too
	clock.Advance(time.Minute)
	ns.Increment("k", time.Minute, 4)
	diffs, _ := ns.Take()
	want := map[int64]Diff{
		base.UnixNano():                  {Key: "k", Size: time.Minute, Start: base.UnixNano(), Value: 1},
		base.Add(time.Minute).UnixNano(): {Key: "k", Size: time.Minute, Start: base.Add(time.Minute).UnixNano(), Value: 4, Previous: 8},
	}
	if len(diffs) != len(want) {
		t.Fatalf("took %+v, want %v", diffs, want)
	}
	for _, d := range diffs {
		if d != want[d.Start] {
			t.Errorf("took %+v, want %+v", d, want[d.Start])
		}
	}
}
