package syncapp

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/window"
)

// HitIfRoom in a local namespace is the node's: it waits for a window
// length after the last hit. Where the store decides, it is a hit that
// counts nothing when refused, and waits for the store's rate.
func TestHitIfRoom(t *testing.T) {
	limits := []Limit{{Size: time.Hour, Max: 2}}
	out := make([]window.Sample, 1)
	for _, tc := range []struct {
		name, cfg string
		// wait bounds the wait of a full key: an hour after the last hit,
		// or until the hour window's rate falls under the limit.
		minWait, maxWait time.Duration
	}{
		{"local", `{"namespaces": {"api": {"window_sizes": ["1h"]}}}`, time.Hour - time.Minute, time.Hour + time.Second},
		{"synchronous", `{"namespaces": {"api": {"sync_rate": "0", "window_sizes": ["1h"], "strategy": {"module": "memory", "name": %q}}}}`, time.Millisecond, 2 * time.Hour},
		{"sync_above", `{"namespaces": {"api": {"sync_rate": "1h", "sync_above": 0.5, "window_sizes": ["1h"], "strategy": {"module": "test_counting", "name": %q}}}}`, time.Millisecond, 2 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if tc.name != "local" {
				cfg = fmt.Sprintf(cfg, fmt.Sprintf("%s-%d", t.Name(), rand.Uint64()))
			}
			ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
			ctx := t.Context()
			for i := range 2 {
				if rej, wait := ns.HitIfRoom(ctx, "k", limits, 1, false, out); rej != -1 {
					t.Fatalf("hit %d: rejected %d, wait %v", i+1, rej, wait)
				}
			}
			rej, wait := ns.HitIfRoom(ctx, "k", limits, 1, false, out)
			if rej != 0 || wait < tc.minWait || wait > tc.maxWait {
				t.Fatalf("third hit: rejected %d, wait %v; want 0 and a wait in [%v, %v]", rej, wait, tc.minWait, tc.maxWait)
			}
			if rej, wait := ns.HitIfRoom(ctx, "k", limits, 3, false, out); rej != 0 || wait >= 0 {
				t.Fatalf("a hit over the limit: rejected %d, wait %v; want never", rej, wait)
			}
			if got := both(ns.SlidingWindow("k", time.Hour, nil)); got != 2 {
				t.Fatalf("count %v after two admitted and two refused, want 2", got)
			}
		})
	}
}
