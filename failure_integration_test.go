package ratelimit

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/syncapp"
)

// TestDenyWhileTheStoreIsAway runs a namespace with on_store_failure deny
// on a Redis that the test kills: once the node finds the store gone,
// every request is refused with the handler's error_code, the RateLimit
// field of the policy spent and Retry-After 1; once Redis is back, the
// node admits again within a few probes, and counts as before.
func TestDenyWhileTheStoreIsAway(t *testing.T) {
	srv := redistest.Start(t)
	tester := loadWithOptions(t, fmt.Sprintf(`
		rate_limit {
			namespace guarded {
				sync_rate 0
				on_store_failure deny
				strategy redis {
					addresses %s
				}
			}
		}`, srv.Addr), `
	http://localhost:9080 {
		rate_limit {
			namespace guarded
			key {http.request.header.X-Key}
			limit 100 1h
			error_code 503
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	if resp, _ := get(t, tester, "/", key); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the store up: status %d, want 200", resp.StatusCode)
	}
	srv.Kill()
	var refused *http.Response
	poll.Until(t, 10*time.Second, "a request refused once the node finds the store gone", func() bool {
		resp, _ := get(t, tester, "/", key)
		if resp.StatusCode == http.StatusOK {
			return false
		}
		refused = resp
		return true
	})
	if refused.StatusCode != http.StatusServiceUnavailable || refused.Header.Get("Retry-After") != "1" {
		t.Fatalf("refused: status %d, Retry-After %q; want 503, 1", refused.StatusCode, refused.Header.Get("Retry-After"))
	}
	if got, want := refused.Header.Get("RateLimit"), `"guarded-Hour";r=0;t=1`; got != want {
		t.Errorf("refused: RateLimit %q, want %q", got, want)
	}
	for range 5 {
		if resp, _ := get(t, tester, "/", key); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("while the store is away: status %d, want 503", resp.StatusCode)
		}
	}
	srv.Restart()
	poll.Until(t, 10*time.Second, "the node to admit again once the store is back", func() bool {
		resp, _ := get(t, tester, "/", key)
		return resp.StatusCode == http.StatusOK
	})
}

// TestDenyOnAnIdleNamespace runs two namespaces on one Redis: share, which
// takes requests, and deny, which takes none until the store has been
// paused for a while (a namespace that took requests just before the
// failure is not idle: it learns from its own runs, within their timeout).
// The namespaces' names are the test's own: a name another test's config
// used may still hold that config's pooled state. The deny namespace knows of the failure without a
// request (its idle runs ask the store, and what one namespace learns of
// the store every other on it knows): its first requests after the
// failure are refused, each with Retry-After.
func TestDenyOnAnIdleNamespace(t *testing.T) {
	srv := redistest.Start(t)
	tester := loadWithOptions(t, fmt.Sprintf(`
		rate_limit {
			namespace idle_share_busy {
				sync_rate 100ms
				on_store_failure share
				strategy redis {
					addresses %[1]s
				}
			}
			namespace idle_deny {
				sync_rate 100ms
				on_store_failure deny
				strategy redis {
					addresses %[1]s
				}
			}
		}`, srv.Addr), `
	http://localhost:9080 {
		route /share {
			rate_limit {
				namespace idle_share_busy
				key {http.request.header.X-Key}
				limit 30 1m
			}
		}
		route /deny {
			rate_limit {
				namespace idle_deny
				key {http.request.header.X-Key}
				limit 30 1m
			}
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	for range 5 {
		if resp, _ := get(t, tester, "/share", key); resp.StatusCode != http.StatusOK {
			t.Fatalf("/share with the store up: status %d, want 200", resp.StatusCode)
		}
	}
	if err := syncNamespace("idle_share_busy"); err != nil {
		t.Fatalf("the store up: %v", err)
	}
	srv.Pause()
	defer srv.Resume()
	for range 5 {
		get(t, tester, "/share", key)
	}
	// The promise: the policy starts within a sync interval and the stall
	// bound (350 ms here) of the failure; the test gives it 2 s.
	time.Sleep(2 * time.Second)
	for i := range 30 {
		resp, _ := get(t, tester, "/deny", key)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("request %d of the idle deny namespace, 2 s into the store's pause: status %d, Retry-After %q; want 429 and one",
				i+1, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
}

// syncNamespace has the running app's namespace push its diffs now.
func syncNamespace(name string) error {
	app, err := caddy.ActiveContext().App("rate_limit")
	if err != nil {
		return err
	}
	ns, err := app.(*syncapp.App).Namespace(name)
	if err != nil {
		return err
	}
	return ns.Sync(context.Background())
}
