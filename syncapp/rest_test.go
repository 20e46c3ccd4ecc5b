package syncapp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// TestPausedStoreDoesNotHoldAWakingNode pauses the store of a periodic
// node that rests (its runs had nothing to fetch, and skip the store's
// feed), at several points of its rest, then hits a key 100 times: the
// first request wakes the node with a read of the feed, which the store
// never answers. Every request is admitted, and none waits out the
// read's timeout (hitTimeout): the read has the stall bound of the hit
// queue, and the node then decides on its own counts.
func TestPausedStoreDoesNotHoldAWakingNode(t *testing.T) {
	srv := redistest.Start(t)
	ns := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "100ms", "1m")).ns("api")
	warmUp(t, ns)
	ctx := context.Background()
	limits := []Limit{{Size: time.Minute, Max: 1e6}}
	out := make([]window.Sample, 1)
	for _, after := range []time.Duration{0, 30 * time.Millisecond, 60 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond} {
		t.Run(fmt.Sprintf("paused_%v_into_the_rest", after), func(t *testing.T) {
			key := "k-" + after.String()
			for range 100 {
				ns.Hit(ctx, key, limits, 1, false, false, out)
			}
			poll.Until(t, 10*time.Second, "the node to rest", func() bool {
				return ns.periodic.near.restingNow() && !ns.health.down()
			})
			time.Sleep(after) // a point of the rest, not a wait for an event
			srv.Pause()
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					srv.Resume()
				}
			}
			defer resume()
			var slowest time.Duration
			for i := range 100 {
				begin := time.Now()
				if ns.Hit(ctx, key, limits, 1, false, false, out) >= 0 {
					t.Fatalf("hit %d rejected, far from the limit", i+1)
				}
				slowest = max(slowest, time.Since(begin))
			}
			resume()
			t.Logf("slowest of 100 requests on the paused store: %v", slowest)
			if slowest >= hitTimeout {
				t.Fatalf("a request waited %v on the paused store: the read timeout (%v), not the stall bound (%v)", slowest, hitTimeout, stallAfter)
			}
			poll.Until(t, 10*time.Second, "the store back", func() bool { return !ns.health.down() })
		})
	}
}
