package strategytest

import (
	"context"
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
