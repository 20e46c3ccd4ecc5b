package ratelimit

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestCost counts each request as its cost: a number, or a header's
// value, where what is not a number of 0 or more counts 1.
func TestCost(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /fixed {
			key fixed-{http.request.header.X-Key}
			limit 10 1h
			cost 4
		}
		rate_limit /half {
			key half-{http.request.header.X-Key}
			limit 10 1h
			cost 0.5
		}
		rate_limit /header {
			key header-{http.request.header.X-Key}
			limit 10 1h
			cost {http.request.header.X-Cost}
		}
		respond "ok"
	}`)
	clearOfWindowEnds(time.Hour)
	statuses := func(path, key string, n int, headers ...string) []int {
		var got []int
		for range n {
			resp, _ := send(t, tester, http.MethodGet, path, key, headers...)
			got = append(got, resp.StatusCode)
		}
		return got
	}
	key := uniqueKey(t)
	if got := statuses("/fixed", key, 3); got[0] != 200 || got[1] != 200 || got[2] != 429 {
		t.Errorf("cost 4, limit 10: statuses %v, want 200 200 429", got)
	}
	if got := statuses("/header", key, 3, "X-Cost", "4"); got[0] != 200 || got[1] != 200 || got[2] != 429 {
		t.Errorf("X-Cost 4, limit 10: statuses %v, want 200 200 429", got)
	}
	if got := statuses("/half", key, 21); got[19] != 200 || got[20] != 429 {
		t.Errorf("cost 0.5, limit 10: statuses %v, want 20 served, then 429", got)
	}

	key = uniqueKey(t)
	for _, bad := range []string{"abc", "-3", "", "Inf", "NaN"} {
		if resp, _ := send(t, tester, http.MethodGet, "/header", key, "X-Cost", bad); resp.StatusCode != 200 {
			t.Fatalf("X-Cost %q: status %d", bad, resp.StatusCode)
		}
	}
	send(t, tester, http.MethodGet, "/header", key, "X-Cost", "2.5")
	if got := count(t, "default", "header-"+key, time.Hour); got != 7.5 {
		t.Errorf("five invalid costs and one of 2.5 counted %v, want 7.5", got)
	}
	if resp, _ := send(t, tester, http.MethodGet, "/header", key, "X-Cost", "0"); resp.StatusCode != 200 {
		t.Errorf("cost 0 near the limit: status %d, want 200", resp.StatusCode)
	}
}

// TestCountStatus counts only the failed logins of a key: successful ones
// pass however many they are, three failures exhaust limit 3 1h, and the
// next request is rejected, whichever way the failure was answered (a
// response written with the status, or an error that handle_errors
// writes).
func TestCountStatus(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /login {
			key login-{http.request.header.X-Key}
			limit 3 1h
			count_status 401
			headers kong
		}
		rate_limit /error {
			key error-{http.request.header.X-Key}
			limit 3 1h
			count_status 401 403
		}
		route /error {
			error "denied" 403
		}
		respond "answer" {http.request.header.X-Status}
	}`)
	clearOfWindowEnds(time.Hour)
	key := uniqueKey(t)
	for i := range 10 {
		if resp, _ := send(t, tester, http.MethodPost, "/login", key, "X-Status", "200"); resp.StatusCode != 200 {
			t.Fatalf("successful login %d: status %d", i+1, resp.StatusCode)
		}
	}
	for i := range 3 {
		resp, _ := send(t, tester, http.MethodPost, "/login", key, "X-Status", "401")
		if resp.StatusCode != 401 {
			t.Fatalf("failed login %d: status %d, want 401", i+1, resp.StatusCode)
		}
		if got, want := resp.Header.Get("X-Ratelimit-Remaining-Hour"), []string{"2", "1", "0"}[i]; got != want {
			t.Errorf("failed login %d: remaining %q once it counts, want %s", i+1, got, want)
		}
	}
	resp, _ := send(t, tester, http.MethodPost, "/login", key, "X-Status", "200")
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("after 3 failed logins: status %d, Retry-After %q, want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := count(t, "default", "login-"+key, time.Hour); got != 3 {
		t.Errorf("counted %v, want the 3 failures (the rejection's 429 is not counted)", got)
	}

	key = uniqueKey(t)
	for i := range 3 {
		if resp, _ := send(t, tester, http.MethodGet, "/error", key); resp.StatusCode != 403 {
			t.Fatalf("request %d: status %d, want the error's 403", i+1, resp.StatusCode)
		}
	}
	if resp, _ := send(t, tester, http.MethodGet, "/error", key); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after 3 errors of 403: status %d, want 429", resp.StatusCode)
	}
}

// problemJSONRecipe is the README's handle_errors block that answers a
// rejection with draft-ietf-httpapi-ratelimit-headers-11's problem
// details.
const problemJSONRecipe = `
	handle_errors 429 {
		header Content-Type application/problem+json
		respond <<JSON
			{
				"type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
				"title": "Request cannot be satisfied as assigned quota has been exceeded",
				"detail": "More than {http.rate_limit.limit} requests per {http.rate_limit.window}: retry in {http.rate_limit.reset} seconds",
				"violated-policies": ["{http.rate_limit.policy}"]
			}
			JSON 429
	}`

// TestProblemJSON serves the README's problem+json recipe: a rejection
// is answered with the quota-exceeded problem, naming the policy that the
// RateLimit-Policy header names.
func TestProblemJSON(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			namespace default
			key {http.request.header.X-Key}
			limit 2 1m
			draft_headers
		}
		respond "ok"`+problemJSONRecipe+`
	}`)
	key := uniqueKey(t)
	send(t, tester, http.MethodGet, "/", key)
	send(t, tester, http.MethodGet, "/", key)
	resp, body := send(t, tester, http.MethodGet, "/", key)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	var problem struct {
		Type             string   `json:"type"`
		Title            string   `json:"title"`
		Detail           string   `json:"detail"`
		ViolatedPolicies []string `json:"violated-policies"`
	}
	if err := json.Unmarshal([]byte(body), &problem); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, body)
	}
	if problem.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" ||
		len(problem.ViolatedPolicies) != 1 || problem.ViolatedPolicies[0] != "default-Minute" ||
		!strings.HasPrefix(problem.Detail, "More than 2 requests per Minute: retry in ") {
		t.Errorf("problem %+v", problem)
	}
	if policy := resp.Header.Get("RateLimit-Policy"); !strings.HasPrefix(policy, `"default-Minute";`) {
		t.Errorf("RateLimit-Policy %q does not name the violated policy", policy)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
}

// TestBan trips limit 3 1s on a route with ban 5s and on one without: two
// seconds later the banned key is still rejected, with Retry-After and
// RateLimit-Reset giving the ban's remaining time, while the other passes;
// the admin API lists the bans, a reset through it lifts a ban, and a ban
// ends by itself.
func TestBan(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /ban {
			key ban-{http.request.header.X-Key}
			limit 3 1s
			ban 5s
			headers draft kong
		}
		rate_limit /noban {
			key noban-{http.request.header.X-Key}
			limit 3 1s
		}
		respond "ok"
	}`)
	const banned = `caddy_rate_limit_requests_total{namespace="default",outcome="banned"}`
	bannedBefore := metricValue(t, banned)
	trip := func(path, key string) time.Time {
		t.Helper()
		retryAfter := tripLimit3(t, path, func() (int, string) {
			resp, _ := send(t, tester, http.MethodGet, path, key)
			return resp.StatusCode, resp.Header.Get("Retry-After")
		})
		if path == "/ban" && retryAfter != "5" {
			t.Errorf("the rejection that bans: Retry-After %q, want the ban's 5", retryAfter)
		}
		return time.Now()
	}
	key, lifted := uniqueKey(t), uniqueKey(t)
	tripped := trip("/ban", key)
	trip("/ban", lifted)
	trip("/noban", key)

	time.Sleep(time.Until(tripped.Add(2 * time.Second))) // not an event: the ban runs on the server's wall clock, read here 2 s in
	if resp, _ := send(t, tester, http.MethodGet, "/noban", key); resp.StatusCode != 200 {
		t.Fatalf("without a ban, 2s later: status %d, want 200", resp.StatusCode)
	}
	resp, _ := send(t, tester, http.MethodGet, "/ban", key)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("banned, 2s later: status %d, want 429", resp.StatusCode)
	}
	for _, h := range []string{"Retry-After", "RateLimit-Reset"} {
		if got := resp.Header.Get(h); got != "3" {
			t.Errorf("banned, 2s later: %s %q, want the ban's 3 seconds left", h, got)
		}
	}
	if got := resp.Header.Get("RateLimit-Remaining"); got != "0" {
		t.Errorf("banned: RateLimit-Remaining %q, want 0", got)
	}
	if got := metricValue(t, banned) - bannedBefore; got != 1 {
		t.Errorf("outcome banned: +%v, want +1", got)
	}

	if code, _, body := adminCall(t, http.MethodGet, "/rate_limit/namespaces/default/bans"); code != 200 ||
		!strings.Contains(string(body), `"key":"`+url.QueryEscape("ban-"+key)+`"`) ||
		!strings.Contains(string(body), `"key":"`+url.QueryEscape("ban-"+lifted)+`"`) {
		t.Errorf("admin list of bans: %d %s, want both banned keys", code, body)
	}
	if code, _, body := adminCall(t, http.MethodDelete, adminKeyPath("default", "ban-"+lifted)); code != 200 {
		t.Fatalf("admin reset: %d %s", code, body)
	}
	if resp, _ := send(t, tester, http.MethodGet, "/ban", lifted); resp.StatusCode != 200 {
		t.Errorf("after a reset through the admin API: status %d, want 200", resp.StatusCode)
	}

	time.Sleep(time.Until(tripped.Add(5200 * time.Millisecond))) // not an event: the wall clock must pass the ban's end
	if resp, _ := send(t, tester, http.MethodGet, "/ban", key); resp.StatusCode != 200 {
		t.Errorf("after the ban: status %d, want 200", resp.StatusCode)
	}
}
