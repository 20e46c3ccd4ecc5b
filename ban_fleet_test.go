package ratelimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// TestBanAcrossNodes runs two Caddy processes sharing a Redis with limit 3
// 1s and ban 5s: a key that trips the limit on the first node is rejected
// by the second two seconds later, when its rate alone would pass, and is
// served by both once the ban ends.
func TestBanAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	nodes := startFleet(t, 2, srv.Addr, "100ms",
		map[string]any{
			"handler":   "rate_limit",
			"namespace": "api",
			"key":       "{http.request.header.X-Key}",
			"limits":    []any{map[string]any{"limit": 3, "window": "1s"}},
			"ban":       "5s",
		},
		map[string]any{"handler": "static_response", "body": "ok"})
	first, second := nodes[0], nodes[1]

	tripLimit3(t, "first node", func() (int, string) { return nodeGet(first, "k") })
	tripped := time.Now()
	nodeGet(first, "control") // a key that was never banned

	time.Sleep(time.Until(tripped.Add(2 * time.Second))) // not an event: Retry-After is read 2 s into the ban by the nodes' wall clock
	status, retryAfter := nodeGet(second, "k")
	if status != http.StatusTooManyRequests {
		t.Fatalf("second node, 2s after the ban: status %d, want 429; its log:\n%s", status, second.Log(20))
	}
	if retryAfter != "3" {
		t.Errorf("second node: Retry-After %q, want the ban's 3 seconds left", retryAfter)
	}
	if got, _ := nodeGet(second, "control"); got != 200 {
		t.Errorf("second node, a key never banned: status %d, want 200", got)
	}

	time.Sleep(time.Until(tripped.Add(5500 * time.Millisecond))) // not an event: the wall clock must pass the ban's end
	for _, n := range nodes {
		if got, _ := nodeGet(n, "k"); got != 200 {
			t.Errorf("after the ban: status %d, want 200", got)
		}
	}
}

// tripLimit3 sends requests of one key under limit 3 1s with get, which
// returns a response's status and Retry-After, until one is rejected, and
// returns that one's Retry-After. The first three must pass. The fourth
// trips the limit unless the first three ended a window and a slow
// machine let a third of the next pass before it (the sliding estimate
// then weighs them less); the next ones do, and ten in a row must.
func tripLimit3(t *testing.T, what string, get func() (status int, retryAfter string)) string {
	t.Helper()
	for i := range 3 {
		if status, _ := get(); status != http.StatusOK {
			t.Fatalf("%s, request %d: status %d, want 200", what, i+1, status)
		}
	}
	for range 7 {
		if status, retryAfter := get(); status == http.StatusTooManyRequests {
			return retryAfter
		}
	}
	t.Fatalf("%s: 10 requests in a row never tripped limit 3 1s", what)
	return ""
}
