package window

import (
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	const size = time.Minute
	start := int64(1_700_000_040) * int64(time.Second) // a minute's start
	at := func(secs float64) int64 { return start + int64(secs*1e9) }
	for i, tc := range []struct {
		cur, prev, target, pos float64
		fixed                  bool
		want                   time.Duration
	}{
		// Sliding: 2 + 10*(60-t)/60 <= 4 at t = 48; now at 30, so 18s.
		{cur: 2, prev: 10, target: 4, pos: 30, want: 18 * time.Second},
		// Already low enough.
		{cur: 1, prev: 2, target: 4, pos: 30, want: 0},
		// The current count alone is too high: wait for the next window,
		// where 8*(60-t)/60 <= 4 at t = 30: 30s left + 30s.
		{cur: 8, prev: 0, target: 4, pos: 30, want: 60 * time.Second},
		// Fixed: only the current window counts, so its end.
		{cur: 8, prev: 0, target: 4, pos: 30, fixed: true, want: 30 * time.Second},
		{cur: 3, prev: 50, target: 4, pos: 30, fixed: true, want: 0},
		// A limit below one hit: both windows must pass.
		{cur: 0, prev: 0, target: -0.5, pos: 10, want: 110 * time.Second},
		// A sample read before its window (a clock step) waits as at its start.
		{cur: 8, prev: 0, target: 4, pos: -5, fixed: true, want: 60 * time.Second},
	} {
		s := Sample{Current: tc.cur, Previous: tc.prev, Start: start, Size: size}
		if got := s.Until(tc.target, at(tc.pos), tc.fixed); got != tc.want {
			t.Errorf("Test %d: %v, want %v", i, got, tc.want)
		}
	}
}
