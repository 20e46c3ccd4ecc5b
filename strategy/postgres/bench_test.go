package postgres

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

func benchStore(b *testing.B) *Store {
	_, dsn := startServer(b)
	return open(b, &Postgres{DSN: dsn})
}

func benchDiffs(n int, size time.Duration, start int64) []window.Diff {
	diffs := make([]window.Diff, n)
	for i := range diffs {
		diffs[i] = window.Diff{Key: fmt.Sprint("203.0.113.", i), Size: size, Start: start, Value: 1}
	}
	return diffs
}

func benchmarkPush(b *testing.B, n int) {
	s := benchStore(b)
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

// BenchmarkPush1000 pushes a batch of 1,000 diffs of distinct keys, all
// updating rows that exist: one statement.
func BenchmarkPush1000(b *testing.B) { benchmarkPush(b, 1000) }

// BenchmarkPush10000 pushes a batch of 10,000 diffs of distinct keys.
func BenchmarkPush10000(b *testing.B) { benchmarkPush(b, 10000) }

// BenchmarkFetch10000 fetches the counters of 10,000 keys, one window size
// (20,000 counters looked up: current and previous windows; the current
// ones are present).
func BenchmarkFetch10000(b *testing.B) {
	s := benchStore(b)
	ctx := context.Background()
	size := time.Hour
	now := time.Now()
	diffs := benchDiffs(10000, size, window.Start(now.UnixNano(), size))
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
func benchmarkHit(b *testing.B, withID bool, sizes ...time.Duration) {
	s := benchStore(b)
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
	idBuf := []byte("0123456789abcdef-")
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

// BenchmarkHit applies one synchronous hit, with an ID, to one window: one
// round trip.
func BenchmarkHit(b *testing.B) { benchmarkHit(b, true, time.Hour) }

// BenchmarkHit3Windows applies one synchronous hit, with an ID, to three
// windows (1s, 1m, 1h): one round trip too.
func BenchmarkHit3Windows(b *testing.B) { benchmarkHit(b, true, time.Second, time.Minute, time.Hour) }

// BenchmarkHitNoID is BenchmarkHit without an ID, so without an ID record:
// the difference is the record's cost.
func BenchmarkHitNoID(b *testing.B) { benchmarkHit(b, false, time.Hour) }
