package strategytest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Open calls open, fails the test if it fails, and closes the store it
// returns when the test ends, failing the test if that fails: a store's
// own tests open their stores this way.
func Open[S interface{ Close() error }](t testing.TB, open func() (S, error)) S {
	t.Helper()
	s, err := open()
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	})
	return s
}

// AcquireOK takes a slot of s and fails the test unless it was taken with
// wantHeld slots of key held, its own included.
func AcquireOK(t testing.TB, s strategy.Slotter, ns, key, id string, max int, lease time.Duration, wantHeld int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	defer cancel()
	held, ok, err := s.AcquireSlot(ctx, ns, key, id, max, lease)
	if err != nil || !ok || held != wantHeld {
		t.Fatalf("acquiring slot %s of key %q: got held %d, ok %v and error %v, want %d, true and none", id, key, held, ok, err, wantHeld)
	}
}

// SlotsIgnoreTheNodeClock checks that a slot of s expires by the store's
// clock: the node's clock, which setNow sets for s (the clock that dates
// counters and hit IDs), plays no part, an hour behind or ahead.
func SlotsIgnoreTheNodeClock(t *testing.T, s strategy.Slotter, setNow func(now func() time.Time)) {
	t.Helper()
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		setNow(func() time.Time { return time.Now().Add(skew) })
		ns := fmt.Sprint("skew", skew)
		start := time.Now()
		AcquireOK(t, s, ns, "k", "a", 1, 2*time.Second, 1)
		held, ok, err := s.AcquireSlot(testContext(t), ns, "k", "b", 1, time.Minute)
		if err != nil || (ok && time.Since(start) < 2*time.Second) {
			t.Errorf("node clock %v off: acquiring a second slot of max 1: got held %d, ok %v and error %v, want it refused", skew, held, ok, err)
		}
	}
}
