package syncapp

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/window"
)

// forget has ns's runs stop fetching key, as they do once a key was not
// touched for a few runs.
func forget(t *testing.T, ns *Namespace, key string) {
	t.Helper()
	if err := ns.runs.lock(context.Background(), ns.name); err != nil {
		t.Fatal(err)
	}
	defer ns.runs.unlock()
	ns.fetched.mu.Lock()
	defer ns.fetched.mu.Unlock()
	delete(ns.fetched.touched, key)
}

// TestResetReachesANodeThatForgotTheKey: node b filled a key's limit and
// its runs stopped fetching the key; a resets the key. A burst on b is
// admitted again up to the limit (b's first rejection asks the store,
// which says zero), and b's own hits after that count.
func TestResetReachesANodeThatForgotTheKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		undo bool
	}{{"penalty", false}, {"disable_penalty", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := memoryStore(t)
			cfg := s.config("1h", "1h")
			a := start(t, caddy.NewUsagePool(), cfg).ns("api")
			b := start(t, caddy.NewUsagePool(), cfg).ns("api")
			ctx := context.Background()
			limits := []Limit{{Size: time.Hour, Max: 10}}
			out := make([]window.Sample, 1)
			admitted := func(ns *Namespace, n int) (got int) {
				for range n {
					if ns.Hit(ctx, "k", limits, 1, false, tc.undo, out) < 0 {
						got++
					}
				}
				return got
			}
			awayFromMinuteEnds()
			if got := admitted(b, 10); got != 10 {
				t.Fatalf("b admitted %d of its first 10", got)
			}
			if err := b.Sync(ctx); err != nil { // pushed, and fetched
				t.Fatal(err)
			}
			if got := admitted(b, 1); got != 0 {
				t.Fatal("b admitted past the limit")
			}
			if err := b.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			forget(t, b, "k")
			if err := a.Reset(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			if got := admitted(b, 11); got != 10 {
				t.Fatalf("after a reset on a, b admitted %d of a burst of 11, want 10", got)
			}
			if err := b.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if got, want := s.total(t, "k", time.Hour), map[bool]float64{false: 11, true: 10}[tc.undo]; got != want {
				t.Fatalf("the store counts %v hits after the reset, want %v", got, want)
			}
		})
	}
}
