package syncapp

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// readCounter counts the hits of a hit queue's round trips that only
// read: every window's increment 0, no limit.
type readCounter struct {
	strategy.BatchHitter
	n atomic.Int64
}

func (c *readCounter) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	for _, h := range hits {
		read := h.Rate == nil
		for _, w := range h.Windows {
			read = read && w.Value == 0 && math.IsInf(w.Max, 1)
		}
		if read {
			c.n.Add(1)
		}
	}
	c.BatchHitter.HitBatch(ctx, namespace, id, hits, results)
}

// forget has ns's runs stop fetching key, as they do once a key was not
// touched for a few runs.
func forget(t *testing.T, ns *Namespace, key string) {
	t.Helper()
	if err := ns.runner.lock.lock(context.Background(), ns.name); err != nil {
		t.Fatal(err)
	}
	defer ns.runner.lock.unlock()
	ns.runner.fetched.mu.Lock()
	defer ns.runner.fetched.mu.Unlock()
	delete(ns.runner.fetched.touched, key)
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
			reads := &readCounter{BatchHitter: b.road.store.BatchHitter}
			b.road.store.BatchHitter = reads
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
			// The first rejection read the store in the hit queue's round
			// trip; the runs fetch the key after that.
			if got := reads.n.Load(); got != 1 {
				t.Fatalf("b read the store %d times in its hit queue's round trips, want 1", got)
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
