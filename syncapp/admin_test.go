package syncapp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/window"
)

// adminOf returns the admin API working with a node's app. In a server it
// works with the running app; tests play several nodes in one process.
func adminOf(n *node) *AdminAPI {
	return &AdminAPI{logger: zap.NewNop(), app: func() *App { return n.app }}
}

// call sends a request to the admin API and returns the status and body
// that Caddy's admin server answers with: an error must be a
// caddy.APIError, which Caddy writes as {"error": "..."}.
func call(t *testing.T, api *AdminAPI, method, target string) (int, http.Header, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	err := api.serve(rec, httptest.NewRequest(method, target, nil))
	if err == nil {
		return rec.Code, rec.Header(), rec.Body.Bytes()
	}
	apiErr, ok := err.(caddy.APIError) // as Caddy's admin server checks it
	if !ok {
		t.Fatalf("%s %s: the error is not a caddy.APIError: %v", method, target, err)
	}
	body, _ := json.Marshal(map[string]string{"error": apiErr.Err.Error()})
	return apiErr.HTTPStatus, rec.Header(), body
}

// keyPath is the admin path of a key of a namespace.
func keyPath(namespace, key string) string {
	return "/rate_limit/namespaces/" + url.PathEscape(namespace) + "/keys?key=" + url.QueryEscape(key)
}

// readKey reads a key through the admin API.
func readKey(t *testing.T, api *AdminAPI, method, target string) keyInfo {
	t.Helper()
	status, _, body := call(t, api, method, target)
	if status != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, target, status, body)
	}
	var info keyInfo
	if err := json.Unmarshal(body, &info); err != nil {
		t.Fatalf("%s %s: %v in %s", method, target, err, body)
	}
	return info
}

func TestAdminListsNamespaces(t *testing.T) {
	mem := memoryStore(t).strategy
	n := start(t, caddy.NewUsagePool(), fmt.Sprintf(`{
		"zones": {"small": {"max_keys": 100}},
		"namespaces": {
			"api": {"zone": "small", "sync_rate": "1h", "window_sizes": ["1m", "1s"], "strategy": %s},
			"strict": {"sync_rate": "0", "window_sizes": ["1h"], "on_store_failure": "share", "strategy": %s},
			"a/b": {}
		}}`, mem, mem))
	ctx := context.Background()
	api := n.ns("api")
	api.Increment(ctx, "x", time.Minute, 1)
	api.Increment(ctx, "y", time.Minute, 1)
	api.Increment(ctx, "y", time.Second, 1)
	n.ns("strict").Increment(ctx, "z", time.Hour, 1)
	n.ns("default").Increment(ctx, "x", time.Hour, 1)

	status, hdr, body := call(t, adminOf(n), http.MethodGet, "/rate_limit/namespaces")
	if status != http.StatusOK || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /rate_limit/namespaces: %d %q %s", status, hdr.Get("Content-Type"), body)
	}
	var got []namespaceInfo
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	want := []namespaceInfo{
		{Name: "a/b", Mode: "local", SyncRate: "off", Zone: "default", WindowSizes: []string{}},
		{Name: "api", Mode: "periodic", SyncRate: "1h0m0s", Zone: "small", WindowSizes: []string{"1s", "1m0s"}, Keys: 2, PendingDiffs: 2, Store: "memory", OnStoreFailure: "allow"},
		{Name: "default", Mode: "local", SyncRate: "off", Zone: "default", WindowSizes: []string{}, Keys: 1},
		{Name: "strict", Mode: "synchronous", SyncRate: "0", Zone: "default", WindowSizes: []string{"1h0m0s"}, Keys: 1, Store: "memory", OnStoreFailure: "share"},
	}
	if !slices.EqualFunc(got, want, func(a, b namespaceInfo) bool {
		return a.Name == b.Name && a.Mode == b.Mode && a.SyncRate == b.SyncRate && a.Zone == b.Zone &&
			slices.Equal(a.WindowSizes, b.WindowSizes) && a.Keys == b.Keys && a.PendingDiffs == b.PendingDiffs && a.Store == b.Store &&
			a.OnStoreFailure == b.OnStoreFailure
	}) {
		t.Fatalf("namespaces:\n%s\nwant %+v", body, want)
	}
	// The same with a trailing slash.
	if status, _, again := call(t, adminOf(n), http.MethodGet, "/rate_limit/namespaces/"); status != http.StatusOK || string(again) != string(body) {
		t.Fatalf("GET /rate_limit/namespaces/: %d %s", status, again)
	}
}

// TestAdminReadsAndResetsAKey reads a key of any bytes from the node and
// from the store, resets it, and checks that a key that differs from it in
// one byte is left alone.
func TestAdminReadsAndResetsAKey(t *testing.T) {
	s := memoryStore(t)
	n := start(t, caddy.NewUsagePool(), s.config("1h", "1m", "1h"))
	ns, api, ctx := n.ns("api"), adminOf(n), context.Background()
	awayFromMinuteEnds()
	const key, near = "a/b?c=d{x}\xff+ &%", "a/b?c=d{x}\xfe+ &%"
	for range 3 {
		ns.Increment(ctx, key, time.Minute, 1)
		ns.Increment(ctx, key, time.Hour, 1)
		ns.Increment(ctx, near, time.Hour, 1)
	}
	if err := ns.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	ns.Increment(ctx, key, time.Hour, 1.5) // pending

	info := readKey(t, api, http.MethodGet, keyPath("api", key))
	if k, err := url.QueryUnescape(info.Key); err != nil || k != key || info.Namespace != "api" || info.Source != "node" {
		t.Fatalf("answer for key %q: %+v", key, info)
	}
	now := time.Now()
	check := func(what string, ws []windowInfo, want ...float64) {
		t.Helper()
		if len(ws) != 2 {
			t.Fatalf("%s: %d windows, want 1m and 1h: %+v", what, len(ws), ws)
		}
		for i, size := range []time.Duration{time.Minute, time.Hour} {
			w := ws[i]
			start := time.Unix(0, window.Start(now.UnixNano(), size)).UTC()
			if w.Size != size.String() || !w.Start.Equal(start) || w.Current != want[i] || w.Previous != 0 || w.Sliding != want[i] {
				t.Errorf("%s: window %d: %+v, want size %v, start %v, current and sliding %v", what, i, w, size, start, want[i])
			}
		}
	}
	check("node", info.Windows, 3, 4.5)
	if p := info.Windows[1].Pending; p == nil || *p != 1.5 || *info.Windows[0].Pending != 0 || *info.Windows[1].PendingPrevious != 0 {
		t.Fatalf("pending diffs: %+v, want 1.5 in the hour", info.Windows)
	}
	stored := readKey(t, api, http.MethodGet, keyPath("api", key)+"&source=store")
	check("store", stored.Windows, 3, 3)
	if stored.Source != "store" || stored.Windows[0].Pending != nil {
		t.Fatalf("from the store: %+v, want source store and no pending diffs", stored)
	}

	reset := readKey(t, api, http.MethodDelete, keyPath("api", key))
	check("the answer to the reset", reset.Windows, 0, 0)
	check("node after the reset", readKey(t, api, http.MethodGet, keyPath("api", key)).Windows, 0, 0)
	check("store after the reset", readKey(t, api, http.MethodGet, keyPath("api", key)+"&source=store").Windows, 0, 0)
	if got := ns.SlidingWindow(near, time.Hour, nil).Current; got != 3 {
		t.Fatalf("a key one byte away counts %v after the reset, want 3", got)
	}
	if got := s.total(t, near, time.Hour); got != 3 {
		t.Fatalf("the store counts %v for a key one byte away after the reset, want 3", got)
	}
	// The empty key is a key (a placeholder that resolved to nothing).
	ns.Increment(ctx, "", time.Minute, 2)
	if got := readKey(t, api, http.MethodGet, "/rate_limit/namespaces/api/keys?key=").Windows[0].Current; got != 2 {
		t.Fatalf("the empty key counts %v, want 2", got)
	}
}

func TestAdminErrors(t *testing.T) {
	n := start(t, caddy.NewUsagePool(), `{"namespaces": {"a/b": {}}}`)
	api := adminOf(n)
	for _, tc := range []struct {
		method, target string
		status         int
		want           string
	}{
		{"GET", "/rate_limit/namespaces/nope/keys?key=k", 404, `unknown namespace \"nope\" (namespaces: a/b, default)`},
		{"DELETE", "/rate_limit/namespaces/nope/keys?key=k", 404, `unknown namespace \"nope\"`},
		{"GET", "/rate_limit/namespaces/default/keys", 400, "key: missing"},
		{"DELETE", "/rate_limit/namespaces/default/keys?source=node", 400, "key: missing"},
		{"GET", "/rate_limit/namespaces/default/keys?key=a&key=b", 400, "key: given 2 times"},
		{"GET", "/rate_limit/namespaces/default/keys?key=a&source=disk", 400, `source: unknown source \"disk\": want node or store`},
		{"GET", "/rate_limit/namespaces/default/keys?key=a&source=store", 400, `source: namespace \"default\" is local only`},
		{"GET", "/rate_limit/namespaces/default/keys?key=%zz", 400, `query \"key=%zz\"`},
		{"POST", "/rate_limit/namespaces/default/keys?key=a", 405, "method not allowed: POST (allowed: GET, DELETE)"},
		{"DELETE", "/rate_limit/namespaces", 405, "method not allowed: DELETE (allowed: GET)"},
		{"GET", "/rate_limit/zones", 404, "resource not found: /rate_limit/zones"},
		{"GET", "/rate_limit/namespaces/default/keys/k", 404, "resource not found"},
		{"GET", "/rate_limit/namespaces/a%2Fb/keys?key=k", 200, `"namespace":"a/b"`},
		{"GET", "/rate_limit/namespaces/nope/bans", 404, `unknown namespace \"nope\"`},
		{"GET", "/rate_limit/namespaces/default/bans?limit=0", 400, `limit: want a whole number of 1 or more, got \"0\"`},
		{"GET", "/rate_limit/namespaces/default/bans?limit=all", 400, `limit: want a whole number of 1 or more, got \"all\"`},
		{"DELETE", "/rate_limit/namespaces/default/bans", 405, "method not allowed: DELETE (allowed: GET)"},
		{"GET", "/rate_limit/namespaces/a%2Fb/bans", 200, `{"namespace":"a/b","total":0,"bans":[]}`},
	} {
		status, hdr, body := call(t, api, tc.method, tc.target)
		if status != tc.status || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s %s: %d %s, want %d and %s", tc.method, tc.target, status, body, tc.status, tc.want)
		}
		if status == 405 && hdr.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without an Allow header", tc.method, tc.target)
		}
	}
	none := &AdminAPI{logger: zap.NewNop(), app: func() *App { return nil }}
	if status, _, body := call(t, none, "GET", "/rate_limit/namespaces"); status != 404 || !strings.Contains(string(body), "the rate_limit app is not running") {
		t.Errorf("with no app running: %d %s", status, body)
	}
}

// TestAdminListsBans lists the bans in force on a node, latest end
// first, keys URL-encoded, within limit; ended and lifted bans are gone.
func TestAdminListsBans(t *testing.T) {
	n := start(t, caddy.NewUsagePool(), `{}`)
	api := adminOf(n)
	ns := n.ns(DefaultName)
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	ns.Ban(ctx, "early", now.Add(time.Minute))
	ns.Ban(ctx, "a key+/", now.Add(time.Hour))
	ns.Ban(ctx, "lifted", now.Add(2*time.Hour))
	ns.Ban(ctx, "ended", now.Add(-time.Second))
	if err := ns.Reset(ctx, "lifted"); err != nil {
		t.Fatal(err)
	}
	list := func(target string) bansInfo {
		t.Helper()
		status, _, body := call(t, api, "GET", target)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", target, status, body)
		}
		var got bansInfo
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("%v in %s", err, body)
		}
		return got
	}
	got := list("/rate_limit/namespaces/default/bans")
	want := bansInfo{Namespace: DefaultName, Total: 2, Bans: []banInfo{
		{Key: url.QueryEscape("a key+/"), Until: now.Add(time.Hour).UTC()},
		{Key: "early", Until: now.Add(time.Minute).UTC()},
	}}
	if got.Namespace != want.Namespace || got.Total != want.Total || !slices.EqualFunc(got.Bans, want.Bans, func(a, b banInfo) bool {
		return a.Key == b.Key && a.Until.Equal(b.Until)
	}) {
		t.Fatalf("bans: %+v, want %+v", got, want)
	}
	if got := list("/rate_limit/namespaces/default/bans?limit=1"); got.Total != 2 || len(got.Bans) != 1 || got.Bans[0].Key != want.Bans[0].Key {
		t.Errorf("limit=1: %+v, want the total and the latest ban only", got)
	}
}

// TestRunningAppIsTheNewest: the admin API works with the newest started
// app; when it stops (a reload that failed to start, or the old config of
// one that succeeded) the one before it, still running, takes over.
func TestRunningAppIsTheNewest(t *testing.T) {
	before := runningApp()
	old := start(t, caddy.NewUsagePool(), `{}`)
	if runningApp() != old.app {
		t.Fatal("a started app is not the running one")
	}
	next, err := provision(t, caddy.NewUsagePool(), `{}`)
	if err != nil {
		t.Fatal(err)
	}
	if runningApp() != old.app {
		t.Fatal("an app that is only provisioned (as by caddy validate) took over")
	}
	if err := next.app.Start(); err != nil {
		t.Fatal(err)
	}
	if runningApp() != next.app {
		t.Fatal("the newest started app is not the running one")
	}
	next.stop() // the reload failed after all
	if runningApp() != old.app {
		t.Fatal("after the newest app stopped, the one still running is not")
	}
	old.stop()
	if runningApp() != before {
		t.Fatal("a stopped app is still the running one")
	}
}

// TestFleetResetThroughTheAdminAPI runs two nodes on one store at
// sync_rate 100ms. A key at its limit, which clients keep trying, is reset
// through one node's admin API: the store's counts are zero at once, and
// both nodes admit the key again within two sync intervals: the other node
// fetches the key, which its clients keep touching, and applies the zeros.
func TestFleetResetThroughTheAdminAPI(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		const interval = 100 * time.Millisecond
		cfg := s.config(interval.String(), "1h")
		na, nb := start(t, caddy.NewUsagePool(), cfg), start(t, caddy.NewUsagePool(), cfg)
		a, b := na.ns("api"), nb.ns("api")
		ctx := context.Background()
		for _, ns := range []*Namespace{a, b} { // connect first
			ns.Increment(ctx, "warm-up", time.Hour, 1)
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		const key, limit = "client", 10
		limits := []Limit{{Size: time.Hour, Max: limit}}
		// A client's try: rejected tries count nothing (disable_penalty).
		try := func(ns *Namespace) bool {
			var out [1]window.Sample
			return ns.Hit(ctx, key, limits, 1, false, true, out[:]) < 0
		}
		for range limit / 2 {
			try(a)
			try(b)
		}
		// Both windows: the hour may end during the test.
		seen := func(ns *Namespace) float64 { return both(ns.SlidingWindow(key, time.Hour, nil)) }
		poll.Until(t, 10*time.Second, "both nodes to see the key at its limit", func() bool {
			return seen(a) == limit && seen(b) == limit
		})
		// Clients keep trying, at least 30 times and across both nodes'
		// sync runs.
		tries, runs := 0, syncRuns(t, "api")
		poll.Until(t, 20*time.Second, "30 tries and 4 sync runs", func() bool {
			if try(a) || try(b) {
				t.Fatal("a node admitted a key at its limit")
			}
			tries++
			return tries >= 30 && syncRuns(t, "api") >= runs+4
		})
		for _, ns := range []*Namespace{a, b} {
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := s.total(t, key, time.Hour); got != limit {
			t.Fatalf("the store counts %v before the reset, want %d", got, limit)
		}

		status, _, body := call(t, adminOf(na), http.MethodDelete, keyPath("api", key))
		reset := time.Now()
		if status != http.StatusOK {
			t.Fatalf("DELETE through node a: %d %s", status, body)
		}
		if got := s.total(t, key, time.Hour); got != 0 {
			t.Fatalf("the store counts %v right after the reset, want 0", got)
		}

		// Clients keep trying both nodes until each admits them once.
		var wg sync.WaitGroup
		admitted := make([]time.Duration, 2)
		for i, ns := range []*Namespace{a, b} {
			wg.Go(func() {
				// Not a wait of the test: a client's pace, the precision of the
				// time it measures.
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					if try(ns) {
						admitted[i] = time.Since(reset)
						return
					}
				}
				admitted[i] = -1
			})
		}
		wg.Wait()
		t.Logf("admitted again after the reset: by node a in %v, by node b in %v (sync_rate %v)", admitted[0], admitted[1], interval)
		for i, took := range admitted {
			// Two intervals, with room for a loaded machine's scheduler.
			if took < 0 || took > 2*interval+200*time.Millisecond {
				t.Errorf("node %c admitted the key %v after the reset, want within two sync intervals (%v)", 'a'+i, took, 2*interval)
			}
		}
		for _, ns := range []*Namespace{a, b} {
			if err := ns.Sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := s.total(t, key, time.Hour); got != 2 {
			t.Fatalf("the store counts %v after one admitted hit on each node, want 2", got)
		}
	})
}

// TestAdminLongKeys: a client key over MaxKeyLen bytes, which the handler
// counts and bans under its bounded form, can be read and reset through
// the admin API by the key the client sent, and by the bounded form the
// bans listing shows.
func TestAdminLongKeys(t *testing.T) {
	n := start(t, caddy.NewUsagePool(), `{"namespaces": {"api": {"window_sizes": ["1h"]}}}`)
	ns := n.ns("api")
	api := adminOf(n)
	ctx := context.Background()
	limits := []Limit{{Size: time.Hour, Max: 2}}
	out := make([]window.Sample, 1)
	for _, long := range []string{strings.Repeat("a", MaxKeyLen+1), strings.Repeat("b", boundLen), strings.Repeat("c", 4000)} {
		held := BoundKey(long) // as the handler counts it
		for range 3 {
			ns.Hit(ctx, held, limits, 1, false, false, out)
		}
		ns.Ban(ctx, held, time.Now().Add(time.Hour))

		for _, given := range []string{long, held} {
			info := readKey(t, api, http.MethodGet, keyPath("api", given))
			// Both windows: the hour may end during the test.
			if info.BannedUntil == nil || len(info.Windows) != 1 || info.Windows[0].Current+info.Windows[0].Previous != 3 {
				t.Fatalf("GET of a %d-byte key by %d bytes: %+v, want its 3 hits and its ban", len(long), len(given), info)
			}
			if info.Key != url.QueryEscape(given) {
				t.Fatalf("GET answered for key %q, want the key given", info.Key)
			}
		}
		info := readKey(t, api, http.MethodDelete, keyPath("api", long))
		if info.BannedUntil != nil || info.Windows[0].Current+info.Windows[0].Previous != 0 {
			t.Fatalf("DELETE of a %d-byte key: %+v, want no hits and no ban", len(long), info)
		}
		if !ns.BannedUntil(held).IsZero() || both(ns.SlidingWindow(held, time.Hour, nil)) != 0 {
			t.Fatalf("after the DELETE of a %d-byte key, the handler's key is still counted or banned", len(long))
		}
	}
}
