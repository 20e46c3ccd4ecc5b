package window

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

// hitBySteps is Hit as a sequence of Increment and Read calls: what Hit
// must equal.
func hitBySteps(n *Namespace, key string, limits []Limit, value float64, fixed, undo, synced bool, out []Sample) int {
	add := n.Increment
	if synced {
		add = n.IncrementSynced
	}
	rejected := -1
	for i, l := range limits {
		if rejected >= 0 {
			out[i] = n.Read(key, l.Size)
			continue
		}
		out[i] = add(key, l.Size, value)
		if out[i].Rate(fixed) > l.Max {
			rejected = i
		}
	}
	if rejected >= 0 && undo {
		for i := 0; i <= rejected; i++ {
			out[i] = add(key, limits[i].Size, -value)
		}
	}
	return rejected
}

// TestHitEqualsSteps plays the same random hits on two zones, one with
// Hit and one step by step, over time and window boundaries: the answers,
// the counts and the diffs to push are the same, and every sample is of
// the clock's instant.
func TestHitEqualsSteps(t *testing.T) {
	clock := fakeclock.New(base)
	a, b := mustZone(t, 1000, clock), mustZone(t, 1000, clock)
	na, _ := a.Namespace("ns")
	nb, _ := b.Namespace("ns")
	na.SetTracked(true)
	nb.SetTracked(true)
	rng := rand.New(rand.NewPCG(1, 2))
	limitSets := [][]Limit{
		{{Size: time.Second, Max: 3}},
		{{Size: time.Second, Max: 5}, {Size: time.Minute, Max: 20}},
		{{Size: time.Second, Max: math.Inf(1)}, {Size: 10 * time.Second, Max: 8}, {Size: time.Hour, Max: 30}},
		{{Size: time.Second, Max: 0.5}, {Size: time.Minute, Max: 100}}, // rejects every hit
	}
	for step := range 20_000 {
		clock.Advance(time.Duration(rng.IntN(int(40 * time.Millisecond))))
		key := string(rune('a' + rng.IntN(5)))
		limits := limitSets[rng.IntN(len(limitSets))]
		value := []float64{1, 0.5, 2}[rng.IntN(3)]
		fixed, undo, synced := rng.IntN(2) == 0, rng.IntN(2) == 0, rng.IntN(8) == 0
		outA, outB := make([]Sample, len(limits)), make([]Sample, len(limits))
		ra := na.Hit(key, limits, value, fixed, undo, synced, outA)
		rb := hitBySteps(nb, key, limits, value, fixed, undo, synced, outB)
		if ra != rb {
			t.Fatalf("step %d: Hit rejected at %d, the steps at %d", step, ra, rb)
		}
		for i := range outA {
			if outA[i] != outB[i] {
				t.Fatalf("step %d, limit %d: Hit answered %+v, the steps %+v", step, i, outA[i], outB[i])
			}
			if outA[i].At != clock.UnixNano() {
				t.Fatalf("step %d, limit %d: the sample is of %d, the clock says %d", step, i, outA[i].At, clock.UnixNano())
			}
		}
		if step%1000 == 999 {
			da, _ := na.Take()
			db, _ := nb.Take()
			if sum(da) != sum(db) || len(da) != len(db) {
				t.Fatalf("step %d: Hit left %d diffs summing %v, the steps %d summing %v", step, len(da), sum(da), len(db), sum(db))
			}
		}
	}
}
