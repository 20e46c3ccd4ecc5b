package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// hitCase is one Hit and what it must return.
type hitCase struct {
	values   []float64 // one per window
	counts   []strategy.WindowCounts
	rejected int
}

// runHits applies the hits of cases in turn to the windows (their Value
// replaced by the case's), checking each result.
func runHits(t *testing.T, r *Store, ns, key string, windows []strategy.WindowHit, undo bool, cases []hitCase) {
	t.Helper()
	ctx := testCtx(t)
	for i, tc := range cases {
		ws := slices.Clone(windows)
		for j := range ws {
			ws[j].Value = tc.values[j]
		}
		counts, rejected, err := r.Hit(ctx, ns, key, "", ws, undo)
		if err != nil {
			t.Fatalf("hit %d: %v", i, err)
		}
		if rejected != tc.rejected || !slices.Equal(counts, tc.counts) {
			t.Errorf("hit %d (values %v) = %v, rejected %d; want %v, rejected %d",
				i, tc.values, counts, rejected, tc.counts, tc.rejected)
		}
	}
}

// checkWindows checks the counts the store holds for key's windows.
func checkWindows(t *testing.T, r *Store, ns, key string, windows []strategy.WindowHit, want ...float64) {
	t.Helper()
	for i, w := range windows {
		if v, err := r.GetWindow(testCtx(t), ns, key, w.Size, w.Start); err != nil || v != want[i] {
			t.Errorf("window %v of %q holds %v, %v; want %v", w.Size, key, v, err, want[i])
		}
	}
}

// futureStart is the start of a window of size a little after now, so
// that short windows do not expire while a slow test runs: Hit takes any
// start.
func futureStart(size time.Duration) int64 {
	return window.Start(time.Now().Add(10*time.Second).UnixNano(), size)
}

// One window with no limit: the hit adds its value, fractions included,
// and never rejects; a zero value only reads.
func TestHitOneWindow(t *testing.T) {
	srv, r := startStandalone(t)
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "ns", Diffs: []window.Diff{
		{Key: "k", Size: size, Start: start - int64(size), Value: 40},
	}}); err != nil {
		t.Fatal(err)
	}
	windows := []strategy.WindowHit{{Size: size, Start: start, Max: math.Inf(1), Weight: 1}}
	one := func(cur, prev float64) []strategy.WindowCounts {
		return []strategy.WindowCounts{{Current: cur, Previous: prev}}
	}
	runHits(t, r, "ns", "k", windows, false, []hitCase{
		{[]float64{1}, one(1, 40), -1},
		{[]float64{0.5}, one(1.5, 40), -1},
		{[]float64{0}, one(1.5, 40), -1}, // only reads
		{[]float64{10.25}, one(11.75, 40), -1},
		{[]float64{-1.75}, one(10, 40), -1},
		{[]float64{1e9}, one(1e9+10, 40), -1}, // no limit: never rejected
	})
	checkWindows(t, r, "ns", "k", windows, 1e9+10)

	// A read-only hit of a key nobody hit creates nothing.
	runHits(t, r, "ns", "nobody", windows, false, []hitCase{{[]float64{0}, one(0, 0), -1}})
	if n := len(keysOf(t, srv.Client(""), "*nobody*")); n != 0 {
		t.Errorf("a read-only hit created %d keys", n)
	}

	// A limit of -Inf rejects every hit; one of 0 every hit that counts.
	windows[0].Max = math.Inf(-1)
	runHits(t, r, "ns", "minus-inf", windows, false, []hitCase{{[]float64{0}, one(0, 0), 0}})
	windows[0].Max = 0
	runHits(t, r, "ns", "zero", windows, false, []hitCase{{[]float64{0}, one(0, 0), -1}, {[]float64{0.5}, one(0.5, 0), 0}})
}

// Kong's order: windows in turn, and once one rejects, the later windows
// are only read. The rejected hit counts in the windows it was added to
// (the penalty).
func TestHitKongOrder(t *testing.T) {
	_, r := startStandalone(t)
	second, minute := time.Second, time.Minute
	windows := []strategy.WindowHit{
		{Size: second, Start: futureStart(second), Max: 2},
		{Size: minute, Start: futureStart(minute), Max: 100},
	}
	two := func(a, b float64) []strategy.WindowCounts {
		return []strategy.WindowCounts{{Current: a}, {Current: b}}
	}
	ones := []float64{1, 1}
	runHits(t, r, "kong", "k", windows, false, []hitCase{
		{ones, two(1, 1), -1},
		{ones, two(2, 2), -1},
		{ones, two(3, 2), 0}, // the 1s window rejects; the 1m one is only read
		{ones, two(4, 2), 0},
	})
	checkWindows(t, r, "kong", "k", windows, 4, 2)

	// The second window rejects: both were incremented.
	windows[0].Max, windows[1].Max = 100, 2
	runHits(t, r, "kong", "second", windows, false, []hitCase{
		{ones, two(1, 1), -1},
		{ones, two(2, 2), -1},
		{ones, two(3, 3), 1},
	})
	checkWindows(t, r, "kong", "second", windows, 3, 3)
}

// With undo, a rejected hit leaves every counter as it was.
func TestHitUndo(t *testing.T) {
	_, r := startStandalone(t)
	second, minute := time.Second, time.Minute
	windows := []strategy.WindowHit{
		{Size: second, Start: futureStart(second), Max: 2},
		{Size: minute, Start: futureStart(minute), Max: 100},
	}
	two := func(a, b float64) []strategy.WindowCounts {
		return []strategy.WindowCounts{{Current: a}, {Current: b}}
	}
	ones := []float64{1, 1}
	runHits(t, r, "undo", "k", windows, true, []hitCase{
		{ones, two(1, 1), -1},
		{ones, two(2, 2), -1},
		{ones, two(2, 2), 0}, // rejected: the counts are those after the undo
		{ones, two(2, 2), 0},
	})
	checkWindows(t, r, "undo", "k", windows, 2, 2)

	// The second window rejects: the increments of both are taken back.
	windows[0].Max, windows[1].Max = 100, 2
	runHits(t, r, "undo", "second", windows, true, []hitCase{
		{ones, two(1, 1), -1},
		{ones, two(2, 2), -1},
		{ones, two(2, 2), 1},
	})
	checkWindows(t, r, "undo", "second", windows, 2, 2)

	// Fractional and negative values come back exactly; a window with a
	// zero value is not touched.
	windows[0].Max, windows[1].Max = 0.25, math.Inf(1)
	runHits(t, r, "undo", "fractions", windows, true, []hitCase{
		{[]float64{0.1, 0}, two(0.1, 0), -1},
		{[]float64{0.1, -0.75}, two(0.2, -0.75), -1},
		{[]float64{0.1, -0.75}, two(0.2, -0.75), 0},
		{[]float64{1e-3, 1.0 / 3}, two(0.201, -0.75+1.0/3), -1},
	})
}

// The previous window counts with its weight: current + previous*weight
// is compared with the limit.
func TestHitWeight(t *testing.T) {
	_, r := startStandalone(t)
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "w", Diffs: []window.Diff{
		{Key: "k", Size: size, Start: start - int64(size), Value: 40},
	}}); err != nil {
		t.Fatal(err)
	}
	windows := []strategy.WindowHit{{Size: size, Start: start, Max: 15, Weight: 0.25}}
	one := func(cur float64) []strategy.WindowCounts {
		return []strategy.WindowCounts{{Current: cur, Previous: 40}}
	}
	var cases []hitCase
	for i := range 5 { // rates 11 to 15: not over the limit
		cases = append(cases, hitCase{[]float64{1}, one(float64(i + 1)), -1})
	}
	cases = append(cases, hitCase{[]float64{1}, one(6), 0}) // 6 + 40*0.25 = 16 > 15
	runHits(t, r, "w", "k", windows, false, cases)

	// A fixed window (weight 0) ignores the previous one.
	windows[0].Weight = 0
	runHits(t, r, "w", "k", windows, false, []hitCase{{[]float64{1}, one(7), -1}})
	// The whole previous window: 7.5 + 40 > 15.
	windows[0].Weight = 1
	runHits(t, r, "w", "k", windows, false, []hitCase{{[]float64{0.5}, one(7.5), 0}})
}

// Input a hit can never carry is refused before anything is sent, with an
// error that wraps strategy.ErrRejected.
func TestHitRefused(t *testing.T) {
	srv, r := startStandalone(t)
	ctx := testCtx(t)
	size := time.Minute
	good := strategy.WindowHit{Size: size, Start: window.Start(steadyNow().UnixNano(), size), Value: 1, Max: 10, Weight: 0.5}
	with := func(f func(*strategy.WindowHit)) []strategy.WindowHit {
		w := good
		f(&w)
		return []strategy.WindowHit{good, w}
	}
	for _, tc := range []struct {
		name    string
		windows []strategy.WindowHit
		want    string
	}{
		{"no windows", nil, "1 to 16 windows"},
		{"17 windows", slices.Repeat([]strategy.WindowHit{good}, 17), "1 to 16 windows"},
		{"negative weight", with(func(w *strategy.WindowHit) { w.Weight = -0.1 }), "windows[1]: weight -0.1"},
		{"weight over 1", with(func(w *strategy.WindowHit) { w.Weight = 1.5 }), "weight 1.5"},
		{"NaN weight", with(func(w *strategy.WindowHit) { w.Weight = math.NaN() }), "weight NaN"},
		{"NaN max", with(func(w *strategy.WindowHit) { w.Max = math.NaN() }), "max is NaN"},
		{"NaN value", with(func(w *strategy.WindowHit) { w.Value = math.NaN() }), "value NaN"},
		{"infinite value", with(func(w *strategy.WindowHit) { w.Value = math.Inf(1) }), "value +Inf"},
		{"invalid window", with(func(w *strategy.WindowHit) { w.Size = 1500 * time.Microsecond }), "1.5ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rejected, err := r.Hit(ctx, "refused", "k", "", tc.windows, false)
			if !errors.Is(err, strategy.ErrRejected) || errors.Is(err, strategy.ErrNotSent) {
				t.Fatalf("err = %v, want one that wraps ErrRejected", err)
			}
			if rejected != -1 {
				t.Errorf("rejected = %d, want -1", rejected)
			}
			if msg := err.Error(); !strings.Contains(msg, tc.want) || !strings.Contains(msg, `namespace "refused"`) {
				t.Errorf("err = %q, want it to name %q and the namespace", msg, tc.want)
			}
		})
	}
	if n := len(keysOf(t, srv.Client(""), "*refused*")); n != 0 {
		t.Errorf("refused hits wrote %d keys", n)
	}
	// 16 windows are fine.
	if _, _, err := r.Hit(ctx, "refused", "k", "", slices.Repeat([]strategy.WindowHit{good}, 16), false); err != nil {
		t.Errorf("a hit of 16 windows: %v", err)
	}
}

// Many goroutines hitting one key with a limit: exactly the limit's worth
// of hits is admitted, as the script decides atomically.
func TestHitConcurrentAdmitsExactlyMax(t *testing.T) {
	_, r := startStandalone(t)
	ctx := testCtx(t)
	windows := []strategy.WindowHit{
		{Size: time.Minute, Start: futureStart(time.Minute), Value: 1, Max: 50},
		{Size: time.Hour, Start: futureStart(time.Hour), Value: 1, Max: 1000},
	}
	const workers, each = 8, 25
	admitted := make(chan int, workers)
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			n := 0
			for range each {
				_, rejected, err := r.Hit(ctx, "conc", "k", "", windows, true)
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				if rejected == -1 {
					n++
				}
			}
			admitted <- n
		}()
	}
	total := 0
	for range workers {
		select {
		case err := <-errs:
			t.Fatal(err)
		case n := <-admitted:
			total += n
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	if total != 50 {
		t.Errorf("%d hits admitted, want 50", total)
	}
	checkWindows(t, r, "conc", "k", windows, 50, 50)
}

// notSent recognises the errors of commands that never left the client.
func TestNotSent(t *testing.T) {
	opErr := func(op string, err error) error {
		return &net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, err)}
	}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{opErr("dial", syscall.ECONNREFUSED), true},
		{fmt.Errorf("redis: %w", opErr("dial", syscall.ETIMEDOUT)), true},
		{goredis.ErrPoolTimeout, true},
		{goredis.ErrClosed, true},
		{opErr("read", syscall.ECONNRESET), false},
		{opErr("write", syscall.EPIPE), false},
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
		{io.EOF, false},
	} {
		err := notSent(tc.err)
		if got := errors.Is(err, strategy.ErrNotSent); got != tc.want {
			t.Errorf("notSent(%v) wraps ErrNotSent: %v, want %v", tc.err, got, tc.want)
		}
		if !errors.Is(err, tc.err) {
			t.Errorf("notSent(%v) = %v, which lost the cause", tc.err, err)
		}
	}
}
