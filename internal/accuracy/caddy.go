package accuracy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// Routes of every node. Each answers with the server's clock in
// TimeHeader, so that an admitted request is counted in the window the
// node counted it in, not in the one the client saw it in.
const (
	BarePath  = "/bare" // no limiter: the latency baseline
	OnePath   = "/one"  // the patterns of one key
	ManyPath  = "/many" // the many keys pattern, with its own limit
	KeyHeader = "X-Key"
	// UnitsPath is the budget patterns' route, whose limit is charged
	// what UnitsHeader asks the response to report (response_cost).
	UnitsPath   = "/units"
	UnitsHeader = "X-Want-Units"
	TimeHeader  = "X-Server-Time-Ms"
)

// Window is the limit's window. Fixed windows of one second: each window
// is an independent trial, which one node alone admits exactly the limit
// of.
const Window = time.Second

// NodeConfig is what one node's JSON config is made of.
type NodeConfig struct {
	Listen    string        // the server's listen address: caddyproc.Listen(0) for a node caddyproc starts
	SyncRate  time.Duration // 0: synchronous
	SyncAbove float64       // 0: left out
	Strategy  json.RawMessage
	Limit     float64 // of OnePath
	ManyLimit float64 // of ManyPath, per key
	// Units adds UnitsPath, limited to Limit units charged from the
	// response: only for a budget pattern's row, so that other rows run
	// on a plugin without response_cost.
	Units bool
	// Routes are limited routes of their own, after the three: the spread
	// clients' family has one per limit.
	Routes []LimitRoute
}

// LimitRoute is a limited route with its own limit and window.
type LimitRoute struct {
	Path   string
	Limit  float64
	Window time.Duration
	// Sliding selects window_type sliding; fixed otherwise.
	Sliding bool
}

// JSON returns the node's Caddy config: admin off, nothing persisted, one
// namespace "api" on the store, the three routes and any Routes.
func (c NodeConfig) JSON() ([]byte, error) {
	ns := map[string]any{"sync_rate": c.SyncRate.String(), "strategy": c.Strategy}
	if c.SyncRate == 0 {
		ns["sync_rate"] = "0"
	}
	if c.SyncAbove > 0 {
		ns["sync_above"] = c.SyncAbove
	}
	ok := map[string]any{
		"handler": "static_response",
		"body":    "ok",
		"headers": map[string][]string{TimeHeader: {"{time.now.unix_ms}"}},
	}
	limited := func(path string, limit float64, window time.Duration, windowType string) map[string]any {
		return map[string]any{
			"match": []any{map[string]any{"path": []string{path}}},
			"handle": []any{
				map[string]any{
					"handler":     "rate_limit",
					"namespace":   "api",
					"key":         "{http.request.header." + KeyHeader + "}",
					"limits":      []any{map[string]any{"limit": limit, "window": window.String()}},
					"window_type": windowType,
				},
				ok,
			},
		}
	}
	routes := []any{
		map[string]any{
			"match":  []any{map[string]any{"path": []string{BarePath}}},
			"handle": []any{ok},
		},
		limited(OnePath, c.Limit, Window, "fixed"),
		limited(ManyPath, c.ManyLimit, Window, "fixed"),
	}
	if c.Units {
		budget := limited(UnitsPath, c.Limit, Window, "fixed")
		rl := budget["handle"].([]any)[0].(map[string]any)
		rl["response_cost"] = "{http.response.header.X-Units}"
		// The response reports what the request asked it to: set before
		// the limiter reads it, once the response is written.
		report := map[string]any{"handler": "headers", "response": map[string]any{
			"set": map[string][]string{"X-Units": {"{http.request.header." + UnitsHeader + "}"}}}}
		budget["handle"] = []any{report, rl, ok}
		routes = append(routes, budget)
	}
	for _, r := range c.Routes {
		wt := "fixed"
		if r.Sliding {
			wt = "sliding"
		}
		routes = append(routes, limited(r.Path, r.Limit, r.Window, wt))
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "WARN"}}},
		"apps": map[string]any{
			"rate_limit": map[string]any{"namespaces": map[string]any{"api": ns}},
			"http": map[string]any{
				"grace_period": "2s",
				"servers": map[string]any{"accuracy": map[string]any{
					"listen":          []string{c.Listen},
					"automatic_https": map[string]any{"disable": true},
					"routes":          routes,
				}},
			},
		},
	}
	return json.MarshalIndent(cfg, "", "\t")
}

// ProbeConfig reports whether the Caddy binary accepts a config: it runs
// `caddy validate`, which provisions the config without starting it, so
// it connects to no store. A refusal because of an unknown field, such as
// sync_above before the plugin had it, is reported as false without an
// error.
func ProbeConfig(ctx context.Context, bin, dir string, cfg []byte) (bool, error) {
	path := filepath.Join(dir, "probe.json")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return false, err
	}
	cmd := exec.CommandContext(ctx, bin, "validate", "--config", path)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return true, nil
	}
	if bytes.Contains(out, []byte("unknown field")) {
		return false, nil
	}
	return false, fmt.Errorf("caddy validate: %w\n%s", err, out)
}
