package ratelimit

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/syncapp"
)

// TestKilledNodeFreesItsSlots runs two Caddy processes sharing a Redis
// with max_concurrent 2, fills the key's two slots from the first, kills
// it outright (no cleanup runs) and checks that the second node rejects
// the key until the dead node's leases run out, and serves it within 30 s
// of the kill (syncapp.SlotLease, and a margin).
func TestKilledNodeFreesItsSlots(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// The upstream holds the requests it gets until release is closed.
	release := make(chan struct{})
	var held atomic.Int32
	upstream := slowUpstreamFunc(t, func(w http.ResponseWriter, r *http.Request) {
		held.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "ok")
	})
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	nodes := startFleet(t, 2, srv.Addr, "100ms",
		map[string]any{
			"handler":        "rate_limit",
			"namespace":      "api",
			"key":            "{http.request.header.X-Key}",
			"limits":         []any{map[string]any{"limit": 1000, "window": "1m"}},
			"max_concurrent": 2,
		},
		map[string]any{
			"handler":   "reverse_proxy",
			"upstreams": []any{map[string]any{"dial": upstream}},
		})
	doomed, survivor := nodes[0], nodes[1]

	status := func(n *caddyproc.Node) int {
		code, _ := nodeGet(n, "k")
		return code
	}

	// Two requests of the key in flight on the doomed node.
	for range 2 {
		go status(doomed)
	}
	if !poll.For(10*time.Second, func() bool { return held.Load() >= 2 }) {
		t.Fatalf("the upstream got %d of the doomed node's 2 requests; its log:\n%s", held.Load(), doomed.Log(20))
	}
	if got := status(survivor); got != http.StatusTooManyRequests {
		t.Fatalf("with both slots taken on the other node, the survivor answered %d, want 429", got)
	}

	doomed.Kill()
	killed := time.Now()
	close(release) // from now on the upstream answers at once

	if got := status(survivor); got != http.StatusTooManyRequests {
		t.Errorf("right after the kill the survivor answered %d, want 429: the dead node's slots were freed by no lease", got)
	}
	got := 0
	// Every 250 ms: tries every poll.Interval would pass the key's limit of
	// 1000 a minute before the dead node's 25 s lease ends.
	if !poll.ForEvery(30*time.Second, 250*time.Millisecond, func() bool { got = status(survivor); return got == http.StatusOK }) {
		t.Fatalf("%v after the kill the survivor still answers %d; its log:\n%s", time.Since(killed).Round(time.Millisecond), got, survivor.Log(20))
	}
	t.Logf("the survivor served the key %v after the kill (lease %v)", time.Since(killed).Round(100*time.Millisecond), syncapp.SlotLease)
}
