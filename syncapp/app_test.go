package syncapp

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/window"
)

// node is one loaded config of the app, as Caddy would run it.
type node struct {
	t      testing.TB
	app    *App
	cancel context.CancelFunc
	done   bool
}

// provision loads cfg (the app's JSON) into a new App that uses pool, as
// Caddy's Provision would; the returned node is cleaned up at the end of
// the test.
func provision(t testing.TB, pool *caddy.UsagePool, cfg string) (*node, error) {
	t.Helper()
	return provisionAt(t, pool, cfg, nil)
}

// provisionAt is provision with the zones the app makes reading clock
// (nil: the system's).
func provisionAt(t testing.TB, pool *caddy.UsagePool, cfg string, clock window.Clock) (*node, error) {
	t.Helper()
	a := new(App)
	if err := json.Unmarshal([]byte(cfg), a); err != nil {
		t.Fatalf("config %s: %v", cfg, err)
	}
	a.pool, a.clock = pool, clock
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	n := &node{t: t, app: a, cancel: cancel}
	err := a.Provision(ctx)
	if err != nil {
		n.cleanup()
		return nil, err
	}
	t.Cleanup(n.stop)
	return n, nil
}

// start provisions and starts a node.
func start(t testing.TB, pool *caddy.UsagePool, cfg string) *node {
	t.Helper()
	n, err := provision(t, pool, cfg)
	if err != nil {
		t.Fatalf("provisioning %s: %v", cfg, err)
	}
	if err := n.app.Start(); err != nil {
		t.Fatalf("starting: %v", err)
	}
	return n
}

// stop stops the node and cleans it up, as Caddy does with an old config.
func (n *node) stop() {
	if n.done {
		return
	}
	if err := n.app.Stop(); err != nil {
		n.t.Errorf("stopping: %v", err)
	}
	n.cleanup()
}

func (n *node) cleanup() {
	n.done = true
	n.cancel() // cleans up the modules the app loaded (strategies)
	if err := n.app.Cleanup(); err != nil {
		n.t.Errorf("cleanup: %v", err)
	}
}

func (n *node) ns(name string) *Namespace {
	n.t.Helper()
	ns, err := n.app.Namespace(name)
	if err != nil {
		n.t.Fatal(err)
	}
	return ns
}

func TestDefaultNamespaceNeedsNoConfig(t *testing.T) {
	n := start(t, caddy.NewUsagePool(), `{}`)
	ns := n.ns("default")
	if ns.Mode() != Local {
		t.Fatalf("default namespace mode = %v, want local", ns.Mode())
	}
	for range 3 {
		ns.Increment(context.Background(), "k", time.Hour, 1)
	}
	if got := both(ns.SlidingWindow("k", time.Hour, nil)); got != 3 {
		t.Fatalf("count = %v, want 3", got)
	}
	diff := 10.0
	if got := ns.SlidingWindow("k", time.Hour, &diff).Current; got != 10 {
		t.Fatalf("count with cur_diff 10 = %v, want 10", got)
	}
	if s, err := n.app.Increment(context.Background(), "default", "k", time.Hour, 2); err != nil || both(s) != 5 {
		t.Fatalf("App.Increment = %+v, %v; want 5 in the hour (and the one before, which may have ended)", s, err)
	}
	if err := n.app.Sync(context.Background(), "default"); err != nil {
		t.Fatalf("syncing a local namespace: %v", err)
	}
}

func TestUnknownNamespaceNamesTheKnownOnes(t *testing.T) {
	n := start(t, caddy.NewUsagePool(), `{"namespaces": {"api": {}, "web": {}}}`)
	_, err := n.app.Namespace("nope")
	if err == nil || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "api, default, web") {
		t.Fatalf("error = %v, want it to name nope and the namespaces api, default, web", err)
	}
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  string
		want string
	}{
		{`{"zones": {"z": {"max_keys": -5}}}`, `zone "z": max_keys must be positive, got -5`},
		{`{"namespaces": {"api": {"zone": "nope"}}}`, `namespace "api": zone: unknown zone "nope" (zones: default)`},
		{`{"namespaces": {"api": {"sync_rate": "500us", "strategy": {"module": "redis"}}}}`, `namespace "api": sync_rate: 500µs is too short`},
		{`{"namespaces": {"api": {"sync_rate": "100ms"}}}`, `namespace "api": sync_rate 100ms needs a strategy`},
		{`{"namespaces": {"api": {"sync_rate": "0"}}}`, `namespace "api": sync_rate 0 needs a strategy`},
		{`{"namespaces": {"api": {"strategy": {"module": "redis"}}}}`,
			`namespace "api": strategy: a namespace without sync_rate is local only and never uses its strategy: set sync_rate (0 or a duration such as 100ms), or remove the strategy`},
		{`{"namespaces": {"api": {"sync_rate": "1s", "strategy": {"module": "nosuch"}}}}`, `namespace "api": strategy: loading module 'nosuch': unknown module: rate_limit.strategies.nosuch`},
		{`{"namespaces": {"api": {"window_sizes": [-1000000000]}}}`, `namespace "api": window_sizes: window size must be positive, got -1s`},
		{`{"flush_timeout": -1}`, `flush_timeout: must not be negative`},
		{`{"namespaces": {"api": {"sync_rate": "0", "strategy": {"module": "test_slow"}}}}`,
			`namespace "api": sync_rate 0: the test_slow store cannot apply synchronous hits`},
		{`{"namespaces": {"api": {"sync_rate": "1s", "sync_above": 0, "strategy": {"module": "redis"}}}}`,
			`namespace "api": sync_above: 0 is not a fraction of a limit: want a number in (0, 1]`},
		{`{"namespaces": {"api": {"sync_rate": "1s", "sync_above": 1.5, "strategy": {"module": "redis"}}}}`,
			`namespace "api": sync_above: 1.5 is not a fraction of a limit`},
		{`{"namespaces": {"api": {"sync_above": 0.8}}}`,
			`namespace "api": sync_above: only a periodic namespace (sync_rate of at least 1ms) counts keys near their limits at the store; this one is local`},
		{`{"namespaces": {"api": {"sync_rate": "0", "sync_above": 0.8, "strategy": {"module": "redis"}}}}`,
			`this one is synchronous`},
		{`{"namespaces": {"api": {"sync_rate": "1s", "sync_above": 0.8, "strategy": {"module": "test_slow"}}}}`,
			`namespace "api": sync_above: the test_slow store cannot apply synchronous hits`},
		{`{"namespaces": {"api": {"on_store_failure": "share"}}}`,
			`namespace "api": on_store_failure: a local namespace has no store to lose`},
		{`{"namespaces": {"api": {"sync_rate": "1s", "on_store_failure": "block", "strategy": {"module": "redis"}}}}`,
			`namespace "api": on_store_failure: unknown policy "block": want allow, share or deny`},
		{`{"namespaces": {"api": {"sync_rate": "1s", "on_store_failure": "share", "strategy": {"module": "test_slow"}}}}`,
			`namespace "api": on_store_failure: share needs a store that counts the fleet's nodes; the test_slow store cannot`},
		{`{"namespaces": {"api": {"sync_rate": "1s", "window_sizes": ["1500us"], "strategy": {"module": "redis"}}}}`,
			`namespace "api": window_sizes: window 1.5ms: namespace "api" syncs with the redis store: `},
	} {
		pool := caddy.NewUsagePool()
		_, err := provision(t, pool, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want %q", tc.cfg, err, tc.want)
		}
		// A failed provision gives back everything it took.
		pool.Range(func(k, _ any) bool {
			t.Errorf("%s: %v still pooled after a failed provision", tc.cfg, k)
			return true
		})
	}
}

func TestSyncRateJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		mode Mode
		out  string
	}{
		{`"off"`, Local, `"off"`},
		{`"-1s"`, Local, `"off"`},
		{`-5`, Local, `"off"`},
		{`"0"`, Synchronous, `"0"`},
		{`0`, Synchronous, `"0"`},
		{`"100ms"`, Periodic, `"100ms"`},
		{`1000000000`, Periodic, `"1s"`},
		{`"1d"`, Periodic, `"24h0m0s"`},
	} {
		var r SyncRate
		if err := json.Unmarshal([]byte(tc.in), &r); err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if r.Mode() != tc.mode {
			t.Errorf("%s: mode %v, want %v", tc.in, r.Mode(), tc.mode)
		}
		if b, _ := json.Marshal(r); string(b) != tc.out {
			t.Errorf("%s: marshals to %s, want %s", tc.in, b, tc.out)
		}
	}
	var none *SyncRate
	if none.Mode() != Local {
		t.Error("an omitted sync_rate is not local")
	}
	for _, bad := range []string{`"often"`, `true`, `"1x"`} {
		var r SyncRate
		if err := json.Unmarshal([]byte(bad), &r); err == nil || !strings.Contains(err.Error(), "sync_rate") {
			t.Errorf("%s: error = %v, want a sync_rate error", bad, err)
		}
	}
}

// TestReloadKeepsLocalCounters loads a config, counts, then reloads with
// the namespace and zone changed: the counters stay, the pool references
// go from one to two to one, and the last cleanup destroys them.
func TestReloadKeepsLocalCounters(t *testing.T) {
	pool := caddy.NewUsagePool()
	ctx := context.Background()
	old := start(t, pool, `{"zones": {"default": {"max_keys": 1000}}}`)
	for range 7 {
		old.ns("default").Increment(ctx, "k", time.Hour, 1)
	}
	refs := func(kind, name string) int {
		n, _ := pool.References(poolKey{kind, name})
		return n
	}
	next := start(t, pool, `{"zones": {"default": {"max_keys": 2000}}, "namespaces": {"default": {"window_sizes": ["1h"]}}}`)
	if refs("zone", "default") != 2 || refs("namespace", "default") != 2 {
		t.Fatalf("during the overlap: zone refs %d, namespace refs %d, want 2 and 2", refs("zone", "default"), refs("namespace", "default"))
	}
	old.stop()
	if refs("zone", "default") != 1 {
		t.Fatalf("after the old config's cleanup: %d zone refs, want 1", refs("zone", "default"))
	}
	if got := both(next.ns("default").SlidingWindow("k", time.Hour, nil)); got != 7 {
		t.Fatalf("after reload: %v, want 7", got)
	}
	if got := next.app.zones["default"].zone.Capacity(); got != 2000 {
		t.Fatalf("zone capacity after reload = %d, want 2000", got)
	}
	next.stop()
	if _, ok := pool.References(poolKey{"zone", "default"}); ok {
		t.Fatal("zone still pooled after the last config went")
	}
}
