package syncapp

import (
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/accuracy"
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

// The accuracy harness checks admissions against the beat with a copy of
// its own (it measures Caddy binaries of any commit, so it does not link
// this package): the copy must stay the beat.
func TestAccuracyHarnessKnowsTheBeat(t *testing.T) {
	for _, iv := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, time.Second} {
		if got, want := accuracy.FetchBeat(iv), fetchBeat(iv); got != want {
			t.Errorf("sync_rate %v: the harness's beat is %v, the loop.s %v", iv, got, want)
		}
	}
}
