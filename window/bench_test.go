package window

import (
	"math"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// filledZone returns a zone holding n keys of one window size, named
// "10.0.<i>" so that keys are as short as client addresses.
func filledZone(b testing.TB, n int) (*Zone, *Namespace, []string) {
	z, err := NewZone(n, nil)
	if err != nil {
		b.Fatal(err)
	}
	ns, _ := z.Namespace("bench")
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "10.0." + strconv.Itoa(i)
		ns.Increment(keys[i], time.Minute, 1)
	}
	return z, ns, keys
}

// BenchmarkIncrement hits one existing key of a zone holding 1,000,000
// keys, reading the system clock on every hit as production does.
func BenchmarkIncrement(b *testing.B) {
	z, ns, keys := filledZone(b, 1_000_000)
	key := keys[len(keys)/2]
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		ns.Increment(key, time.Minute, 1)
	}
	b.StopTimer()
	if z.Len() != 1_000_000 {
		b.Fatalf("zone holds %d keys", z.Len())
	}
}

// BenchmarkIncrementParallel hits many keys from every core at once, in
// the same zone of 1,000,000 keys: each goroutine cycles through its own
// 256 keys, spread over every shard, so the figure shows how well hits
// on different keys run side by side rather than how fast main memory is.
func BenchmarkIncrementParallel(b *testing.B) {
	_, ns, keys := filledZone(b, 1_000_000)
	var worker atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := int(worker.Add(1))
		mine := make([]string, 256)
		for j := range mine {
			mine[j] = keys[(w*len(mine)+j)*61%len(keys)]
		}
		for i := 0; pb.Next(); i++ {
			ns.Increment(mine[i&(len(mine)-1)], time.Minute, 1)
		}
	})
}

// BenchmarkHitNewKey hits a key the zone has never seen, with two window
// sizes as a handler with two limits does, in a full zone of 1,000,000
// keys: every hit looks the key up in vain, inserts it and evicts another.
// It is the path of a client key per request (or a flood of new clients).
func BenchmarkHitNewKey(b *testing.B) {
	z, ns, _ := filledZone(b, 1_000_000)
	limits := []Limit{{Size: time.Second, Max: math.Inf(1)}, {Size: time.Minute, Max: math.Inf(1)}}
	out := make([]Sample, len(limits))
	buf := []byte("new.")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		buf = strconv.AppendInt(buf[:4], int64(i), 10)
		// The zone copies a key it keeps, so the buffer may be reused.
		ns.Hit(unsafe.String(&buf[0], len(buf)), limits, 1, false, false, false, out)
	}
	b.StopTimer()
	if z.Len() != 1_000_000 {
		b.Fatalf("zone holds %d keys", z.Len())
	}
}

// BenchmarkGCFullZone times a garbage collection while a zone holds
// 1,000,000 keys, each with two window sizes as a handler with two limits
// gives them: the share of every collection of a Caddy process that its
// zone costs. The zone holds no pointers per key, so the collector has
// little to mark in it.
func BenchmarkGCFullZone(b *testing.B) {
	z, err := NewZone(1_000_000, nil)
	if err != nil {
		b.Fatal(err)
	}
	ns, _ := z.Namespace("bench")
	limits := []Limit{{Size: time.Second, Max: math.Inf(1)}, {Size: time.Minute, Max: math.Inf(1)}}
	out := make([]Sample, len(limits))
	var buf []byte
	for i := range 1_000_000 {
		buf = strconv.AppendInt(append(buf[:0], "10.0."...), int64(i), 10)
		ns.Hit(string(buf), limits, 1, false, false, false, out)
	}
	runtime.GC()
	b.ResetTimer()
	for b.Loop() {
		runtime.GC()
	}
	b.StopTimer()
	runtime.KeepAlive(z)
}

// BenchmarkSlidingRate reads the sliding rate of an existing key.
func BenchmarkSlidingRate(b *testing.B) {
	_, ns, keys := filledZone(b, 1_000_000)
	key := keys[len(keys)/2]
	var sink float64
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		sink += ns.Read(key, time.Minute).Sliding()
	}
	_ = sink
}

// BenchmarkMemoryPerKey reports the heap bytes held per key in a zone of
// 1,000,000 short keys, each with one window size.
func BenchmarkMemoryPerKey(b *testing.B) {
	for b.Loop() {
		b.ReportMetric(heapPerKey(b, 1_000_000), "heap-bytes/key")
	}
}

// heapPerKey measures the live heap a zone of n short keys adds, per key.
// The key strings the caller made are dropped first, so that only the
// zone's own copies count.
func heapPerKey(t testing.TB, n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	z, err := NewZone(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := z.Namespace("mem")
	var buf []byte
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "10.0."...), int64(i), 10)
		ns.Increment(string(buf), time.Minute, 1)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if z.Len() != n {
		t.Fatalf("zone holds %d keys, want %d", z.Len(), n)
	}
	runtime.KeepAlive(z)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}
