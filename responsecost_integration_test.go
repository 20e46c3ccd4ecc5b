package ratelimit

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/postgres"
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

// A budget of 1,000 units a minute on three nodes at sync_rate 0, each
// request to the next, on Redis and on PostgreSQL: the store's count is
// exactly the sum of what the admitted responses reported (plus the
// rejections' cost), no request is admitted without room for one unit,
// the count passes the budget by less than one response's most (50, the
// bound for one request in flight), and once it is spent every node
// rejects until the minute ends, when Retry-After says.
func TestResponseCostAcrossNodes(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"redis", "postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			var cfg map[string]any
			var open func() (strategy.Store, error)
			if store == "redis" {
				srv := redistest.Start(t)
				cfg = map[string]any{"module": "redis", "addresses": []string{srv.Addr}}
				open = func() (strategy.Store, error) { return (&redis.Redis{Addresses: []string{srv.Addr}}).Open() }
			} else {
				dsn := pgtest.Start(t).CreateDB(t, "rl")
				cfg = map[string]any{"module": "postgres", "dsn": dsn}
				open = func() (strategy.Store, error) { return (&postgres.Postgres{DSN: dsn}).Open() }
			}
			spendAcrossNodes(t, cfg, open)
		})
	}
}

func spendAcrossNodes(t *testing.T, cfg map[string]any, open func() (strategy.Store, error)) {
	const budget, most = 1000, 50
	nodes := startFleetOn(t, 3, cfg, "0",
		map[string]any{"handler": "headers", "response": map[string]any{"set": map[string]any{"X-Units": []string{"{http.request.header.X-Want}"}}}},
		map[string]any{
			"handler":       "rate_limit",
			"namespace":     "api",
			"key":           "{http.request.header.X-Key}",
			"limits":        []any{map[string]any{"limit": budget, "window": "1m"}},
			"window_type":   "fixed",
			"response_cost": "{http.response.header.X-Units}",
		},
		map[string]any{"handler": "static_response", "body": "ok"})
	store, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	// The spending must fit in one minute: start it early in one.
	if left := time.Minute - time.Duration(time.Now().UnixNano()%int64(time.Minute)); left < 20*time.Second {
		time.Sleep(left) // not an event: the wall clock must reach a minute's start
	}
	minute := window.Start(time.Now().UnixNano(), time.Minute)
	stored := func() float64 {
		counts, err := store.GetCounters(t.Context(), "api", []string{"budget"}, []time.Duration{time.Minute}, time.Unix(0, minute))
		if err != nil {
			t.Fatal(err)
		}
		sum := 0.0
		for _, c := range counts {
			if c.Start == minute {
				sum += c.Value
			}
		}
		return sum
	}
	get := func(i, units int) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, nodes[i%3].URL("/api"), nil)
		req.Header.Set("X-Key", "budget")
		req.Header.Set("X-Want", strconv.Itoa(units))
		resp, err := nodeClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	sum, admitted, rejected := 0.0, 0, 0
	for i := 0; ; i++ {
		if i > 500 {
			t.Fatalf("no rejection after %d requests, %v units", i, sum)
		}
		units := 1 + rand.IntN(most)
		before := stored()
		resp := get(i, units)
		if resp.StatusCode == http.StatusTooManyRequests {
			if before+1 <= budget {
				t.Fatalf("node %d rejected with %v of %d units used", i%3+1, before, budget)
			}
			rejected++
			break
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("node %d: status %d", i%3+1, resp.StatusCode)
		}
		if before+1 > budget {
			t.Fatalf("node %d admitted with %v of %d units used", i%3+1, before, budget)
		}
		sum += float64(units)
		admitted++
	}
	if sum >= budget+most {
		t.Errorf("the admitted responses reported %v units, past the bound of %d", sum, budget+most-1)
	}
	// Spent: every node rejects, however little a request would cost.
	var retryAfter string
	for i := range 6 {
		resp := get(i, 1)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("node %d: status %d once the budget is spent, want 429", i%3+1, resp.StatusCode)
		}
		rejected++
		retryAfter = resp.Header.Get("Retry-After")
	}
	if got := stored(); got != sum+float64(rejected) {
		t.Errorf("the store counts %v after %d admitted requests reporting %v units and %d rejections of cost 1, want %v", got, admitted, sum, rejected, sum+float64(rejected))
	}
	// The minute ends when Retry-After says: a client that waits is served.
	secs, err := strconv.Atoi(retryAfter)
	if err != nil || secs < 1 || secs > 60 {
		t.Fatalf("Retry-After %q, want the seconds left of the minute", retryAfter)
	}
	if end := time.Unix(0, minute+int64(time.Minute)); time.Until(end) > time.Duration(secs)*time.Second {
		t.Errorf("Retry-After %d s, before the minute's end in %v", secs, time.Until(end))
	}
	time.Sleep(time.Duration(secs) * time.Second) // not an event: a client obeying Retry-After
	if resp := get(0, 1); resp.StatusCode != http.StatusOK {
		t.Errorf("status %d after waiting the Retry-After of %d s, want 200", resp.StatusCode, secs)
	}
}
