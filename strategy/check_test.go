package strategy_test

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

func TestCheckSize(t *testing.T) {
	for _, size := range []time.Duration{time.Millisecond, time.Second, 1500 * time.Millisecond, time.Hour, 7 * 24 * time.Hour} {
		if err := strategy.CheckSize(size); err != nil {
			t.Errorf("CheckSize(%v) = %v, want nil", size, err)
		}
	}
	for _, size := range []time.Duration{0, -time.Second, time.Nanosecond, time.Microsecond, 1500 * time.Microsecond, time.Second + 1} {
		err := strategy.CheckSize(size)
		if !errors.Is(err, strategy.ErrInvalidWindow) || !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("CheckSize(%v) = %v, want an error that wraps ErrInvalidWindow and ErrRejected", size, err)
			continue
		}
		if want := "size " + size.String() + " is not a positive whole number of milliseconds"; !strings.Contains(err.Error(), want) {
			t.Errorf("CheckSize(%v) = %q, want it to say %q", size, err, want)
		}
	}
}

func TestCheckSizes(t *testing.T) {
	if err := strategy.CheckSizes([]time.Duration{time.Second, time.Minute}); err != nil {
		t.Errorf("CheckSizes of good sizes = %v, want nil", err)
	}
	err := strategy.CheckSizes([]time.Duration{time.Second, time.Minute, time.Microsecond, -time.Second})
	if !errors.Is(err, strategy.ErrInvalidWindow) || !strings.HasPrefix(err.Error(), "sizes[2]: ") {
		t.Errorf("CheckSizes = %v, want the first bad size, sizes[2], wrapping ErrInvalidWindow", err)
	}
}

func TestCheckWindow(t *testing.T) {
	size := time.Minute
	for _, start := range []int64{0, 3 * int64(size), -int64(size), 29_000_000 * int64(size)} {
		if err := strategy.CheckWindow(size, start); err != nil {
			t.Errorf("CheckWindow(%v, %d) = %v, want nil", size, start, err)
		}
	}
	for _, tc := range []struct {
		size  time.Duration
		start int64
		want  string
	}{
		{size, int64(time.Second), "start 1000000000 is not a multiple of size 1m0s"},
		{size, 1, "start 1 is not a multiple of size 1m0s"},
		{size, -int64(size) + 1, "start -59999999999 is not a multiple of size 1m0s"},
		{0, 0, "size 0s is not a positive whole number of milliseconds"},
		{1500 * time.Microsecond, 0, "size 1.5ms is not"},
	} {
		err := strategy.CheckWindow(tc.size, tc.start)
		if !errors.Is(err, strategy.ErrInvalidWindow) || !errors.Is(err, strategy.ErrRejected) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckWindow(%v, %d) = %v, want ErrInvalidWindow saying %q", tc.size, tc.start, err, tc.want)
		}
	}
}

func TestCheckHit(t *testing.T) {
	size := time.Hour
	good := strategy.WindowHit{Size: size, Start: 5 * int64(size), Value: 1, Max: 10, Weight: 0.5}
	with := func(f func(*strategy.WindowHit)) []strategy.WindowHit {
		w := good
		f(&w)
		return []strategy.WindowHit{good, w} // the bad window second
	}

	for _, tc := range []struct {
		name    string
		id      string
		windows []strategy.WindowHit
	}{
		{"one window", "", []strategy.WindowHit{good}},
		{"16 windows", "", slices.Repeat([]strategy.WindowHit{good}, strategy.MaxHitWindows)},
		{"an ID of 256 bytes", strings.Repeat("i", strategy.MaxIDLen), []strategy.WindowHit{good}},
		{"zero value", "id", with(func(w *strategy.WindowHit) { w.Value = 0 })},
		{"negative value", "id", with(func(w *strategy.WindowHit) { w.Value = -2.5 })},
		{"weight 0", "id", with(func(w *strategy.WindowHit) { w.Weight = 0 })},
		{"weight 1", "id", with(func(w *strategy.WindowHit) { w.Weight = 1 })},
		{"no limit", "id", with(func(w *strategy.WindowHit) { w.Max = math.Inf(1) })},
		{"a limit of -Inf", "id", with(func(w *strategy.WindowHit) { w.Max = math.Inf(-1) })},
	} {
		if err := strategy.CheckHit(tc.id, tc.windows); err != nil {
			t.Errorf("%s: CheckHit = %v, want nil", tc.name, err)
		}
	}

	for _, tc := range []struct {
		name    string
		id      string
		windows []strategy.WindowHit
		invalid bool // a bad window: wraps ErrInvalidWindow
		want    string
	}{
		{"no windows", "", nil, false, "a hit takes 1 to 16 windows, got 0"},
		{"17 windows", "", slices.Repeat([]strategy.WindowHit{good}, 17), false, "a hit takes 1 to 16 windows, got 17"},
		{"an ID of 257 bytes", strings.Repeat("i", 257), []strategy.WindowHit{good}, false, "the hit's ID has 257 bytes, more than 256"},
		{"NaN value", "", with(func(w *strategy.WindowHit) { w.Value = math.NaN() }), false, "windows[1]: value NaN is not a finite number"},
		{"infinite value", "", with(func(w *strategy.WindowHit) { w.Value = math.Inf(1) }), false, "windows[1]: value +Inf is not a finite number"},
		{"negative infinite value", "", with(func(w *strategy.WindowHit) { w.Value = math.Inf(-1) }), false, "windows[1]: value -Inf is not a finite number"},
		{"negative weight", "", with(func(w *strategy.WindowHit) { w.Weight = -0.1 }), false, "windows[1]: weight -0.1 is not in [0, 1]"},
		{"weight over 1", "", with(func(w *strategy.WindowHit) { w.Weight = 1.5 }), false, "windows[1]: weight 1.5 is not in [0, 1]"},
		{"NaN weight", "", with(func(w *strategy.WindowHit) { w.Weight = math.NaN() }), false, "windows[1]: weight NaN is not in [0, 1]"},
		{"NaN max", "", with(func(w *strategy.WindowHit) { w.Max = math.NaN() }), false, "windows[1]: max is NaN"},
		{"size not whole milliseconds", "", with(func(w *strategy.WindowHit) { w.Size, w.Start = 1500*time.Microsecond, 0 }), true, "windows[1]: invalid window: rejected by the strategy: size 1.5ms"},
		{"zero size", "", with(func(w *strategy.WindowHit) { w.Size, w.Start = 0, 0 }), true, "windows[1]: invalid window: rejected by the strategy: size 0s"},
		{"misaligned start", "", with(func(w *strategy.WindowHit) { w.Start += int64(time.Millisecond) }), true, "windows[1]: invalid window: rejected by the strategy: start 18000001000000 is not a multiple of size 1h0m0s"},
	} {
		err := strategy.CheckHit(tc.id, tc.windows)
		if !errors.Is(err, strategy.ErrRejected) || errors.Is(err, strategy.ErrInvalidWindow) != tc.invalid {
			t.Errorf("%s: CheckHit = %v, want an error that wraps ErrRejected (and ErrInvalidWindow: %v)", tc.name, err, tc.invalid)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CheckHit = %q, want it to say %q", tc.name, err, tc.want)
		}
	}
}

// The lives of ID records are ordered as their documentation says.
func TestIDLives(t *testing.T) {
	if !(0 < strategy.MinBatchIDLife && strategy.MinBatchIDLife < strategy.MinHitIDLife && strategy.MinHitIDLife < strategy.MaxHitIDLife) {
		t.Errorf("MinBatchIDLife %v, MinHitIDLife %v, MaxHitIDLife %v: want 0 < each < the next",
			strategy.MinBatchIDLife, strategy.MinHitIDLife, strategy.MaxHitIDLife)
	}
}
