package strategytest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// Benchmarks runs the stores' benchmarks against the stores that open
// returns, as sub-benchmarks of b:
//
//   - Push1000 and Push10000 push a batch of 1,000 (10,000) diffs of
//     distinct keys, all updating counters that exist, and report ns/diff
//     too;
//   - Fetch10000 fetches the counters of 10,000 keys, one window size
//     (20,000 counters looked up: current and previous windows; the
//     current ones are present);
//   - Hit applies one synchronous hit, with an ID, to one window; Hit3Windows
//     to three windows (1s, 1m, 1h); HitNoID is Hit without an ID, so
//     without an ID record: the difference is the record's cost. They are
//     skipped for a store that is not a strategy.Hitter;
//   - Slot takes a concurrency slot and releases it (AcquireSlot then
//     ReleaseSlots: the two round trips of a request under
//     max_concurrent), skipped for a store that is not a
//     strategy.Slotter.
//
// Each sub-benchmark calls open once, with its own b, and uses the store
// it returns only for that benchmark, so that open may start a server of
// its own (b.Cleanup stops it). The caller closes the store, if it must,
// with b.Cleanup too. A store's package runs them with
//
//	func BenchmarkStore(b *testing.B) { strategytest.Benchmarks(b, openStore) }
//
// and, for example, go test -run x -bench 'Store/(Push|Fetch|Hit$)'.
func Benchmarks(b *testing.B, open func(b *testing.B) strategy.Store) {
	b.Run("Push1000", func(b *testing.B) { benchmarkPush(b, open(b), 1000) })
	b.Run("Push10000", func(b *testing.B) { benchmarkPush(b, open(b), 10000) })
	b.Run("Fetch10000", func(b *testing.B) { benchmarkFetch(b, open(b), 10000) })
	b.Run("Hit", func(b *testing.B) { benchmarkHit(b, open, true, time.Hour) })
	b.Run("Hit3Windows", func(b *testing.B) { benchmarkHit(b, open, true, time.Second, time.Minute, time.Hour) })
	b.Run("HitNoID", func(b *testing.B) { benchmarkHit(b, open, false, time.Hour) })
	b.Run("Slot", func(b *testing.B) { benchmarkSlot(b, open) })
}

func benchDiffs(n int, size time.Duration, start int64) []window.Diff {
	diffs := make([]window.Diff, n)
	for i := range diffs {
		diffs[i] = window.Diff{Key: fmt.Sprint("203.0.113.", i), Size: size, Start: start, Value: 1}
	}
	return diffs
}

// benchmarkPush pushes batches of n diffs of distinct keys, after a first
// one that creates their counters.
func benchmarkPush(b *testing.B, s strategy.Store, n int) {
	ctx := context.Background()
	size := time.Hour
	diffs := benchDiffs(n, size, window.Start(time.Now().UnixNano(), size))
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "warm-up", Namespace: "bench", Diffs: diffs}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if err := s.PushDiffs(ctx, strategy.Batch{ID: fmt.Sprint("batch-", i), Namespace: "bench", Diffs: diffs}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i*n), "ns/diff")
}

// benchmarkFetch fetches the counters of n keys, one window size, whose
// current windows hold a count.
func benchmarkFetch(b *testing.B, s strategy.Store, n int) {
	ctx := context.Background()
	size := time.Hour
	now := time.Now()
	diffs := benchDiffs(n, size, window.Start(now.UnixNano(), size))
	if err := s.PushDiffs(ctx, strategy.Batch{ID: "fill", Namespace: "bench", Diffs: diffs}); err != nil {
		b.Fatal(err)
	}
	keys := make([]string, len(diffs))
	for i, d := range diffs {
		keys[i] = d.Key
	}
	sizes := []time.Duration{size}
	b.ReportAllocs()
	for b.Loop() {
		counts, err := s.GetCounters(ctx, "bench", keys, sizes, now)
		if err != nil {
			b.Fatal(err)
		}
		if len(counts) != len(keys) {
			b.Fatalf("got %d counts, want %d", len(counts), len(keys))
		}
	}
}

// benchmarkHit applies synchronous hits to windows of the given sizes,
// each with an ID of its own, as the sync app sends them, or with none.
// Making the ID costs the benchmark one allocation of its own.
func benchmarkHit(b *testing.B, open func(b *testing.B) strategy.Store, withID bool, sizes ...time.Duration) {
	s, ok := open(b).(strategy.Hitter)
	if !ok {
		b.Skip("the store is not a strategy.Hitter")
	}
	ctx := context.Background()
	now := time.Now().UnixNano()
	windows := make([]strategy.WindowHit, len(sizes))
	for i, size := range sizes {
		// A limit that never rejects, so every hit writes every window.
		windows[i] = strategy.WindowHit{Size: size, Start: window.Start(now, size), Value: 1, Max: 1e15, Weight: 0.5}
	}
	if _, _, err := s.Hit(ctx, "bench", "warm-up", "", windows, false); err != nil {
		b.Fatal(err)
	}
	idBuf := runIDs("")
	prefix := len(idBuf)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		id := ""
		if withID {
			idBuf = strconv.AppendInt(idBuf[:prefix], int64(i), 10)
			id = string(idBuf)
		}
		if _, rejected, err := s.Hit(ctx, "bench", "203.0.113.7", id, windows, false); err != nil || rejected != -1 {
			b.Fatal(rejected, err)
		}
	}
}

// benchmarkSlot takes a slot of one key, with an ID of its own, and
// releases it, as a request under max_concurrent does, while 4 other
// slots of the key are held.
func benchmarkSlot(b *testing.B, open func(b *testing.B) strategy.Store) {
	s, ok := open(b).(strategy.Slotter)
	if !ok {
		b.Skip("the store is not a strategy.Slotter")
	}
	ctx := context.Background()
	const key, max, lease = "203.0.113.7", 20, 30 * time.Second
	for i := range 4 {
		if _, ok, err := s.AcquireSlot(ctx, "bench", key, fmt.Sprint("held-", i), max, lease); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
	idBuf := runIDs("node-")
	prefix := len(idBuf)
	slot := []strategy.Slot{{Key: key}}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		idBuf = strconv.AppendInt(idBuf[:prefix], int64(i), 10)
		slot[0].ID = string(idBuf)
		if _, ok, err := s.AcquireSlot(ctx, "bench", key, slot[0].ID, max, lease); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if err := s.ReleaseSlots(ctx, "bench", slot); err != nil {
			b.Fatal(err)
		}
	}
}

// HitBatchBenchmarks runs the benchmarks of strategy.BatchHitter.HitBatch
// against s, as sub-benchmarks of b, each in a namespace of its own:
// batches of 1, 10 and 100 hits, each of two windows (a minute and an
// hour, sliding) with an ID, as a coalescer of synchronous hits sends
// them, of one key and of 32, 100 and 1,000 keys (the hits of a batch
// take the keys in turn). Each reports ns/hit too; when commands is not
// nil, cmds/hit: commands must return a running count of the commands the
// store's server ran (for Redis, INFO commandstats' calls, commands
// inside scripts included); and when serverCPU is not nil, server-µs/hit:
// serverCPU must return the CPU time the store's server used so far (for
// Redis, INFO cpu). A store's package runs them with
//
//	func BenchmarkHitBatch(b *testing.B) {
//		strategytest.HitBatchBenchmarks(b, openStore(b), nil, nil)
//	}
//
// It skips a store that is not a strategy.BatchHitter.
func HitBatchBenchmarks(b *testing.B, s strategy.Store, commands func() int64, serverCPU func() time.Duration) {
	bs, ok := s.(strategy.BatchHitter)
	if !ok {
		b.Skip("the store is not a strategy.BatchHitter")
	}
	for _, keys := range []int{1, 32, 100, 1000} {
		for _, size := range []int{1, 10, 100} {
			b.Run(fmt.Sprintf("keys=%d/batch=%d", keys, size), func(b *testing.B) {
				benchmarkHitBatch(b, bs, commands, serverCPU, fmt.Sprintf("bench-%d-%d", keys, size), keys, size)
			})
		}
	}
}

func benchmarkHitBatch(b *testing.B, s strategy.BatchHitter, commands func() int64, serverCPU func() time.Duration, ns string, keys, size int) {
	ctx := context.Background()
	now := time.Now().UnixNano()
	var windows []strategy.WindowHit
	for _, w := range []time.Duration{time.Minute, time.Hour} {
		// A limit that never rejects, so every hit writes every window.
		windows = append(windows, strategy.WindowHit{Size: w, Start: window.Start(now, w), Value: 1, Max: 1e15, Weight: 0.5})
	}
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprint("203.0.113.", i)
	}
	hits := make([]strategy.HitRequest, size)
	results := make([]strategy.HitResult, size)
	next := 0
	batch := func(id string) {
		for i := range hits {
			hits[i] = strategy.HitRequest{Key: names[next%keys], Windows: windows}
			next++
		}
		s.HitBatch(ctx, ns, id, hits, results)
		for i := range results {
			if results[i].Err != nil || results[i].Rejected != -1 {
				b.Fatal(results[i].Rejected, results[i].Err)
			}
		}
	}
	// Make the counters, and have the store know them.
	for i := range max(1, keys/size) {
		batch(fmt.Sprint(ns, "-warm-up-", i))
	}
	// IDs of their own: a store may keep IDs apart from namespaces.
	idBuf := runIDs(ns + "-")
	prefix := len(idBuf)
	var before int64
	if commands != nil {
		before = commands()
	}
	var cpuBefore time.Duration
	if serverCPU != nil {
		cpuBefore = serverCPU()
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		idBuf = strconv.AppendInt(idBuf[:prefix], int64(n), 10)
		batch(string(idBuf))
		n++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*size), "ns/hit")
	if commands != nil {
		b.ReportMetric(float64(commands()-before)/float64(n*size), "cmds/hit")
	}
	if serverCPU != nil {
		b.ReportMetric(float64((serverCPU()-cpuBefore).Microseconds())/float64(n*size), "server-µs/hit")
	}
}

// runIDs returns the prefix of a benchmark run's IDs, base and 16 hex
// digits unique to the run: a store skips what an ID it applied sends,
// and -count runs a benchmark again in the same process, against the
// same store.
func runIDs(base string) []byte {
	return fmt.Appendf(nil, "%s%016x-", base, time.Now().UnixNano())
}
