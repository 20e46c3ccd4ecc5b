package ratelimit

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
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
