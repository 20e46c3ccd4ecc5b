package window

import (
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

// TestHitUnlessNear walks a key up to its limit: far from it hits count
// locally, near it they count nothing and take the current window's diff,
// and past it they are surely rejected locally.
func TestHitUnlessNear(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	n.SetTracked(true)
	limits := []Limit{{Size: time.Second, Max: 10}, {Size: time.Minute, Max: 100}}
	out, un := make([]Sample, 2), make([]Unsynced, 2)
	hit := func() (int, bool) { return n.HitUnlessNear("k", limits, 1, true, false, 0.8, out, un) }

	for i := range 7 { // rates 1 to 7: below 0.8 of 10
		if rej, near := hit(); rej != -1 || near {
			t.Fatalf("hit %d: rejected %d, near %v; want a local admission", i+1, rej, near)
		}
	}
	rej, near := hit() // 8 reaches 0.8 of 10: near
	if !near || rej != -1 {
		t.Fatalf("8th hit: rejected %d, near %v; want near", rej, near)
	}
	if out[0].Current != 7 || un[0].Taken != 7 || un[1].Taken != 7 {
		t.Fatalf("near hit: out %+v, unsynced %+v; want counts of 7 without the hit, 7 taken", out, un)
	}
	if got := n.Read("k", time.Second).Current; got != 7 {
		t.Fatalf("visible count after the take: %v, want 7", got)
	}
	if diffs, _ := n.Take(); sum(diffs) != 0 {
		t.Fatalf("Take after a near hit pushed %v; the near hit took the diffs", diffs)
	}
	// The store applied what was taken, and the hit: set the counts as the
	// store reports them, as a synchronous hit does.
	n.Observe("k", time.Second, out[0].Start, 8, 0)
	n.Observe("k", time.Minute, out[1].Start, 8, 0)
	if rej, near := hit(); !near || rej != -1 || un[0].Taken != 0 {
		t.Fatalf("9th hit: rejected %d, near %v, unsynced %+v; want near with nothing taken", rej, near, un)
	}
	n.Observe("k", time.Second, out[0].Start, 10, 0) // the store has 10, with other nodes' hits
	if rej, near := hit(); near || rej != 0 {
		t.Fatalf("hit past 10: rejected %d, near %v; want surely rejected at limit 0, locally", rej, near)
	}
	if got := n.Read("k", time.Second).Current; got != 11 {
		t.Fatalf("count after a local rejection with penalty: %v, want 11", got)
	}

	// Giving the taken diffs back makes them pending again.
	clock.Advance(time.Second)
	for range 8 {
		n.Hit("j", limits[:1], 1, true, false, false, out[:1])
	}
	n.Take()
	n.Hit("j", limits[:1], 1, true, false, false, out[:1]) // 9th: a diff of 1
	if _, near := n.HitUnlessNear("j", limits[:1], 0.5, true, false, 0.8, out[:1], un[:1]); !near || un[0].Taken != 1 {
		t.Fatalf("near hit of j: near %v, unsynced %+v; want 1 taken", near, un[0])
	}
	n.Restore([]Diff{{Key: "j", Size: time.Second, Start: out[0].Start, Value: un[0].Taken}})
	if diffs, _ := n.Take(); sum(diffs) != 1 {
		t.Fatalf("Take after Restore pushed %v, want the diff of 1", diffs)
	}
}

// TestHitUnlessNearPrevious reports the previous window's diff, left
// pending, and weighs it in the sliding rate.
func TestHitUnlessNearPrevious(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	n.SetTracked(true)
	limits := []Limit{{Size: time.Second, Max: 10}}
	out, un := make([]Sample, 1), make([]Unsynced, 1)
	for range 10 {
		n.Hit("k", limits, 1, false, false, false, out)
	}
	clock.Advance(time.Second + 100*time.Millisecond) // previous window weighs 0.9
	rej, near := n.HitUnlessNear("k", limits, 1, false, false, 0.5, out, un)
	if !near || rej != -1 {
		t.Fatalf("rejected %d, near %v; want near (rate 9 + 1 of 10)", rej, near)
	}
	if un[0].Previous != 10 || un[0].Taken != 0 || out[0].Previous != 10 {
		t.Fatalf("unsynced %+v, out %+v; want the previous window's 10 left pending", un[0], out[0])
	}
	if diffs, _ := n.Take(); sum(diffs) != 10 {
		t.Fatalf("Take pushed %v, want the previous window's 10", diffs)
	}
}

// BenchmarkHitUnlessNear is the local hot path of a sync_above namespace,
// next to Hit's: a key far from its limit.
func BenchmarkHitUnlessNear(b *testing.B) {
	z, err := NewZone(1000, nil)
	if err != nil {
		b.Fatal(err)
	}
	n, _ := z.Namespace("ns")
	n.SetTracked(true)
	limits := []Limit{{Size: time.Second, Max: 1e12}, {Size: time.Minute, Max: 1e12}}
	out, un := make([]Sample, 2), make([]Unsynced, 2)
	b.Run("Hit", func(b *testing.B) {
		for b.Loop() {
			n.Hit("k", limits, 1, false, false, false, out)
		}
	})
	b.Run("HitUnlessNear", func(b *testing.B) {
		for b.Loop() {
			n.HitUnlessNear("k", limits, 1, false, false, 0.8, out, un)
		}
	})
}
