package ratelimit

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// slowUpstreamFunc serves every request with serve, on loopback, and
// returns its address.
func slowUpstreamFunc(t *testing.T, serve http.HandlerFunc) string {
	srv := httptest.NewUnstartedServer(serve)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

// simultaneous sends n requests of key to path at once and returns the
// responses' statuses and Retry-After values.
func simultaneous(t *testing.T, tester *caddytest.Tester, path, key string, n int) (statuses map[int]int, retryAfter []string) {
	t.Helper()
	statuses = make(map[int]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, _ := get(t, tester, path, key)
			mu.Lock()
			defer mu.Unlock()
			statuses[resp.StatusCode]++
			if resp.StatusCode != http.StatusOK {
				retryAfter = append(retryAfter, resp.Header.Get("Retry-After"))
			}
		})
	}
	wg.Wait()
	return statuses, retryAfter
}

// TestMaxConcurrent puts max_concurrent 2 in front of a slow upstream, in
// a local namespace and in namespaces on Redis and PostgreSQL: of 6
// simultaneous requests of one key exactly 2 are served, the others are
// rejected with Retry-After: 1, and another key is served meanwhile.
func TestMaxConcurrent(t *testing.T) {
	var inFlight atomic.Int64 // requests the upstream is serving
	upstream := slowUpstreamFunc(t, func(w http.ResponseWriter, r *http.Request) {
		inFlight.Add(1)
		defer inFlight.Add(-1)
		time.Sleep(700 * time.Millisecond) // not a wait: a slow upstream, whose requests hold their slots that long
		fmt.Fprint(w, "slow ok")
	})
	rdb := redistest.Start(t)
	pg := pgtest.Start(t)
	tester := loadWithOptions(t, fmt.Sprintf(`
		rate_limit {
			namespace onredis {
				sync_rate 100ms
				strategy redis {
					addresses %s
				}
			}
			namespace onpostgres {
				sync_rate 100ms
				strategy postgres {
					dsn %s
				}
			}
		}`, rdb.Addr, pg.CreateDB(t, "rl")), fmt.Sprintf(`
	http://localhost:9080 {
		rate_limit /local {
			key {http.request.header.X-Key}
			limit 1000 1m
			max_concurrent 2
			draft_headers
		}
		rate_limit /redis {
			namespace onredis
			key {http.request.header.X-Key}
			limit 1000 1m
			max_concurrent 2
		}
		rate_limit /postgres {
			namespace onpostgres
			key {http.request.header.X-Key}
			limit 1000 1m
			max_concurrent 2
		}
		reverse_proxy %s
	}`, upstream))
	for _, path := range []string{"/local", "/redis", "/postgres"} {
		t.Run(path[1:], func(t *testing.T) {
			key := uniqueKey(t)
			get(t, tester, path, "warm-up-"+key) // connect to the store first
			var other *http.Response
			done := make(chan struct{})
			go func() {
				defer close(done)
				// While key's requests run: both of its slots are taken.
				if !poll.For(10*time.Second, func() bool { return inFlight.Load() >= 2 }) {
					t.Error("the upstream never served two of key's requests at once")
				}
				other, _ = get(t, tester, path, "other-"+key)
			}()
			statuses, retryAfter := simultaneous(t, tester, path, key, 6)
			<-done
			if statuses[http.StatusOK] != 2 || statuses[http.StatusTooManyRequests] != 4 {
				t.Fatalf("statuses %v, want exactly 2 served and 4 rejected", statuses)
			}
			for _, ra := range retryAfter {
				if ra != "1" {
					t.Errorf("Retry-After %q, want 1", ra)
				}
			}
			if other.StatusCode != http.StatusOK {
				t.Errorf("another key got %d while the first had 2 in flight", other.StatusCode)
			}
			// Places come back as requests end (in a store, released off
			// the requests' path, so allow a moment).
			poll.Until(t, 10*time.Second, "both requests served once the first ended", func() bool {
				statuses, _ := simultaneous(t, tester, path, key, 2)
				return statuses[http.StatusOK] == 2
			})
		})
	}
	resp, _ := get(t, tester, "/local", uniqueKey(t))
	if got, want := resp.Header.Get("RateLimit-Policy"), `"default-Minute";q=1000;w=60, "default-concurrency";q=2;qu="concurrent-requests"`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
}
