package ratelimit

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy/redis"
	"github.com/ratesync/caddy-ratelimit/window"
)

// A budget charged from the response: each admitted request is charged
// what its response's X-Units said, the requests are admitted while the
// budget has room for one unit, and the count is the sum of what the
// admitted responses reported; a value that is no number charges cost.
func TestResponseCost(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		header X-Units {http.request.header.X-Want}
		rate_limit /status* {
			key status-{http.request.header.X-Key}
			limit 100 1h
			response_cost {http.response.header.X-Units}
			count_status 200
		}
		rate_limit {
			key {http.request.header.X-Key}
			limit 100 1h
			response_cost {http.response.header.X-Units}
			window_type fixed
		}
		respond /status-missing 404
		respond "ok"
	}`)
	key := uniqueKey(t)
	sum, admitted := 0.0, 0
	for i := 0; ; i++ {
		if i > 200 {
			t.Fatalf("no rejection after %d requests, %v units", i, sum)
		}
		units := 1 + rand.IntN(50)
		before := count(t, "default", key, time.Hour)
		resp, _ := send(t, tester, http.MethodGet, "/", key, "X-Want", strconv.Itoa(units))
		if resp.StatusCode == http.StatusTooManyRequests {
			if before+1 <= 100 {
				t.Fatalf("rejected with %v of 100 units used: room for one was left", before)
			}
			break
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if before+1 > 100 {
			t.Fatalf("admitted with %v of 100 units used", before)
		}
		sum += float64(units)
		admitted++
	}
	// The rejection itself counted its cost, 1, as any rejected request.
	if got := count(t, "default", key, time.Hour); got != sum+1 {
		t.Errorf("the count is %v after %d admitted requests reporting %v units and a rejection, want %v", got, admitted, sum, sum+1)
	}
	if sum > 99+50 {
		t.Errorf("%v units charged: past the bound of the last room (99) plus one response (50)", sum)
	}

	other := uniqueKey(t)
	send(t, tester, http.MethodGet, "/", other, "X-Want", "lots")
	send(t, tester, http.MethodGet, "/", other, "X-Want", "2.5")
	if got := count(t, "default", other, time.Hour); got != 3.5 {
		t.Errorf("a response saying lots, then 2.5: count %v, want cost 1 then 2.5", got)
	}

	// With count_status 200, a 404 is not charged.
	third := uniqueKey(t)
	send(t, tester, http.MethodGet, "/status-ok", third, "X-Want", "7")
	send(t, tester, http.MethodGet, "/status-missing", third, "X-Want", "7")
	if got := count(t, "default", "status-"+third, time.Hour); got != 7 {
		t.Errorf("with count_status 200, a 200 and a 404 of 7 units each: count %v, want 7", got)
	}
}

// Three nodes at sync_rate 0, each request to the next: the store's count
// is exactly the sum of what the admitted responses reported, no request
// is admitted without room for one unit, and once the budget is spent the
// fleet rejects.
func TestResponseCostAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	nodes := startFleet(t, 3, srv.Addr, "0",
		map[string]any{"handler": "headers", "response": map[string]any{"set": map[string]any{"X-Units": []string{"{http.request.header.X-Want}"}}}},
		map[string]any{
			"handler":       "rate_limit",
			"namespace":     "api",
			"key":           "{http.request.header.X-Key}",
			"limits":        []any{map[string]any{"limit": 1000, "window": "1h"}},
			"window_type":   "fixed",
			"response_cost": "{http.response.header.X-Units}",
		},
		map[string]any{"handler": "static_response", "body": "ok"})
	store, err := (&redis.Redis{Addresses: []string{srv.Addr}}).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	stored := func() float64 {
		counts, err := store.GetCounters(t.Context(), "api", []string{"budget"}, []time.Duration{time.Hour}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, c := range counts {
			if c.Start == window.Start(time.Now().UnixNano(), time.Hour) {
				sum += c.Value
			}
		}
		return sum
	}
	sum, admitted := 0.0, 0
	for i := 0; ; i++ {
		if i > 500 {
			t.Fatalf("no rejection after %d requests, %v units", i, sum)
		}
		units := 1 + rand.IntN(50)
		before := stored()
		req, _ := http.NewRequest(http.MethodGet, nodes[i%3].URL("/api"), nil)
		req.Header.Set("X-Key", "budget")
		req.Header.Set("X-Want", strconv.Itoa(units))
		resp, err := nodeClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			if before+1 <= 1000 {
				t.Fatalf("node %d rejected with %v of 1000 units used", i%3+1, before)
			}
			break
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("node %d: status %d", i%3+1, resp.StatusCode)
		}
		if before+1 > 1000 {
			t.Fatalf("node %d admitted with %v of 1000 units used", i%3+1, before)
		}
		sum += float64(units)
		admitted++
	}
	if got := stored(); got != sum+1 {
		t.Errorf("the store counts %v after %d admitted requests reporting %v units and a rejection of cost 1, want %v", got, admitted, sum, sum+1)
	}
}
