package memory

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// newTestStore returns a store of a private data set on a fake clock that
// starts at the beginning of an hour.
func newTestStore() (*Store, *fakeclock.Clock) {
	s := newStore(newData())
	c := fakeclock.New(time.Unix(0, window.Start(time.Now().UnixNano(), time.Hour)))
	s.now = c.Now
	return s, c
}

// marked reports whether the batch or hit ID id of namespace ns is marked
// as applied, at the store's clock.
func marked(s *Store, id string) bool {
	_, ok := s.data.markers.get(marker{"ns", id}, s.now().UnixNano())
	return ok
}

func TestCountersExpireAtStartPlusTwiceTheSize(t *testing.T) {
	s, clock := newTestStore()
	ctx := t.Context()
	const size = time.Second
	start := clock.UnixNano()
	d := window.Diff{Key: "k", Size: size, Start: start, Value: 1}
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "1", Namespace: "ns", Diffs: []window.Diff{d}}); err != nil {
		t.Fatal(err)
	}
	fetch := func() int {
		// Asked at the window after it, the counter is the previous one.
		counts, err := s.GetCounters(ctx, "ns", []string{"k"}, []time.Duration{size}, time.Unix(0, start).Add(size))
		if err != nil {
			t.Fatal(err)
		}
		return len(counts)
	}
	clock.Advance(2*size - 1)
	if n, m := fetch(), s.Counters("ns"); n != 1 || m != 1 {
		t.Fatalf("a nanosecond before expiry: fetched %d counters and held %d, want 1 and 1", n, m)
	}
	clock.Advance(1)
	if n := fetch(); n != 0 {
		t.Fatalf("at expiry, before a sweep: fetched %d counters, want 0", n)
	}
	if n := s.Counters("ns"); n != 0 {
		t.Fatalf("at expiry: held %d counters, want 0", n)
	}
	if len(s.data.counters.m) != 0 || len(s.data.counters.q) != 0 {
		t.Error("an expired counter was kept")
	}
	// A diff of an expired window is not stored, and records no ID.
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "2", Namespace: "ns", Diffs: []window.Diff{d}}); err != nil {
		t.Fatal(err)
	}
	if n, marked := s.Counters("ns"), marked(s, "2"); n != 0 || marked {
		t.Errorf("after a push of an expired window: %d counters, ID recorded: %v; want none", n, marked)
	}
}

func TestSweepsKeepMemoryBounded(t *testing.T) {
	s, clock := newTestStore()
	ctx := t.Context()
	const size = 10 * time.Millisecond
	ws := func() []strategy.WindowHit {
		return []strategy.WindowHit{{Size: size, Start: window.Start(clock.UnixNano(), size), Value: 1, Max: 5}}
	}
	// Ten minutes of traffic: a batch and a hit with an ID every 10ms, each
	// on new keys.
	for i := range 60_000 {
		start := window.Start(clock.UnixNano(), size)
		diffs := []window.Diff{{Key: fmt.Sprintf("b%d", i), Size: size, Start: start, Value: 1}}
		if err := s.PushDiffs(ctx, strategy.Batch{ID: fmt.Sprint("b", i), Namespace: "ns", Diffs: diffs}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Hit(ctx, "ns", fmt.Sprintf("h%d", i), fmt.Sprint("h", i), ws(), false); err != nil {
			t.Fatal(err)
		}
		clock.Advance(size)
	}
	d := s.data
	// Counters live 20ms, batch markers 5s, hit markers a minute (at least).
	if n := s.Counters("ns"); n > 4 {
		t.Errorf("%d counters are held, want at most 4", n)
	}
	if n, most := len(d.markers.m), 500+6000+2; n > most {
		t.Errorf("%d markers are held, want at most %d", n, most)
	}
	if n, m := len(d.counters.q)+len(d.markers.q), len(d.markers.m)+s.Counters("ns"); n != m {
		t.Errorf("the expiry heaps hold %d entries for %d counters and markers", n, m)
	}
	// Once all has expired, nothing is left, and the heap gave back its
	// memory.
	clock.Advance(strategy.MaxHitIDLife)
	s.Reset(ctx, "other", "k", nil, clock.Now()) // any write sweeps
	if n := len(d.markers.m) + len(d.counters.m) + len(d.markers.q) + len(d.counters.q); n != 0 {
		t.Errorf("after everything expired: %d markers, %d counters, %d heap entries", len(d.markers.m), len(d.counters.m), len(d.markers.q)+len(d.counters.q))
	}
	if c := max(cap(d.markers.q), cap(d.counters.q)); c > 1024 {
		t.Errorf("the empty expiry heap keeps a capacity of %d", c)
	}
}

func TestMarkerLives(t *testing.T) {
	ctx := t.Context()
	push := func(s *Store, id string, d window.Diff) {
		t.Helper()
		if err := s.PushDiffs(ctx, strategy.Batch{ID: id, Namespace: "ns", Diffs: []window.Diff{d}}); err != nil {
			t.Fatal(err)
		}
	}
	value := func(s *Store, size time.Duration, start int64) float64 {
		t.Helper()
		v, _ := s.data.get(counter{"ns", "k", size, start}, s.now().UnixNano())
		return v
	}

	// A batch's marker lives as long as its counters: a retry is never
	// applied while they live.
	s, clock := newTestStore()
	start := clock.UnixNano()
	d := window.Diff{Key: "k", Size: time.Hour, Start: start, Value: 1}
	push(s, "b", d)
	clock.Advance(2*time.Hour - 1)
	push(s, "b", d)
	if v := value(s, time.Hour, start); v != 1 {
		t.Errorf("a batch retried just before its counters expire counted to %v, want 1", v)
	}

	// ... and at least five seconds, for the shortest windows.
	s, clock = newTestStore()
	start = clock.UnixNano()
	short := window.Diff{Key: "k", Size: time.Millisecond, Start: start, Value: 1}
	long := window.Diff{Key: "k", Size: time.Minute, Start: start, Value: 1}
	push(s, "b", short)
	clock.Advance(strategy.MinBatchIDLife - 1)
	push(s, "b", long) // a retry, though its diffs differ
	if v := value(s, time.Minute, start); v != 0 {
		t.Errorf("a retry within five seconds counted %v, want nothing", v)
	}
	clock.Advance(1)
	push(s, "b", long)
	if v := value(s, time.Minute, start); v != 1 {
		t.Errorf("a push of the ID after its marker expired counted %v, want 1", v)
	}

	// A hit's marker lives a minute at least, two at most, and the batch
	// of its ID finds it.
	for _, tc := range []struct {
		size time.Duration
		life time.Duration
	}{
		{time.Millisecond, strategy.MinHitIDLife},
		{time.Hour, strategy.MaxHitIDLife},
	} {
		s, clock = newTestStore()
		start = clock.UnixNano()
		ws := []strategy.WindowHit{{Size: tc.size, Start: start, Value: 1, Max: 10}}
		if _, _, err := s.Hit(ctx, "ns", "k", "h", ws, false); err != nil {
			t.Fatal(err)
		}
		clock.Advance(tc.life - 1)
		if !marked(s, "h") {
			t.Errorf("size %v: the hit's marker expired before %v", tc.size, tc.life)
		}
		clock.Advance(1)
		if marked(s, "h") {
			t.Errorf("size %v: the hit's marker lived longer than %v", tc.size, tc.life)
		}
	}
}

func TestHitOnExpiredWindowStoresNothing(t *testing.T) {
	s, clock := newTestStore()
	start := clock.UnixNano()
	clock.Advance(time.Hour)
	ws := []strategy.WindowHit{{Size: time.Second, Start: start, Value: 1, Max: 10}}
	counts, rejected, err := s.Hit(t.Context(), "ns", "k", "", ws, false)
	if err != nil {
		t.Fatal(err)
	}
	if rejected != -1 || counts[0].Current != 1 {
		t.Errorf("got counts %v and rejected %d, want a count of 1 admitted", counts, rejected)
	}
	if n := s.Counters("ns"); n != 0 {
		t.Errorf("a hit of an expired window left %d counters", n)
	}
}

func TestLookupsCountWindowsAsked(t *testing.T) {
	s := newStore(newData())
	sizes := []time.Duration{time.Second, time.Minute, time.Hour}
	if _, err := s.GetCounters(t.Context(), "ns", []string{"a", "b"}, sizes, time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := s.Lookups(); n != 2*2*3 {
		t.Errorf("fetching 2 keys of 3 sizes counted %d lookups, want 12", n)
	}
}
