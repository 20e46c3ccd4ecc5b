package ratelimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
)

// TestMaxWaitingBoundsWaiters sends 10,000 requests of one exhausted key
// at once to a handler with max_waiting 100 and a max_delay longer than
// the test: 100 wait, the other 9,900 are rejected at once (and counted,
// as the penalty says), no more goroutines stay than the waiters' own,
// and waiters whose clients go away end with 499, uncounted.
func TestMaxWaitingBoundsWaiters(t *testing.T) {
	load(t, `
	http://localhost:9080 {
		rate_limit {
			limit 1 1h
		}
		respond "ok"
	}`)
	const requests, maxWaiting = 10_000, 100
	h := &Handler{
		Key:        "{http.request.header.X-Key}",
		Limits:     []Limit{{Limit: 1, Window: caddy.Duration(time.Hour)}},
		MaxDelay:   caddy.Duration(2 * time.Hour),
		MaxWaiting: maxWaiting,
	}
	if err := h.Provision(caddy.ActiveContext()); err != nil {
		t.Fatal(err)
	}
	clearOfWindowEnds(time.Hour)
	key := uniqueKey(t)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return nil
	})
	clientCtx, goAway := context.WithCancel(context.Background())
	defer goAway()
	serve := func() int {
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil).WithContext(clientCtx)
		req.Header.Set("X-Key", key)
		w := httptest.NewRecorder()
		r := caddyhttp.PrepareRequest(req, caddy.NewReplacer(), w, nil)
		var herr caddyhttp.HandlerError
		if err := h.ServeHTTP(w, r, next); errors.As(err, &herr) {
			return herr.StatusCode
		} else if err != nil {
			t.Errorf("ServeHTTP: %v", err)
		}
		return w.Code
	}
	if got := serve(); got != http.StatusOK {
		t.Fatalf("first request: status %d, want 200", got)
	}

	runtime.GC()
	before := runtime.NumGoroutine()
	var mu sync.Mutex
	statuses := make(map[int]int)
	var wg sync.WaitGroup
	for range requests {
		wg.Go(func() {
			code := serve()
			mu.Lock()
			statuses[code]++
			mu.Unlock()
		})
	}
	poll.Until(t, 30*time.Second, "every request to wait or be rejected", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return statuses[http.StatusTooManyRequests] == requests-maxWaiting && h.waiting.Load() == maxWaiting
	})
	runtime.GC()
	if n := runtime.NumGoroutine() - before; n > maxWaiting+10 {
		t.Errorf("%d goroutines more than before, with %d requests waiting", n, maxWaiting)
	}
	mu.Lock()
	if len(statuses) != 1 {
		t.Errorf("while waiting: statuses %v, want only %d rejections", statuses, requests-maxWaiting)
	}
	mu.Unlock()
	// The first request and the 9,900 rejected at once.
	if got := count(t, h.Namespace, key, time.Hour); got != 1+requests-maxWaiting {
		t.Errorf("counted %v hits, want %d", got, 1+requests-maxWaiting)
	}

	goAway()
	wg.Wait()
	if statuses[statusClientClosedRequest] != maxWaiting {
		t.Errorf("statuses %v, want %d that ended with 499", statuses, maxWaiting)
	}
	if n := h.waiting.Load(); n != 0 {
		t.Errorf("%d requests still waiting", n)
	}
	if got := count(t, h.Namespace, key, time.Hour); got != 1+requests-maxWaiting {
		t.Errorf("counted %v hits after the waiters went away, want %d", got, 1+requests-maxWaiting)
	}
}
