package ratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/dunglas/httpsfv"
)

// The tests of this file check that what responses say is what the
// limiter then does (issue 22's findings), parsing the draft's fields with
// httpsfv, an RFC 9651 parser independent of the code that writes them.

// rateLimitField is a response's RateLimit field: the policy it names, and
// its r and t.
type rateLimitField struct {
	name string
	r, t int64
}

// parseRateLimit parses the RateLimit field of resp, which must hold one
// item with Integer r and t.
func parseRateLimit(t *testing.T, resp *http.Response) rateLimitField {
	t.Helper()
	list, err := httpsfv.UnmarshalList(resp.Header.Values("RateLimit"))
	if err != nil || len(list) != 1 {
		t.Fatalf("RateLimit %q: %v, want one item", resp.Header.Values("RateLimit"), err)
	}
	item, ok := list[0].(httpsfv.Item)
	if !ok {
		t.Fatalf("RateLimit %q: an inner list", resp.Header.Values("RateLimit"))
	}
	var f rateLimitField
	if f.name, ok = item.Value.(string); !ok {
		t.Fatalf("RateLimit %q: the policy is a %T, want a String", resp.Header.Values("RateLimit"), item.Value)
	}
	for _, p := range []struct {
		key string
		v   *int64
	}{{"r", &f.r}, {"t", &f.t}} {
		v, ok := item.Params.Get(p.key)
		if *p.v, ok = v.(int64); !ok {
			t.Fatalf("RateLimit %q: %s is %T, want an Integer", resp.Header.Values("RateLimit"), p.key, v)
		}
	}
	return f
}

// retryAfter returns the Retry-After of a rejection, in seconds.
func retryAfter(t *testing.T, resp *http.Response) int {
	t.Helper()
	n, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || n < 1 {
		t.Fatalf("status %d: Retry-After %q, want whole seconds, at least 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	return n
}

// obey plays a client that waits exactly what each rejection's Retry-After
// says, then retries, until it is admitted. It returns how many of its
// retries were rejected (each of them a broken promise).
func obey(t *testing.T, tester *caddytest.Tester, path, key string, resp *http.Response, maxTries int) (brokenPromises int) {
	t.Helper()
	for range maxTries {
		if resp.StatusCode == http.StatusOK {
			return brokenPromises
		}
		wait := time.Duration(retryAfter(t, resp)) * time.Second
		t.Logf("%s: %d, Retry-After %v; waiting it", path, resp.StatusCode, wait)
		time.Sleep(wait) // not a wait for an event: the client obeys Retry-After, which the test checks
		resp, _ = get(t, tester, path, key)
		if resp.StatusCode != http.StatusOK {
			brokenPromises++
		}
	}
	t.Fatalf("%s: still rejected after %d retries", path, maxTries)
	return brokenPromises
}

// TestObeyingRetryAfterEndsABan plays a client that obeys Retry-After
// against a rate whose wait outlasts the ban that its rejection starts
// (issue 22, finding 1), limit 2 4s with ban 2s: once at the rejection
// that starts the ban, once from a request during the ban. Either way, its
// first retry is admitted: Retry-After during a ban is when the ban has
// ended and the rate admits the request, so obeying it never starts a new
// ban. TestObeyingRetryAfterEndsABanExact plays the issue's own config.
func TestObeyingRetryAfterEndsABan(t *testing.T) {
	obeyThroughBan(t, "limit 2 4s", "ban 2s", false, true)
}

// TestObeyingRetryAfterEndsABanExact is the case, limit 2 1m with
// ban 30s, over real time: the 3 hits of the minute take 40s to 100s to
// fade to 1, so the test takes as long.
func TestObeyingRetryAfterEndsABanExact(t *testing.T) {
	obeyThroughBan(t, "limit 2 1m", "ban 30s", true)
}

// obeyThroughBan trips a limit with a ban, then obeys Retry-After, first
// from the request that starts the ban unless only during, and from one
// during the ban.
func obeyThroughBan(t *testing.T, limit, ban string, during ...bool) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			`+limit+`
			`+ban+`
		}
		respond "ok"
	}`)
	for _, during := range during {
		key := uniqueKey(t)
		countAdmitted(t, tester, "/", key, 2)
		resp, _ := get(t, tester, "/", key)
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("3rd request: %d, want 429", resp.StatusCode)
		}
		if during {
			resp, _ = get(t, tester, "/", key)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("during the ban: %d, want 429", resp.StatusCode)
			}
			if f := parseRateLimit(t, resp); int64(retryAfter(t, resp)) < f.t {
				t.Errorf("during the ban: Retry-After %d is earlier than t=%d", retryAfter(t, resp), f.t)
			}
		}
		if broken := obey(t, tester, "/", key, resp, 5); broken != 0 {
			t.Errorf("%s, %s, obeying from a request during the ban %v: %d retries at Retry-After were rejected, want none", limit, ban, during, broken)
		}
	}
}

// TestConcurrencyRejectionNamesItsPolicy holds one request of a key in
// flight under max_concurrent 1, then sends another (issue 22, finding 2):
// its RateLimit field names the concurrency policy that rejected it, and
// its Retry-After is not earlier than that policy's t.
func TestConcurrencyRejectionNamesItsPolicy(t *testing.T) {
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	upstream := slowUpstreamFunc(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			arrived <- struct{}{}
			<-release
		}
		w.Write([]byte("ok"))
	})
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 1000 1m
			max_concurrent 1
		}
		reverse_proxy `+upstream+`
	}`)
	key := uniqueKey(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequest(http.MethodGet, "http://localhost:9080/", nil)
		req.Header.Set("X-Key", key)
		req.Header.Set("X-Hold", "1")
		if resp, err := tester.Client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the held request never reached the upstream")
	}
	resp, _ := get(t, tester, "/", key)
	close(release)
	<-done
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a second request while one is held: %d, want 429", resp.StatusCode)
	}
	f := parseRateLimit(t, resp)
	if f.name != "default-concurrency" || f.r != 0 {
		t.Errorf("RateLimit %q, want the concurrency policy with r=0", resp.Header.Get("RateLimit"))
	}
	if ra := retryAfter(t, resp); int64(ra) < f.t {
		t.Errorf("Retry-After %d is earlier than t=%d", ra, f.t)
	}
}

// TestCostBelowOne rejects a request of cost 0.5 (issue 22, finding 3):
// the t of the policy that rejected it is the time until a request of
// that cost is admitted, as its Retry-After is, and in Kong's headers
// RateLimit-Reset says the same.
func TestCostBelowOne(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 2 1m
			cost 0.5
			headers draft kong
		}
		respond "ok"
	}`)
	clearOfWindowEnds(time.Minute)
	key := uniqueKey(t)
	if n := countAdmitted(t, tester, "/", key, 5); n != 4 {
		t.Fatalf("admitted %d of 5 requests of cost 0.5, want 4", n)
	}
	resp, _ := get(t, tester, "/", key)
	f := parseRateLimit(t, resp)
	if ra := retryAfter(t, resp); int64(ra) != f.t || resp.Header.Get("RateLimit-Reset") != strconv.Itoa(ra) {
		t.Errorf("Retry-After %d, t=%d, RateLimit-Reset %q: want one time, for a request of cost 0.5", ra, f.t, resp.Header.Get("RateLimit-Reset"))
	}
}

// TestWindowsNotWholeSeconds lists windows of 500ms and 1500ms in
// RateLimit-Policy without w, as the draft allows, and sends RateLimit
// when such a window is shown, even on the 429 it caused (issue 22,
// finding 4).
func TestWindowsNotWholeSeconds(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 1 1500ms
			limit 1000 500ms
			limit 1000 1h
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	resp, _ := get(t, tester, "/", key)
	if got, want := resp.Header.Get("RateLimit-Policy"), `"default-0.5";q=1000, "default-1.5";q=1, "default-Hour";q=1000;w=3600`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if f := parseRateLimit(t, resp); f.name != "default-1.5" || f.r != 0 {
		t.Errorf("RateLimit %q, want the 1.5s policy with none left", resp.Header.Get("RateLimit"))
	}
	resp, _ = get(t, tester, "/", key)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("2nd request: %d, want 429", resp.StatusCode)
	}
	if f := parseRateLimit(t, resp); f.name != "default-1.5" || f.r != 0 || int64(retryAfter(t, resp)) < f.t {
		t.Errorf("429: RateLimit %q, Retry-After %q: want the 1.5s policy, none left, Retry-After >= t", resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"))
	}
}

// TestPolicyNames declares a namespace café (issue 22, finding 5): its
// policies' names are valid SF Strings that keep the é (percent-encoded),
// and {http.rate_limit.policy} gives the name the RateLimit field gives,
// as the README's problem+json recipe uses it.
func TestPolicyNames(t *testing.T) {
	tester := loadWithOptions(t, `
		rate_limit {
			namespace café {
				zone default
			}
		}`, `
	http://localhost:9080 {
		rate_limit {
			namespace café
			key {http.request.header.X-Key}
			limit 1 1m
		}
		respond "ok"`+problemJSONRecipe+`
	}`)
	key := uniqueKey(t)
	get(t, tester, "/", key)
	resp, body := get(t, tester, "/", key)
	list, err := httpsfv.UnmarshalList(resp.Header.Values("RateLimit-Policy"))
	if err != nil || len(list) != 1 || list[0].(httpsfv.Item).Value != "caf%c3%a9-Minute" {
		t.Errorf("RateLimit-Policy %q (%v): want the one policy caf%%c3%%a9-Minute", resp.Header.Get("RateLimit-Policy"), err)
	}
	f := parseRateLimit(t, resp)
	if f.name != "caf%c3%a9-Minute" {
		t.Errorf("RateLimit %q: want the policy caf%%c3%%a9-Minute", resp.Header.Get("RateLimit"))
	}
	if want := `"violated-policies": ["` + f.name + `"]`; !strings.Contains(body, want) {
		t.Errorf("problem+json body %s: want %s", body, want)
	}
	for _, tc := range []struct{ ns, want string }{
		{"api", `"api-Minute"`},
		{`a"b\c%d`, `"a%22b%5cc%25d-Minute"`},
		{"tab\there", `"tab%09here-Minute"`},
	} {
		if got := sfString(policyName(tc.ns, "Minute")); got != tc.want {
			t.Errorf("namespace %q: policy %s, want %s", tc.ns, got, tc.want)
		}
	}
}

// TestFractionalLimitsAreIntegers shows limit 2.5 in Kong's headers
// (issue 22, finding 6): rounded down, as Integers, with what remains
// rounded down too, so that Remaining never exceeds Limit.
func TestFractionalLimitsAreIntegers(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 2.5 1h
			headers kong
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	for i, want := range []string{"1", "0", "0"} {
		resp, _ := get(t, tester, "/", key)
		for name, v := range map[string]string{"RateLimit-Limit": "2", "X-RateLimit-Limit-Hour": "2", "RateLimit-Remaining": want, "X-RateLimit-Remaining-Hour": want} {
			if got := resp.Header.Get(name); got != v {
				t.Errorf("request %d: %s %q, want %q", i+1, name, got, v)
			}
		}
	}
}

// TestCountStatusHeadersAreConsistent compares the first failed login
// under count_status with the first request of a route without it (issue
// 22, finding 7): the login counts, so both show one request counted, in
// Kong's Remaining and Reset and in the draft's r and t alike.
func TestCountStatusHeadersAreConsistent(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /login {
			key login-{http.request.header.X-Key}
			limit 3 1h
			count_status 401
			headers draft kong
		}
		rate_limit /plain {
			key plain-{http.request.header.X-Key}
			limit 3 1h
			headers draft kong
		}
		respond "answer" 401
	}`)
	clearOfWindowEnds(time.Hour)
	key := uniqueKey(t)
	login, _ := get(t, tester, "/login", key)
	plain, _ := get(t, tester, "/plain", key)
	if login.StatusCode != 401 {
		t.Fatalf("failed login: %d", login.StatusCode)
	}
	for _, name := range []string{"RateLimit-Remaining", "RateLimit-Reset"} {
		if l, p := login.Header.Get(name), plain.Header.Get(name); l != p {
			t.Errorf("%s: %q on the failed login, %q on the plain route's first request", name, l, p)
		}
	}
	lf, pf := parseRateLimit(t, login), parseRateLimit(t, plain)
	if lf.r != 2 || lf.r != pf.r || lf.t != pf.t {
		t.Errorf("RateLimit %q on the failed login, %q on the plain route: want r=2 and the same t", login.Header.Get("RateLimit"), plain.Header.Get("RateLimit"))
	}
}
