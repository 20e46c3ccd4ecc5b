package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/redis"
	"github.com/ratesync/caddy-ratelimit/window"
)

// adminCall sends a request to Caddy's admin endpoint (the test preamble's
// localhost:2999) and returns the status, the Content-Type and the body.
func adminCall(t *testing.T, method, path string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://localhost:2999"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), body
}

// adminKeyPath is the admin path of a key of a namespace.
func adminKeyPath(namespace, key string) string {
	return "/rate_limit/namespaces/" + url.PathEscape(namespace) + "/keys?key=" + url.QueryEscape(key)
}

// adminKey is the admin API's answer about a key.
type adminKey struct {
	Namespace string `json:"namespace"`
	Key       string `json:"key"`
	Source    string `json:"source"`
	Windows   []struct {
		Size     string     `json:"size"`
		Start    time.Time  `json:"start"`
		Timezone string     `json:"timezone"`
		End      *time.Time `json:"end"`
		Current  float64    `json:"current"`
		Previous float64    `json:"previous"`
		Sliding  float64    `json:"sliding"`
		Pending  *float64   `json:"pending"`
	} `json:"windows"`
}

// adminReadKey reads or resets a key through the admin endpoint.
func adminReadKey(t *testing.T, method, path string) adminKey {
	t.Helper()
	status, ctype, body := adminCall(t, method, path)
	if status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("%s %s: %d %s %s", method, path, status, ctype, body)
	}
	var k adminKey
	if err := json.Unmarshal(body, &k); err != nil {
		t.Fatalf("%s %s: %v in %s", method, path, err, body)
	}
	return k
}

// current returns the count of a key's only window and of the one before
// it: a test's hits of its own key, when the window ended during the test.
func (k adminKey) current(t *testing.T) float64 {
	t.Helper()
	if len(k.Windows) != 1 {
		t.Fatalf("%d windows, want one: %+v", len(k.Windows), k)
	}
	return k.Windows[0].Current + k.Windows[0].Previous
}

func TestAdminAPIListsNamespacesAfterAReload(t *testing.T) {
	srv := redistest.Start(t)
	options := func(name string) string {
		return fmt.Sprintf(`
		rate_limit {
			zone small {
				max_keys 1000
			}
			namespace %s {
				zone small
				sync_rate 100ms
				window_sizes 1s 1m
				strategy redis {
					addresses %s
				}
			}
		}`, name, srv.Addr)
	}
	const site = `
	http://localhost:9080 {
		respond "ok"
	}`
	loadWithOptions(t, options("first"), site)
	loadWithOptions(t, options("second"), site) // a reload: the new app answers
	status, ctype, body := adminCall(t, http.MethodGet, "/rate_limit/namespaces")
	if status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("GET /rate_limit/namespaces: %d %s %s", status, ctype, body)
	}
	type namespace struct {
		Name         string   `json:"name"`
		Mode         string   `json:"mode"`
		SyncRate     string   `json:"sync_rate"`
		Zone         string   `json:"zone"`
		WindowSizes  []string `json:"window_sizes"`
		Keys         int      `json:"keys"`
		PendingDiffs int      `json:"pending_diffs"`
		Store        string   `json:"store"`
	}
	var got []namespace
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("%v in %s", err, body)
	}
	want := []namespace{
		{Name: "default", Mode: "local", SyncRate: "off", Zone: "default", WindowSizes: []string{}},
		{Name: "second", Mode: "periodic", SyncRate: "100ms", Zone: "small", WindowSizes: []string{"1s", "1m0s"}, Store: "redis"},
	}
	// The default namespace is the process's: other tests (and earlier
	// runs of this one, with -count) may have left keys in it.
	if len(got) > 0 && got[0].Name == "default" {
		got[0].Keys = 0
	}
	if !slices.EqualFunc(got, want, func(a, b namespace) bool {
		return a.Name == b.Name && a.Mode == b.Mode && a.SyncRate == b.SyncRate && a.Zone == b.Zone &&
			slices.Equal(a.WindowSizes, b.WindowSizes) && a.Keys == b.Keys && a.PendingDiffs == b.PendingDiffs && a.Store == b.Store
	}) {
		t.Fatalf("namespaces after the reload:\n%s\nwant %+v", body, want)
	}
}

// TestAdminAPIReadsAndResetsAKeyOfAnyBytes counts a key with separators,
// placeholder braces and a byte that is not UTF-8 (sent as a header), and
// reads and resets exactly that key through the admin endpoint.
func TestAdminAPIReadsAndResetsAKeyOfAnyBytes(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 2 1h
		}
		respond "ok"
	}`)
	clearOfWindowEnds(time.Hour)
	key := "a/b?c=d{x}\xff" + uniqueKey(t)
	near := "a/b?c=d{x}" + key[len("a/b?c=d{x}\xff"):] // the same but the byte
	if got := countAdmitted(t, tester, "/", key, 3); got != 2 {
		t.Fatalf("admitted %d of 3, want 2", got)
	}
	countAdmitted(t, tester, "/", near, 1)

	k := adminReadKey(t, http.MethodGet, adminKeyPath("default", key))
	if got, err := url.QueryUnescape(k.Key); err != nil || got != key || k.Namespace != "default" || k.Source != "node" {
		t.Fatalf("the answer names key %q (%v), namespace %q, source %q", got, err, k.Namespace, k.Source)
	}
	if k.current(t) != 3 || k.Windows[0].Size != "1h0m0s" || !k.Windows[0].Start.Equal(time.Now().Truncate(time.Hour)) {
		t.Fatalf("the key's window: %+v, want the current hour with 3 hits (the rejected one counts)", k.Windows)
	}
	if k := adminReadKey(t, http.MethodDelete, adminKeyPath("default", key)); k.current(t) != 0 {
		t.Fatalf("the answer to the reset: %+v, want zeros", k.Windows)
	}
	if got := adminReadKey(t, http.MethodGet, adminKeyPath("default", key)).current(t); got != 0 {
		t.Fatalf("the key counts %v after the reset", got)
	}
	if got := adminReadKey(t, http.MethodGet, adminKeyPath("default", near)).current(t); got != 1 {
		t.Fatalf("a key that differs in one byte counts %v after the reset, want 1", got)
	}
	if got := countAdmitted(t, tester, "/", key, 3); got != 2 {
		t.Fatalf("admitted %d of 3 after the reset, want 2", got)
	}
}

func TestAdminAPIErrors(t *testing.T) {
	load(t, `
	http://localhost:9080 {
		respond "ok"
	}`)
	// No handler and no global option: no rate_limit app runs.
	status, _, body := adminCall(t, http.MethodGet, "/rate_limit/namespaces")
	if want := `{"error":"the rate_limit app is not running"}` + "\n"; status != http.StatusNotFound || string(body) != want {
		t.Fatalf("with no rate_limit app: %d %s, want 404 %s", status, body, want)
	}
	load(t, `
	http://localhost:9080 {
		rate_limit {
			limit 10 1m
		}
		respond "ok"
	}`)
	for _, tc := range []struct {
		method, path string
		status       int
		want         string
	}{
		{"GET", "/rate_limit/namespaces/nope/keys?key=k", 404, `unknown namespace "nope" (namespaces: default)`},
		{"DELETE", "/rate_limit/namespaces/nope/keys?key=k", 404, `unknown namespace "nope" (namespaces: default)`},
		{"GET", "/rate_limit/namespaces/default/keys", 400, "key: missing: give the key as the query parameter key, URL-encoded"},
		{"DELETE", "/rate_limit/namespaces/default/keys?source=node", 400, "key: missing: give the key as the query parameter key, URL-encoded"},
		{"GET", "/rate_limit/namespaces/default/keys?key=k&source=store", 400, `source: namespace "default" is local only: it has no store`},
	} {
		status, ctype, body := adminCall(t, tc.method, tc.path)
		var e struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || status != tc.status || ctype != "application/json" || e.Error != tc.want {
			t.Errorf("%s %s: %d %s %s, want %d and the JSON error %q", tc.method, tc.path, status, ctype, body, tc.status, tc.want)
		}
	}
}

// TestAdminAPIResetAcrossTheFleet resets, through the admin endpoint, a
// key that another node's hits brought to its limit: the store's counts
// are zero at once (which is what the other nodes fetch at their next
// sync), and this node admits the key again.
func TestAdminAPIResetAcrossTheFleet(t *testing.T) {
	srv := redistest.Start(t)
	tester := loadWithOptions(t, fmt.Sprintf(`
		rate_limit {
			namespace fleet {
				sync_rate 100ms
				strategy redis {
					addresses %s
					key_prefix admintest
				}
			}
		}`, srv.Addr), `
	http://localhost:9080 {
		rate_limit {
			namespace fleet
			key {http.request.header.X-Key}
			limit 5 1h
			disable_penalty
		}
		respond "ok"
	}`)
	store, err := (&redis.Redis{Addresses: []string{srv.Addr}, KeyPrefix: "admintest"}).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	k := uniqueKey(t)
	stored := func() float64 {
		counts, err := store.GetCounters(ctx, "fleet", []string{k}, []time.Duration{time.Hour}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, c := range counts {
			sum += c.Value
		}
		return sum
	}
	clearOfWindowEnds(time.Hour)
	if got := countAdmitted(t, tester, "/", k, 1); got != 1 {
		t.Fatal("the first hit was rejected")
	}
	// Another node pushes its 4 hits: with this node's, the limit.
	err = store.PushDiffs(ctx, strategy.Batch{ID: "other-node-" + k, Namespace: "fleet", Diffs: []window.Diff{
		{Key: k, Size: time.Hour, Start: window.Start(time.Now().UnixNano(), time.Hour), Value: 4},
	}})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "this node to fetch the other node's hits", func() bool {
		return adminReadKey(t, http.MethodGet, adminKeyPath("fleet", k)).current(t) == 5
	})
	if resp, _ := get(t, tester, "/", k); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a hit over the fleet's limit: %d, want 429", resp.StatusCode)
	}
	if got := adminReadKey(t, http.MethodGet, adminKeyPath("fleet", k)+"&source=store").current(t); got != 5 {
		t.Fatalf("the store counts %v through the admin endpoint, want 5", got)
	}

	if got := adminReadKey(t, http.MethodDelete, adminKeyPath("fleet", k)).current(t); got != 0 {
		t.Fatalf("the answer to the reset counts %v", got)
	}
	if got := stored(); got != 0 {
		t.Fatalf("the store counts %v right after the reset, want 0", got)
	}
	if got := adminReadKey(t, http.MethodGet, adminKeyPath("fleet", k)+"&source=store").current(t); got != 0 {
		t.Fatalf("the store counts %v through the admin endpoint after the reset, want 0", got)
	}
	if got := countAdmitted(t, tester, "/", k, 6); got != 5 {
		t.Fatalf("admitted %d of 6 after the reset, want the whole limit of 5", got)
	}
	poll.Until(t, 5*time.Second, "the store to count the 5 hits after the reset", func() bool { return stored() == 5 })
}
