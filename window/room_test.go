package window

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

// After a burst late in a window, the estimate would admit hits early in
// the next window (it spreads the burst over the window); HitIfRoom waits
// until the burst is a window length old, then admits up to the limit.
func TestHitIfRoomAfterABurst(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	limits := []Limit{{Size: time.Second, Max: 5}}
	out := make([]Sample, 1)

	clock.Advance(700 * time.Millisecond)
	for i := range 5 {
		if rej := n.Hit("k", limits, 1, false, false, false, out); rej != -1 {
			t.Fatalf("hit %d of the burst rejected", i+1)
		}
	}
	rej, wait := n.HitIfRoom("k", limits, 1, out)
	if rej != 0 || wait != time.Second+2*time.Millisecond {
		t.Fatalf("right after the burst: rejected %d, wait %v; want 0 and 1.002s (the burst a window old, its stamp rounded up, and the margin)", rej, wait)
	}
	clock.Advance(500 * time.Millisecond) // 0.2 into the next window
	if n.Hit("k", limits, 1, false, true, false, out) != -1 {
		t.Fatal("the estimate (5 × 0.8 = 4) should admit one more here; the test assumes it")
	}
	n.Hit("k", limits, -1, false, false, false, out) // take it back
	if rej, wait := n.HitIfRoom("k", limits, 1, out); rej != 0 || wait != 502*time.Millisecond {
		t.Fatalf("0.2 into the next window: rejected %d, wait %v; want 0 and 502ms", rej, wait)
	}
	clock.Advance(502 * time.Millisecond)
	for i := range 5 {
		if rej, wait := n.HitIfRoom("k", limits, 1, out); rej != -1 {
			t.Fatalf("hit %d once the burst left: rejected %d, wait %v", i+1, rej, wait)
		}
	}
	if out[0].Current != 5 {
		t.Fatalf("count after 5 admitted: %+v", out[0])
	}
	// Full again: room when these 5 are a window length old.
	if rej, wait := n.HitIfRoom("k", limits, 1, out); rej != 0 || wait != time.Second+2*time.Millisecond {
		t.Fatalf("full: rejected %d, wait %v; want 1.002s", rej, wait)
	}
	if rej, wait := n.HitIfRoom("k", limits, 6, out); rej != 0 || wait >= 0 {
		t.Fatalf("a hit over the limit: rejected %d, wait %v; want never", rej, wait)
	}
}

// Counts the store reported have no stamps: the previous window's count
// is taken as at its end, the current one's as now.
func TestHitIfRoomStoreCounts(t *testing.T) {
	clock := fakeclock.New(base.Add(200 * time.Millisecond))
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	limits := []Limit{{Size: time.Second, Max: 5}}
	out := make([]Sample, 1)
	start := base.UnixNano()
	n.Observe("k", time.Second, start, 1, 4) // 4 in the previous window, 1 now
	if rej, wait := n.HitIfRoom("k", limits, 1, out); rej != 0 || wait != 801*time.Millisecond {
		t.Fatalf("rejected %d, wait %v; want 0 and 801ms (the previous window's end, and the margin)", rej, wait)
	}
	n.Observe("k", time.Second, start, 5, 0)
	if rej, wait := n.HitIfRoom("k", limits, 1, out); rej != 0 || wait != time.Second+time.Millisecond {
		t.Fatalf("rejected %d, wait %v; want 0 and 1.001s (the current count as of now, and the margin)", rej, wait)
	}
}

// Every limit must have room; the wait is the longest.
func TestHitIfRoomTwoLimits(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	n, _ := z.Namespace("ns")
	limits := []Limit{{Size: time.Second, Max: 2}, {Size: time.Minute, Max: 3}}
	out := make([]Sample, 2)
	for range 2 {
		if rej, _ := n.HitIfRoom("k", limits, 1, out); rej != -1 {
			t.Fatal("rejected under both limits")
		}
	}
	if rej, wait := n.HitIfRoom("k", limits, 1, out); rej != 0 || wait != time.Second+2*time.Millisecond {
		t.Fatalf("second full: rejected %d, wait %v", rej, wait)
	}
	clock.Advance(time.Second + 2*time.Millisecond)
	if rej, _ := n.HitIfRoom("k", limits, 1, out); rej != -1 {
		t.Fatal("rejected with room in both")
	}
	clock.Advance(time.Second + 2*time.Millisecond)
	if rej, wait := n.HitIfRoom("k", limits, 1, out); rej != 1 || wait != 59*time.Second {
		t.Fatalf("minute full: rejected %d, wait %v", rej, wait)
	}
	if got := n.Read("k", time.Minute).Current; got != 3 {
		t.Fatalf("minute count %v: a refused hit counted", got)
	}
}

// Whatever the arrivals, the hits HitIfRoom admits never number more than
// the limit in any span of one window length: the property max_delay
// promises.
func TestHitIfRoomNeverOverAnySpan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		clock := fakeclock.New(base.Add(time.Duration(rng.Int64N(int64(time.Second)))))
		z := mustZone(t, 100, clock)
		n, _ := z.Namespace("ns")
		const max = 5
		size := time.Second
		limits := []Limit{{Size: size, Max: max}}
		out := make([]Sample, 1)
		var admitted []int64
		first := clock.UnixNano()
		for range 200 {
			clock.Advance(time.Duration(rng.Int64N(int64(80 * time.Millisecond))))
			if rej, wait := n.HitIfRoom("k", limits, 1, out); rej == -1 {
				admitted = append(admitted, clock.UnixNano())
			} else if wait <= 0 {
				t.Fatalf("trial %d: rejected with wait %v", trial, wait)
			}
		}
		sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })
		for i := max; i < len(admitted); i++ {
			if span := admitted[i] - admitted[i-max]; span < int64(size) {
				t.Fatalf("trial %d: %d hits within %v", trial, max+1, time.Duration(span))
			}
		}
		// Offered 25 a second, it admits its 5 a second, give or take the
		// gaps of random arrivals.
		if secs := time.Duration(clock.UnixNano() - first).Seconds(); float64(len(admitted)) < 3*secs {
			t.Fatalf("trial %d: only %d admitted in %.1fs", trial, len(admitted), secs)
		}
	}
}
