package ratelimit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
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
	bin, err := caddyproc.BuildHere(t.Context(), ".")
	if err != nil {
		t.Fatal(err)
	}

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

	config := func(port int) ([]byte, error) {
		return json.Marshal(map[string]any{
			"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
			"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "WARN"}}},
			"apps": map[string]any{
				"rate_limit": map[string]any{"namespaces": map[string]any{"api": map[string]any{
					"sync_rate": "100ms",
					"strategy":  map[string]any{"module": "redis", "addresses": []string{srv.Addr}},
				}}},
				"http": map[string]any{"servers": map[string]any{"kill": map[string]any{
					"listen":          []string{fmt.Sprintf("127.0.0.1:%d", port)},
					"automatic_https": map[string]any{"disable": true},
					"routes": []any{
						map[string]any{
							"match":  []any{map[string]any{"path": []string{"/ready"}}},
							"handle": []any{map[string]any{"handler": "static_response", "body": "ok"}},
						},
						map[string]any{"handle": []any{
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
							},
						}},
					},
				}}},
			},
		})
	}
	nodes, err := caddyproc.StartAll(t.Context(), bin, t.TempDir(), 2, "/ready", config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddyproc.StopAll(nodes) })
	doomed, survivor := nodes[0], nodes[1]

	client := &http.Client{Timeout: 5 * time.Second}
	status := func(n *caddyproc.Node) int {
		req, _ := http.NewRequest(http.MethodGet, n.URL("/api"), nil)
		req.Header.Set("X-Key", "k")
		resp, err := client.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	// Two requests of the key in flight on the doomed node.
	for range 2 {
		go status(doomed)
	}
	deadline := time.Now().Add(10 * time.Second)
	for held.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream got %d of the doomed node's 2 requests; its log:\n%s", held.Load(), doomed.Log(20))
		}
		time.Sleep(10 * time.Millisecond)
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
	for {
		got := status(survivor)
		since := time.Since(killed)
		if got == http.StatusOK {
			t.Logf("the survivor served the key %v after the kill (lease %v)", since.Round(100*time.Millisecond), syncapp.SlotLease)
			break
		}
		if since > 30*time.Second {
			t.Fatalf("%v after the kill the survivor still answers %d; its log:\n%s", since.Round(time.Millisecond), got, survivor.Log(20))
		}
		time.Sleep(250 * time.Millisecond)
	}
}
