package window

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

func TestClassOf(t *testing.T) {
	for _, tc := range []struct{ n, class int }{
		{1, 0}, {8, 0}, {9, 1}, {16, 1}, {17, 2}, {256, 5}, {257, 6}, {512, 6}, {513, keyClasses}, {4096, keyClasses},
	} {
		if got := classOf(tc.n); got != tc.class {
			t.Errorf("classOf(%d) = %d, want %d", tc.n, got, tc.class)
		}
	}
}

func TestKeyArenaReusesSlots(t *testing.T) {
	var a keyArena
	long := strings.Repeat("x", 600)
	keys := []string{"", "a", "12345678", "123456789", strings.Repeat("k", 300), long}
	at := make([]uint32, len(keys))
	for i, k := range keys {
		at[i] = a.put(k)
	}
	for i, k := range keys {
		if got := a.view(at[i], uint32(len(k))); got != k {
			t.Fatalf("view of key %d = %q, want %q", i, got, k)
		}
	}
	for i, k := range keys {
		a.release(at[i], uint32(len(k)))
	}
	for i, k := range keys {
		at[i] = a.put(k)
	}
	for i, k := range keys {
		if got := a.view(at[i], uint32(len(k))); got != k {
			t.Fatalf("after reuse, view of key %d = %q, want %q", i, got, k)
		}
	}
	if len(a.slabs[0].buf) != 16 || len(a.long) != 1 { // "a" and "12345678"
		t.Errorf("the arena grew instead of reusing: %d bytes in class 0, %d long keys", len(a.slabs[0].buf), len(a.long))
	}
}

// TestZoneKeysSurviveChurn counts hits on keys of every size class (the
// empty key and keys longer than the largest class too), in three window
// sizes, in a zone too small for them, while it evicts, resizes and
// re-shards: every entry stays findable by its key, and the diffs taken
// add up, key by key and window by window, to what was counted.
func TestZoneKeysSurviveChurn(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 64, clock)
	ns := mustNamespace(t, z, "churn")
	ns.SetTracked(true)
	rng := rand.New(rand.NewPCG(3, 4))
	pool := make([]string, 300)
	for i := range pool {
		n := []int{0, 1, 7, 8, 9, 15, 16, 17, 40, 100, 255, 256, 300, 512, 513, 700}[rng.IntN(16)]
		b := make([]byte, n)
		for j := range b {
			b[j] = byte('a' + rng.IntN(26))
		}
		pool[i] = string(b)
	}
	sizes := []time.Duration{time.Minute, time.Hour, 24 * time.Hour}
	type counter struct {
		key  string
		size time.Duration
	}
	counted, taken := map[counter]float64{}, map[counter]float64{}
	seen := map[string]bool{}
	take := func() {
		diffs, keys := ns.Take()
		for _, d := range diffs {
			taken[counter{d.Key, d.Size}] += d.Value
		}
		for _, k := range keys {
			if !seen[k] {
				t.Fatalf("Take listed a key never counted: %q", k)
			}
		}
	}
	for step := range 20_000 {
		key, size := pool[rng.IntN(len(pool))], sizes[rng.IntN(len(sizes))]
		ns.Increment(key, size, 1)
		counted[counter{key, size}]++
		seen[key] = true
		switch {
		case step%10 == 9:
			take()
		case step%997 == 0:
			if err := z.Resize([]int{16, 64, 256, 1024}[rng.IntN(4)]); err != nil {
				t.Fatal(err)
			}
		}
		if step%500 == 0 {
			for _, s := range z.current() {
				s.mu.Lock()
				s.forEachLive(func(i int32, e *entry) {
					if got := s.find(e.hash, e.ns, s.keyOf(e)); got != i {
						t.Fatalf("step %d: entry %d of key %q is found at %d", step, i, s.keyOf(e), got)
					}
				})
				s.mu.Unlock()
			}
		}
	}
	take()
	// Removed keys give their room back: what the arena and the extras
	// hold in use is exactly what the live entries refer to.
	for _, s := range z.current() {
		s.mu.Lock()
		var extras int32
		var keys [keyClasses + 1]int
		s.forEachLive(func(_ int32, e *entry) {
			for j := e.more; j != 0; j = s.extraAt(j - 1).next {
				extras++
			}
			if e.keyLen > 0 {
				keys[classOf(int(e.keyLen))]++
			}
		})
		if inUse := s.extraUsed - int32(len(s.extraFree)); inUse != extras {
			t.Errorf("a shard holds %d extras in use, its entries %d", inUse, extras)
		}
		for c, slab := range s.keys.slabs {
			if inUse := len(slab.buf)>>(c+minKeyShift) - len(slab.free); inUse != keys[c] {
				t.Errorf("a shard holds %d keys of class %d in use, its entries %d", inUse, c, keys[c])
			}
		}
		if inUse := len(s.keys.long) - len(s.keys.longFree); inUse != keys[keyClasses] {
			t.Errorf("a shard holds %d long keys in use, its entries %d", inUse, keys[keyClasses])
		}
		s.mu.Unlock()
	}
	if z.Dropped() != 0 {
		t.Fatalf("%d orphans dropped: the test takes too seldom", z.Dropped())
	}
	for c, n := range counted {
		if taken[c] != n {
			t.Errorf("key %q (%d bytes), window %v: took %v, counted %v", c.key, len(c.key), c.size, taken[c], n)
		}
	}
	if len(taken) != len(counted) {
		t.Errorf("took diffs of %d counters, counted %d", len(taken), len(counted))
	}
}
