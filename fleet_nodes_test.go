package ratelimit

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
)

// startFleet builds Caddy with the plugin and runs n nodes of it as
// separate processes on loopback, stopped at the end of the test. They
// share the Redis at redisAddr in the namespace api (syncing every
// syncRate), and each serves /ready, and every other path with handlers.
func startFleet(t *testing.T, n int, redisAddr, syncRate string, handlers ...map[string]any) []*caddyproc.Node {
	t.Helper()
	return startFleetOn(t, n, map[string]any{"module": "redis", "addresses": []string{redisAddr}}, syncRate, handlers...)
}

// startFleetOn is startFleet on any store: strategy is its JSON.
func startFleetOn(t *testing.T, n int, strategy map[string]any, syncRate string, handlers ...map[string]any) []*caddyproc.Node {
	t.Helper()
	bin, err := caddyproc.BuildHere(t.Context(), ".")
	if err != nil {
		t.Fatal(err)
	}
	config := func([]int) ([]byte, error) {
		return json.Marshal(map[string]any{
			"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
			"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "WARN"}}},
			"apps": map[string]any{
				"rate_limit": map[string]any{"namespaces": map[string]any{"api": map[string]any{
					"sync_rate": syncRate,
					"strategy":  strategy,
				}}},
				"http": map[string]any{"servers": map[string]any{"fleet": map[string]any{
					"listen":          []string{caddyproc.Listen(0)},
					"automatic_https": map[string]any{"disable": true},
					"routes": []any{
						map[string]any{
							"match":  []any{map[string]any{"path": []string{"/ready"}}},
							"handle": []any{map[string]any{"handler": "static_response", "body": "ok"}},
						},
						map[string]any{"handle": handlers},
					},
				}}},
			},
		})
	}
	nodes, err := caddyproc.StartAll(t.Context(), bin, t.TempDir(), n, "/ready", 1, config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddyproc.StopAll(nodes) })
	return nodes
}

// nodeClient is the client of the tests that run nodes as processes.
var nodeClient = &http.Client{Timeout: 5 * time.Second}

// nodeGet requests /api from node n with the X-Key header set to key, and
// returns the response's status and Retry-After, or 0 if the request
// failed (as it does to a node that was killed).
func nodeGet(n *caddyproc.Node, key string) (status int, retryAfter string) {
	req, _ := http.NewRequest(http.MethodGet, n.URL("/api"), nil)
	req.Header.Set("X-Key", key)
	resp, err := nodeClient.Do(req)
	if err != nil {
		return 0, ""
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}
