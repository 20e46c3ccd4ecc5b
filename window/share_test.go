package window

import (
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

// TestUnsyncedWeightSharesALimit: with a weight of 3, a node admits a
// third of what is left of a limit once the store's counts are in, and
// the samples (and so the headers) show the weighted counts; at 1 again
// the node's own counts are what they were, and what a sync takes was
// never weighted.
func TestUnsyncedWeightSharesALimit(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	n.SetTracked(true)
	limits := []Limit{{Size: time.Minute, Max: 10}}
	out := make([]Sample, 1)

	n.IncrementSynced("k", time.Minute, 4) // what the store reported
	n.SetUnsyncedWeight(3)
	admitted := 0
	for range 10 {
		if n.Hit("k", limits, 1, true, true, false, out) < 0 {
			admitted++
		}
	}
	if admitted != 2 { // 4 + 3*2 = 10; a third would make 13
		t.Fatalf("weight 3 after 4 of 10 synced: admitted %d, want 2", admitted)
	}
	if got := n.Read("k", time.Minute).Current; got != 10 {
		t.Fatalf("weighted count: got %v, want 10", got)
	}

	n.SetUnsyncedWeight(1)
	if got := n.Read("k", time.Minute).Current; got != 6 {
		t.Fatalf("count at weight 1: got %v, want 6", got)
	}
	diffs, _ := n.Take()
	if len(diffs) != 1 || diffs[0].Value != 2 {
		t.Fatalf("taken: %+v, want one diff of 2", diffs)
	}

	for _, m := range []float64{0, -1, 0.5} {
		n.SetUnsyncedWeight(m)
		if w := n.unsyncedWeight(); w != 1 {
			t.Fatalf("SetUnsyncedWeight(%v): weight %v, want 1", m, w)
		}
	}
}

// TestUnsyncedWeightHitIfRoom: a request that waits for room (max_delay)
// is judged on the weighted counts, and told when its weighted cost fits.
func TestUnsyncedWeightHitIfRoom(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	n.SetUnsyncedWeight(2)
	limits := []Limit{{Size: time.Second, Max: 4}}
	out := make([]Sample, 1)
	for i := range 2 {
		if r, _ := n.HitIfRoom("k", limits, 1, out); r >= 0 {
			t.Fatalf("hit %d rejected, want 2 admitted at weight 2 of 4", i)
		}
	}
	r, wait := n.HitIfRoom("k", limits, 1, out)
	if r != 0 || wait <= 0 {
		t.Fatalf("third hit: rejected %d wait %v, want rejected with a wait", r, wait)
	}
	if r, wait := n.HitIfRoom("k", limits, 3, out); r != 0 || wait >= 0 {
		t.Fatalf("a cost of 3 at weight 2 of 4: rejected %d wait %v, want never", r, wait)
	}
}

// TestUnsyncedWeightSharesARate: at weight m a rate admits one request
// every m emission intervals, with the burst's share, and at least one
// request at once however small the burst.
func TestUnsyncedWeightSharesARate(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	n.SetUnsyncedWeight(3)
	out := make([]Sample, 0)
	var rs RateSample
	admit := func(key string, r Rate) int {
		admitted := 0
		for range 20 {
			if ok, _ := n.HitRate(key, r, 1, nil, 1, false, false, false, out, &rs); ok {
				admitted++
			}
		}
		return admitted
	}
	if got := admit("a", Rate{Window: time.Second, N: 10, Burst: 0}); got != 1 {
		t.Fatalf("10/s, no burst, weight 3: %d at once, want 1", got)
	}
	clock.Advance(299 * time.Millisecond)
	if got := admit("a", Rate{Window: time.Second, N: 10, Burst: 0}); got != 0 {
		t.Fatalf("after 299ms: %d admitted, want 0 (one every 300ms)", got)
	}
	clock.Advance(time.Millisecond)
	if got := admit("a", Rate{Window: time.Second, N: 10, Burst: 0}); got != 1 {
		t.Fatalf("after 300ms: %d admitted, want 1", got)
	}
	if got := admit("b", Rate{Window: time.Second, N: 10, Burst: 8}); got != 3 {
		t.Fatalf("10/s, burst 8, weight 3: %d at once, want 3 (9 / 3)", got)
	}
}
