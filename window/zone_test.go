package window

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

func TestNewZoneRejectsBadCapacity(t *testing.T) {
	for _, n := range []int{0, -1} {
		if _, err := NewZone(n, nil); err == nil {
			t.Errorf("NewZone(%d) accepted", n)
		}
	}
}

func TestNamespacesAreIsolated(t *testing.T) {
	z := mustZone(t, 100, fakeclock.New(base))
	a, b := mustNamespace(t, z, "a"), mustNamespace(t, z, "b")
	if again := mustNamespace(t, z, "a"); again != a {
		t.Fatal("the same name gave two handles")
	}
	a.Increment("k", time.Minute, 3)
	b.Increment("k", time.Minute, 5)
	if got := a.Read("k", time.Minute).Current; got != 3 {
		t.Errorf("a: %v, want 3", got)
	}
	if got := b.Read("k", time.Minute).Current; got != 5 {
		t.Errorf("b: %v, want 5", got)
	}
	if z.Len() != 2 {
		t.Errorf("zone holds %d keys, want 2", z.Len())
	}
}

func TestEvictionAtCapacity(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 10, clock)
	ns := mustNamespace(t, z, "e")
	for i := range 10 {
		ns.Increment("old"+strconv.Itoa(i), time.Minute, 1)
	}
	// Touch the first five again: CLOCK spares recently used keys.
	for i := range 5 {
		ns.Increment("old"+strconv.Itoa(i), time.Minute, 1)
	}
	for i := range 5 {
		ns.Increment("new"+strconv.Itoa(i), time.Minute, 1)
	}
	if z.Len() != 10 {
		t.Fatalf("zone holds %d keys, want 10", z.Len())
	}
	if z.Evictions() != 5 {
		t.Fatalf("evictions = %d, want 5", z.Evictions())
	}
	for i := range 5 {
		if got := ns.Read("new"+strconv.Itoa(i), time.Minute).Current; got != 1 {
			t.Errorf("new%d: %v, want 1", i, got)
		}
	}
	kept := 0
	for i := range 5 {
		kept += int(ns.Read("old"+strconv.Itoa(i), time.Minute).Current / 2)
	}
	if kept < 4 {
		t.Errorf("only %d of the 5 recently used keys survived", kept)
	}
}

// TestCapacityUnderFlood floods a zone with new keys from several
// goroutines: it never holds more than its capacity, and ends full.
func TestCapacityUnderFlood(t *testing.T) {
	const capacity = 5000
	z := mustZone(t, capacity, nil)
	ns := mustNamespace(t, z, "flood")
	var wg sync.WaitGroup
	stop, watched := make(chan struct{}), make(chan struct{})
	var maxSeen int
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			default:
				maxSeen = max(maxSeen, z.Len())
			}
		}
	}()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20000 {
				ns.Increment(strconv.Itoa(g)+"/"+strconv.Itoa(i), time.Minute, 1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-watched
	if z.Len() != capacity {
		t.Fatalf("zone holds %d keys after the flood, want %d", z.Len(), capacity)
	}
	if maxSeen > capacity {
		t.Fatalf("zone held %d keys at some point, capacity %d", maxSeen, capacity)
	}
	if want := uint64(8*20000 - capacity); z.Evictions() != want {
		t.Fatalf("evictions = %d, want %d", z.Evictions(), want)
	}
	live := 0
	for _, s := range z.current() {
		s.mu.Lock()
		live += s.live
		s.forEachLive(func(i int32, e *entry) {
			if s.find(e.hash, e.ns, s.keyOf(e)) != i {
				t.Errorf("entry %q is not found by its own key", s.keyOf(e))
			}
		})
		s.mu.Unlock()
	}
	if live != capacity {
		t.Fatalf("shards hold %d entries, zone says %d", live, capacity)
	}
}

func TestResize(t *testing.T) {
	z := mustZone(t, 1000, fakeclock.New(base))
	ns := mustNamespace(t, z, "r")
	for i := range 1000 {
		ns.Increment(strconv.Itoa(i), time.Minute, 1)
	}
	if err := z.Resize(2000); err != nil {
		t.Fatal(err)
	}
	if z.Len() != 1000 || z.Capacity() != 2000 {
		t.Fatalf("after growing: %d keys, capacity %d", z.Len(), z.Capacity())
	}
	if got := ns.Read("999", time.Minute).Current; got != 1 {
		t.Fatalf("growing lost a counter: %v", got)
	}
	if err := z.Resize(100); err != nil {
		t.Fatal(err)
	}
	if z.Len() != 100 {
		t.Fatalf("after shrinking: %d keys, want 100", z.Len())
	}
	if err := z.Resize(0); err == nil {
		t.Fatal("Resize(0) accepted")
	}
}

func TestSweepForgetsIdleKeys(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	ns := mustNamespace(t, z, "s")
	ns.Increment("idle", time.Second, 1)
	ns.Increment("busy", time.Minute, 1)
	clock.Advance(1500 * time.Millisecond)
	z.Sweep()
	if z.Len() != 2 {
		t.Fatalf("swept a key whose previous window still counts: %d keys", z.Len())
	}
	clock.Advance(time.Second)
	z.Sweep()
	if z.Len() != 1 {
		t.Fatalf("after two windows: %d keys, want 1", z.Len())
	}
	if got := ns.Read("busy", time.Minute).Current; got != 1 {
		t.Fatalf("sweep lost a live counter: %v", got)
	}
	// A freed slot is reused.
	ns.Increment("next", time.Second, 1)
	if z.Len() != 2 {
		t.Fatalf("zone holds %d keys, want 2", z.Len())
	}
}

func TestMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a large zone")
	}
	perKey := heapPerKey(t, 200_000)
	t.Logf("%.1f heap bytes per key", perKey)
	if perKey > 150 {
		t.Fatalf("%.1f heap bytes per key, want at most 150", perKey)
	}
}

// TestResizeReshards grows a small zone into a large one and back while
// hits and syncs go on: the shard count follows the capacity, and no hit
// is lost or counted twice.
func TestResizeReshards(t *testing.T) {
	z := mustZone(t, 20, fakeclock.New(base))
	ns := mustNamespace(t, z, "r")
	ns.SetTracked(true)
	if n := len(z.current()); n != 1 {
		t.Fatalf("a zone of 20 has %d shards, want 1", n)
	}
	const keys, perWorker = 20, 5000
	var wg sync.WaitGroup
	var taken atomic.Int64
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				ns.Increment(strconv.Itoa((g*perWorker+i)%keys), time.Minute, 1)
			}
		}()
	}
	syncer := make(chan struct{})
	go func() {
		defer close(syncer)
		for {
			diffs, _ := ns.Take()
			taken.Add(int64(sum(diffs)))
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	for i := range 20 {
		capacity := []int{100_000, 20}[i%2]
		if err := z.Resize(capacity); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	close(stop)
	<-syncer
	diffs, _ := ns.Take()
	taken.Add(int64(sum(diffs)))
	if got := taken.Load(); got != 4*perWorker {
		t.Fatalf("took %d hits, want %d", got, 4*perWorker)
	}
	if err := z.Resize(1_000_000); err != nil {
		t.Fatal(err)
	}
	if n := len(z.current()); n != maxShards {
		t.Fatalf("a zone of 1000000 has %d shards, want %d", n, maxShards)
	}
	total := 0.0
	for i := range keys {
		total += ns.Read(strconv.Itoa(i), time.Minute).Current
	}
	if total != 4*perWorker || z.Len() != keys {
		t.Fatalf("after resizing: %v hits in %d keys, want %d in %d", total, z.Len(), 4*perWorker, keys)
	}
}
