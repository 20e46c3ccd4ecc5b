package syncapp

import (
	"testing"
	"time"
)

// A periodic run fetches a beat after the instant all nodes push, however
// late the run started within its interval.
func TestFetchAfter(t *testing.T) {
	base := time.Unix(1_700_000_040, 0) // a multiple of every interval below
	for _, tc := range []struct {
		interval, late, want time.Duration
	}{
		{100 * time.Millisecond, 0, 10 * time.Millisecond},
		{100 * time.Millisecond, 3 * time.Millisecond, 10 * time.Millisecond},
		{100 * time.Millisecond, 40 * time.Millisecond, 10 * time.Millisecond}, // already past: no wait
		{10 * time.Millisecond, time.Millisecond, 2 * time.Millisecond},
		{time.Second, 5 * time.Millisecond, 10 * time.Millisecond},
		{time.Minute, 0, 10 * time.Millisecond},
	} {
		got := fetchAfter(base.Add(tc.late), tc.interval)
		if want := base.Add(tc.want); !got.Equal(want) {
			t.Errorf("interval %v, run %v late: fetch at +%v, want +%v", tc.interval, tc.late, got.Sub(base), tc.want)
		}
	}
}
