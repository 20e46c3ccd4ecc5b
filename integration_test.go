package ratelimit

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy/redis"
	"github.com/ratesync/caddy-ratelimit/syncapp"
)

// The tests share one in-process Caddy (caddytest's), so they do not run
// in parallel, and each counts under keys of its own.

const preamble = `{
	skip_install_trust
	admin localhost:2999
	http_port 9080
	https_port 9443
	grace_period 1ns
	default_bind 127.0.0.1
}
`

// uniqueKey returns a client key no other test (or earlier run against the
// same process) uses.
func uniqueKey(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
}

// get requests path with the X-Key header set to key.
func get(t *testing.T, tester *caddytest.Tester, path, key string) (*http.Response, string) {
	t.Helper()
	return send(t, tester, http.MethodGet, path, key)
}

// send requests path with the X-Key header set to key and the other
// headers given as name, value pairs, and returns the response and its
// body.
func send(t *testing.T, tester *caddytest.Tester, method, path, key string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://localhost:9080"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Key", key)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := tester.Client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// countAdmitted sends n requests and counts the 200s.
func countAdmitted(t *testing.T, tester *caddytest.Tester, path, key string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		resp, _ := get(t, tester, path, key)
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("unexpected status %d", resp.StatusCode)
		}
	}
	return ok
}

// load runs a Caddyfile of sites, after the test preamble.
func load(t *testing.T, sites string) *caddytest.Tester {
	t.Helper()
	return loadWithOptions(t, "", sites)
}

// loadWithOptions runs a Caddyfile whose global options are the test
// preamble's plus options.
func loadWithOptions(t *testing.T, options, sites string) *caddytest.Tester {
	t.Helper()
	return initServer(t, withOptions(options)+sites, "caddyfile")
}

// initServer loads config, of the adapter's type, into the test's Caddy
// and waits for the old servers to go (awaitOldServers).
func initServer(t *testing.T, config, adapter string) *caddytest.Tester {
	t.Helper()
	// caddytest posts the config with the default transport, which may
	// hold a keep-alive connection to an admin server that the last load
	// replaced and is stopping: a POST sent on it is reset ("connection
	// reset by peer"), and the test runs on the old config.
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	tester := caddytest.NewTester(t)
	tester.InitServer(config, adapter)
	awaitOldServers(t)
	return tester
}

// oldServersStart is how long awaitOldServers gives the old config's
// Stop to start.
const oldServersStart = 100 * time.Millisecond

// awaitOldServers waits until a load's previous HTTP servers are gone.
// Caddy answers /load once the new servers run, and shuts the old ones
// down in goroutines of the http app's Stop; until they end an old server
// may still accept a connection on the shared listener, and with the
// preamble's grace_period of 1ns it closes it unanswered (EOF). On an idle
// machine they are gone about 3ms after the load.
func awaitOldServers(t *testing.T) {
	t.Helper()
	// Not a wait for an event this can see: the old config's Stop may
	// start after /load has answered, and until it does no goroutine shows
	// it (a full run from a clean clone once met the old servers for a
	// whole test). So give it its start, then wait for its end.
	time.Sleep(oldServersStart)
	poll.Until(t, 10*time.Second, "the old config's HTTP servers to shut down", func() bool {
		return !bytes.Contains(allStacks(), []byte("caddyhttp.(*App).Stop"))
	})
}

// allStacks returns the stack traces of every goroutine.
func allStacks() []byte {
	for buf := make([]byte, 1<<20); ; buf = make([]byte, 2*len(buf)) {
		if n := runtime.Stack(buf, true); n < len(buf) {
			return buf[:n]
		}
	}
}

func withOptions(options string) string {
	return strings.TrimSuffix(preamble, "}\n") + options + "\n}\n"
}

func TestRejectsWithRetryAfter(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 3 1h
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	for i := range 3 {
		if resp, body := get(t, tester, "/", key); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q, want 200 ok", i+1, resp.StatusCode, body)
		}
	}
	resp, _ := get(t, tester, "/", key)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th request: %d, want 429", resp.StatusCode)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	// Sliding: the 4 hits of this hour must fade to 2 before one more
	// fits, which takes the rest of the hour and half of the next.
	if err != nil || ra <= 1800 || ra > 5400 {
		t.Fatalf("Retry-After = %q, want the time left in the hour plus 1800s", resp.Header.Get("Retry-After"))
	}
}

func TestExactlyNAdmittedInOneWindow(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 25 1h
		}
		respond "ok"
	}`)
	if got := countAdmitted(t, tester, "/", uniqueKey(t), 40); got != 25 {
		t.Fatalf("admitted %d of 40, want 25", got)
	}
}

func TestHeaders(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /limited {
			key {http.request.header.X-Key}
			limit 5 1m
			limit 100 1h
			limit 1000 90s
			headers draft kong
		}
		rate_limit /hidden {
			key {http.request.header.X-Key}
			limit 5 1m
			hide_client_headers
		}
		rate_limit /default {
			key {http.request.header.X-Key}
			limit 5 1m
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	clearOfWindowEnds(time.Minute, 90*time.Second, time.Hour)
	// The default is the draft's two fields, and nothing else.
	resp, _ := get(t, tester, "/default", uniqueKey(t))
	for name := range resp.Header {
		if n := strings.ToLower(name); strings.Contains(n, "ratelimit") && n != "ratelimit-policy" && n != "ratelimit" {
			t.Errorf("default headers: response has %s", name)
		}
	}
	if resp.Header.Get("RateLimit-Policy") != `"default-Minute";q=5;w=60` || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"default-Minute";r=4;t=`) {
		t.Errorf("default headers: RateLimit-Policy %q, RateLimit %q", resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"))
	}
	get(t, tester, "/limited", key)
	resp, _ = get(t, tester, "/limited", key)
	for name, want := range map[string]string{
		"X-RateLimit-Limit-Minute":     "5",
		"X-RateLimit-Remaining-Minute": "3",
		"X-RateLimit-Limit-Hour":       "100",
		"X-RateLimit-Remaining-Hour":   "98",
		"X-RateLimit-Limit-90":         "1000",
		"X-RateLimit-Remaining-90":     "998",
		"RateLimit-Limit":              "5",
		"RateLimit-Remaining":          "3",
		"RateLimit-Policy":             `"default-Minute";q=5;w=60, "default-90";q=1000;w=90, "default-Hour";q=100;w=3600`,
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	// 2 hits in this minute: one fades away halfway through the next one.
	reset, err := strconv.Atoi(resp.Header.Get("RateLimit-Reset"))
	if err != nil || reset <= 30 || reset > 90 {
		t.Errorf("RateLimit-Reset = %q, want the time left in the minute plus 30s", resp.Header.Get("RateLimit-Reset"))
	}
	if got, want := resp.Header.Get("RateLimit"), fmt.Sprintf(`"default-Minute";r=3;t=%d`, reset); got != want {
		t.Errorf("RateLimit = %q, want %q", got, want)
	}
	resp, _ = get(t, tester, "/hidden", uniqueKey(t))
	for name := range resp.Header {
		if strings.Contains(strings.ToLower(name), "ratelimit") {
			t.Errorf("hide_client_headers: response has %s", name)
		}
	}
}

func TestKeysAreIsolated(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 2 1h
		}
		respond "ok"
	}`)
	base := uniqueKey(t)
	// Pairs that would collide under naive joins, and hash-tag look-alikes.
	long := base + strings.Repeat("x", 2000)
	keys := []string{base + "a", base + "b", base + ":x", base + "{x}", "{" + base + "}", base + "{x}:", base + " x",
		base + "\xff\xfe", base + "\xff", long + "1", long + "2"}
	for _, key := range keys {
		if got := countAdmitted(t, tester, "/", key, 3); got != 2 {
			t.Errorf("key %q: admitted %d of 3, want 2", key, got)
		}
	}
}

// TestFixedAndSliding hits two routes, one per window type, at the end of
// one window and at the start of the next: the sliding window still counts
// most of the previous one, the fixed window has started afresh. A round
// whose requests a loaded machine delayed past the moments that matter
// (the first two pairs across a window's end, or the last pair past the
// first half of the next window) says nothing, and is played again with a
// new key.
func TestFixedAndSliding(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /sliding {
			key sliding-{http.request.header.X-Key}
			limit 2 4s
		}
		rate_limit /fixed {
			key fixed-{http.request.header.X-Key}
			limit 2 4s
			window_type fixed
		}
		respond "ok"
	}`)
	const size = 4 * time.Second
	windowOf := func(at time.Time) int64 { return at.UnixNano() / int64(size) }
	sleepUntil := func(offset time.Duration) {
		next := time.Now().Truncate(size).Add(size + offset)
		time.Sleep(time.Until(next)) // not an event: the server's wall clock must reach that moment of a window
	}
	for round := 1; ; round++ {
		if round > 5 {
			t.Fatal("in 5 rounds the machine never served the requests within the moments the test needs")
		}
		key := uniqueKey(t)
		sleepUntil(100 * time.Millisecond)
		start := time.Now()
		for _, path := range []string{"/sliding", "/fixed"} {
			if got := countAdmitted(t, tester, path, key, 2); got != 2 {
				t.Fatalf("%s: admitted %d of 2 in a fresh window", path, got)
			}
		}
		if windowOf(time.Now()) != windowOf(start) {
			t.Logf("round %d: the first requests crossed a window's end; again", round)
			continue
		}
		// 200ms into the next window the previous one still weighs 0.95;
		// up to half of the window, more than 0.5: 1 + 2*0.5 > 2.
		sleepUntil(200 * time.Millisecond)
		before := time.Now()
		sliding, _ := get(t, tester, "/sliding", key)
		fixed, _ := get(t, tester, "/fixed", key)
		if windowOf(before) != windowOf(start)+1 || time.Since(before.Truncate(size)) >= size/2 {
			t.Logf("round %d: the last requests came %v into the next window; again", round, time.Since(before.Truncate(size)))
			continue
		}
		if sliding.StatusCode != http.StatusTooManyRequests {
			t.Errorf("sliding: %d, want 429 (1 + 2*0.95 > 2)", sliding.StatusCode)
		}
		if fixed.StatusCode != http.StatusOK {
			t.Errorf("fixed: %d, want 200 in a new window", fixed.StatusCode)
		}
		return
	}
}

// clearOfWindowEnds waits, if need be, until no window of the given sizes
// ends within the next few seconds, so that a test's requests and the
// counts it reads fall in one window of each size.
func clearOfWindowEnds(sizes ...time.Duration) {
	const margin = 3 * time.Second
	for {
		now := time.Now().UnixNano()
		var wait time.Duration
		for _, size := range sizes {
			if left := size - time.Duration(now%int64(size)); left < margin {
				wait = max(wait, left)
			}
		}
		if wait == 0 {
			return
		}
		time.Sleep(wait + 10*time.Millisecond) // not an event: the server's wall clock must pass the windows' ends
	}
}

// count reads a key's count in a namespace from the running app: of the
// current window and the one before it, so that a test's hits of its own
// key all count when the window ended during the test (its guard,
// clearOfWindowEnds, leaves a slow machine 3 s).
func count(t *testing.T, namespace, key string, size time.Duration) float64 {
	t.Helper()
	app, err := caddy.ActiveContext().App("rate_limit")
	if err != nil {
		t.Fatal(err)
	}
	s, err := app.(*syncapp.App).SlidingWindow(namespace, key, size, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s.Current + s.Previous
}

func TestDisablePenalty(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /penalty {
			key penalty-{http.request.header.X-Key}
			limit 2 1h
		}
		rate_limit /nopenalty {
			key nopenalty-{http.request.header.X-Key}
			limit 2 1h
			disable_penalty
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	clearOfWindowEnds(time.Hour)
	countAdmitted(t, tester, "/penalty", key, 5)
	countAdmitted(t, tester, "/nopenalty", key, 5)
	if got := count(t, "default", "penalty-"+key, time.Hour); got != 5 {
		t.Errorf("with the penalty the window counts %v, want all 5 hits", got)
	}
	if got := count(t, "default", "nopenalty-"+key, time.Hour); got != 2 {
		t.Errorf("with disable_penalty the window counts %v, want the 2 admitted", got)
	}
}

func TestDryRun(t *testing.T) {
	tester := loadWithOptions(t, `
		rate_limit {
			namespace trial {
				zone default
			}
		}`, `
	http://localhost:9080 {
		rate_limit {
			namespace trial
			key {http.request.header.X-Key}
			limit 1 1h
			dry_run
			headers kong
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	before := metricValue(t, `caddy_rate_limit_requests_total{namespace="trial",outcome="dry_run"}`)
	var resp *http.Response
	for range 3 {
		resp, _ = get(t, tester, "/", key)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("dry run rejected a request: %d", resp.StatusCode)
		}
	}
	if got := resp.Header.Get("RateLimit-Remaining"); got != "0" {
		t.Errorf("RateLimit-Remaining = %q, want 0", got)
	}
	if got := metricValue(t, `caddy_rate_limit_requests_total{namespace="trial",outcome="dry_run"}`); got != before+2 {
		t.Errorf("dry_run metric went from %v to %v, want +2", before, got)
	}
}

// metricValue scrapes one sample from the admin endpoint's metrics.
func metricValue(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://localhost:2999/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return f
		}
	}
	return 0
}

func TestJSONThroughAdminAPI(t *testing.T) {
	config := `{
		"admin": {"listen": "localhost:2999"},
		"apps": {
			"rate_limit": {
				"zones": {"default": {"max_keys": 100000}},
				"namespaces": {"api": {"zone": "default", "window_sizes": ["1s", "1m"]}}
			},
			"http": {"http_port": 9080, "grace_period": 1, "servers": {"srv0": {"listen": ["127.0.0.1:9080"], "routes": [{"handle": [
				{"handler": "rate_limit", "namespace": "api", "key": "{http.request.header.X-Key}",
				 "limits": [{"limit": 2, "window": "1m"}]},
				{"handler": "static_response", "body": "ok"}
			]}]}}},
			"pki": {"certificate_authorities": {"local": {"install_trust": false}}}
		}
	}`
	tester := initServer(t, config, "json")
	if got := countAdmitted(t, tester, "/", uniqueKey(t), 4); got != 2 {
		t.Fatalf("admitted %d of 4, want 2", got)
	}
}

func TestReloadKeepsCounters(t *testing.T) {
	site := func(body string) string {
		return fmt.Sprintf(`
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 3 1h
		}
		respond %q
	}`, body)
	}
	tester := load(t, site("first"))
	key := uniqueKey(t)
	if got := countAdmitted(t, tester, "/", key, 2); got != 2 {
		t.Fatalf("admitted %d of 2", got)
	}
	tester = load(t, site("second")) // a changed config: a real reload
	if got := countAdmitted(t, tester, "/", key, 1); got != 1 {
		t.Fatal("the third request was not admitted after the reload")
	}
	rejected := metricValue(t, `caddy_rate_limit_requests_total{namespace="default",outcome="rejected"}`)
	if resp, _ := get(t, tester, "/", key); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the fourth request: %d, want 429", resp.StatusCode)
	}
	// The same config again, forced through the admin API.
	adapted, _, err := caddyAdapt(withOptions("") + site("second"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "http://localhost:2999/load", bytes.NewReader(adapted))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Cache-Control", "must-revalidate")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("forced reload: %d", resp.StatusCode)
	}
	awaitOldServers(t)
	if resp, body := get(t, tester, "/", key); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after two reloads: %d %q, want 429 (the limit of 3 was used up before)", resp.StatusCode, body)
	}
	// The request metrics kept counting across the reloads.
	if got := metricValue(t, `caddy_rate_limit_requests_total{namespace="default",outcome="rejected"}`); got != rejected+2 {
		t.Fatalf("rejected requests metric went from %v to %v, want +2", rejected, got)
	}
}

func TestHandleErrorsShapesTheRejection(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 1 1h
		}
		respond "ok"
		handle_errors 429 {
			respond "limited in {http.rate_limit.namespace}: {http.rate_limit.limit} per {http.rate_limit.window}, {http.rate_limit.remaining} left, exceeded={http.rate_limit.exceeded}" 429
		}
	}`)
	key := uniqueKey(t)
	get(t, tester, "/", key)
	resp, body := get(t, tester, "/", key)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if want := "limited in default: 1 per Hour, 0 left, exceeded=true"; body != want {
		t.Fatalf("body %q, want %q", body, want)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("the shaped response lost Retry-After")
	}
}

func TestCustomErrorCodeAndJitter(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 1 1h
			error_code 503
			retry_after_jitter 10s
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	get(t, tester, "/", key)
	resp, _ := get(t, tester, "/", key)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 1 {
		t.Fatalf("Retry-After = %q", resp.Header.Get("Retry-After"))
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		config string
		want   string
	}{
		{`rate_limit {
			namespace nope
			limit 1 1m
		}`, `(namespaces: default)`},
		{`rate_limit {
			limit 0 1m
		}`, `limit: the limit must be a positive number`},
		{`rate_limit {
			limit 5 -1m
		}`, `limit: the window must be a positive duration`},
		{`rate_limit {
			key {http.request.remote.host}
		}`, `needs at least one`},
		{`rate_limit {
			limit 5 1m
			window_type rolling
		}`, `window_type: unknown window type`},
		{`rate_limit {
			limit 5 1m
			ipv6_prefix 129
		}`, `ipv6_prefix: want a whole number from 1 to 128, got \"129\"`},
		{`rate_limit {
			limit 5 1m
			ipv4_prefix /24
		}`, `ipv4_prefix: want a whole number from 1 to 32, got \"/24\"`},
		{`rate_limit {
			limit 5 fortnight
		}`, `limit: the window must be a positive duration or day, week or month, got \"fortnight\"`},
		{`rate_limit {
			limit 5 month
			timezone Mars/Olympus_Mons
		}`, `timezone: unknown time zone \"Mars/Olympus_Mons\": want an IANA name such as America/New_York`},
		{`rate_limit {
			limit 5 1h
			timezone Europe/Paris
		}`, `timezone: \"Europe/Paris\" has no effect without a calendar window`},
		{`rate_limit {
			limit 5 month
			limit 50 720h
		}`, `limits: windows month and 720h0m0s are both named Month in the headers`},
		{`rate_limit {
			limit 5 day
			timezone Local
		}`, `timezone: \"Local\" is each machine's own zone`},
		{`rate_limit {
			limit 5 1m
			key
		}`, `wrong argument count`},
		{`rate_limit {
			limit 5 1m
			error_code 302
		}`, `error_code: want a status from 400 to 599`},
		{`rate_limit {
			limit 5 1m
			retry_after_jitter -1s
		}`, `retry_after_jitter: want a duration of 0 or more`},
		{`rate_limit {
			limit 5 1m
			colour blue
		}`, `unrecognized subdirective 'colour'`},
		{`rate_limit {
			limit 5 1m
			max_concurrent -1
		}`, `max_concurrent: want a whole number of 0 or more`},
		{`rate_limit {
			limit 5 1m
			max_delay -2s
		}`, `max_delay: want a duration of 0 or more, got \"-2s\"`},
		{`rate_limit {
			limit 5 1m
			max_delay 1s
			max_waiting 0
		}`, `max_waiting: want a whole number of 1 or more, got \"0\"`},
		{`rate_limit {
			limit 5 1m
			max_waiting 10
		}`, `max_waiting: 10 has no effect without max_delay`},
		{`rate_limit {
			limit 5 1m
			ban -1m
		}`, `ban: want a duration of 0 or more, got \"-1m\"`},
		{`rate_limit {
			limit 5 1m
			cost -1
		}`, `cost: want a number of 0 or more, or placeholders, got \"-1\"`},
		{`rate_limit {
			limit 5 1m
			count_status 401 42
		}`, `count_status: want statuses from 100 to 599, got \"42\"`},
		{`rate_limit {
			limit 5 1m
			count_status 401
			max_delay 1s
		}`, `count_status: cannot be combined with max_delay (1s)`},
		{`rate_limit {
			key a
			key b
			limit 5 1m
		}`, `key: given twice`},
	} {
		caddytest.AssertLoadError(t, withOptions("")+"http://localhost:9080 {\n"+tc.config+"\nrespond ok\n}", "caddyfile", tc.want)
	}
}

func TestSynchronousNamespaceOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	tester := loadWithOptions(t, fmt.Sprintf(`
		rate_limit {
			namespace strict {
				sync_rate 0
				strategy redis {
					addresses %s
					key_prefix itest
				}
			}
		}`, srv.Addr), `
	http://localhost:9080 {
		rate_limit {
			namespace strict
			key {http.request.header.X-Key}
			limit 4 1h
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	if got := countAdmitted(t, tester, "/", key, 7); got != 4 {
		t.Fatalf("admitted %d of 7, want 4", got)
	}
	store, err := (&redis.Redis{Addresses: []string{srv.Addr}, KeyPrefix: "itest"}).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	// A hit that timed out on a loaded machine reaches the store on retry.
	// This hour's window and the one before: the hour may have ended
	// since the hits.
	poll.Until(t, 10*time.Second, "the store to count all 7 hits (rejected ones count without disable_penalty)", func() bool {
		start := time.Now().Truncate(time.Hour).UnixNano()
		cur, err := store.GetWindow(context.Background(), "strict", key, time.Hour, start)
		prev, perr := store.GetWindow(context.Background(), "strict", key, time.Hour, start-int64(time.Hour))
		return err == nil && perr == nil && cur+prev == 7
	})
}

// TestJSONLoadErrors sends bad handler and app JSON through /load: each is
// refused with an error naming the field and the value.
func TestJSONLoadErrors(t *testing.T) {
	config := func(app, handler string) string {
		return `{"admin": {"listen": "localhost:2999"}, "apps": {` + app +
			`"http": {"servers": {"srv0": {"listen": ["127.0.0.1:9080"], "routes": [{"handle": [` + handler + `]}]}}}}}`
	}
	for _, tc := range []struct {
		app, handler, want string
	}{
		{"", `{"handler": "rate_limit"}`, "limits: at least one limit is required"},
		{"", `{"handler": "rate_limit", "limits": [{"limit": -1, "window": "1m"}]}`, "limits: limit must be positive, got -1"},
		{"", `{"handler": "rate_limit", "limits": [{"limit": 5, "window": 0}]}`, "limits: window must be positive, got 0s"},
		{"", `{"handler": "rate_limit", "limits": [{"limit": 5, "window": "1m"}, {"limit": 9, "window": "60s"}]}`, "limits: window 1m0s appears twice"},
		{"", `{"handler": "rate_limit", "window_type": "rolling", "limits": [{"limit": 5, "window": "1m"}]}`, `window_type: unknown window type \"rolling\"`},
		{"", `{"handler": "rate_limit", "error_code": 700, "limits": [{"limit": 5, "window": "1m"}]}`, "error_code: 700 is not an error status"},
		{"", `{"handler": "rate_limit", "retry_after_jitter": "-2s", "limits": [{"limit": 5, "window": "1m"}]}`, "retry_after_jitter: must not be negative, got -2s"},
		{"", `{"handler": "rate_limit", "max_delay": "-1s", "limits": [{"limit": 5, "window": "1m"}]}`, "max_delay: must not be negative, got -1s"},
		{"", `{"handler": "rate_limit", "max_delay": "1s", "max_waiting": -4, "limits": [{"limit": 5, "window": "1m"}]}`, "max_waiting: must not be negative, got -4"},
		{"", `{"handler": "rate_limit", "key_fallbacks": ["{http.vars.client_ip}"], "limits": [{"limit": 5, "window": "1m"}]}`, "key_fallbacks: [\\\"{http.vars.client_ip}\\\"] without a key"},
		{"", `{"handler": "rate_limit", "key": "{http.request.header.X-API-Key}", "key_fallbacks": ["{http.vars.client_ip}", ""], "limits": [{"limit": 5, "window": "1m"}]}`, "key_fallbacks: fallback 2 is empty"},
		{"", `{"handler": "rate_limit", "response_cost": "-3", "limits": [{"limit": 5, "window": "1m"}]}`, `response_cost: want a number of 0 or more, or placeholders such as {http.response.header.X-Units}, got \"-3\"`},
		{"", `{"handler": "rate_limit", "response_cost": "{http.response.header.X-Units}", "max_delay": "1s", "limits": [{"limit": 5, "window": "1m"}]}`, "response_cost: cannot be combined with max_delay (1s)"},
		{"", `{"handler": "rate_limit", "response_cost": 2, "rate": {"rate": 5, "window": "1s"}}`, "response_cost: cannot be combined with rate"},
		{"", `{"handler": "rate_limit", "ipv4_prefix": 33, "limits": [{"limit": 5, "window": "1m"}]}`, "ipv4_prefix: 33 is not a network's prefix length: want 1 to 32"},
		{"", `{"handler": "rate_limit", "ipv6_prefix": -1, "limits": [{"limit": 5, "window": "1m"}]}`, "ipv6_prefix: -1 is not a network's prefix length: want 1 to 128"},
		{"", `{"handler": "rate_limit", "ban": "-1s", "limits": [{"limit": 5, "window": "1m"}]}`, "ban: must not be negative, got -1s"},
		{"", `{"handler": "rate_limit", "limits": [{"limit": 5, "calendar": "year"}]}`, `limits: calendar: unknown calendar window \"year\": want day, week or month`},
		{"", `{"handler": "rate_limit", "limits": [{"limit": 5, "window": "1h", "calendar": "day"}]}`, "limits: a limit has both a window (1h0m0s) and a calendar window (day): want one"},
		{"", `{"handler": "rate_limit", "timezone": "Nowhere/City", "limits": [{"limit": 5, "calendar": "week"}]}`, `timezone: unknown time zone \"Nowhere/City\"`},
		{"", `{"handler": "rate_limit", "limits": [{"limit": 5, "calendar": "week"}, {"limit": 9, "calendar": "week"}]}`, "limits: window week appears twice"},
		{"", `{"handler": "rate_limit", "ban": "9000h", "limits": [{"limit": 5, "window": "1m"}]}`, "ban: 9000h0m0s is longer than a store keeps a ban, 8784h0m0s"},
		{"", `{"handler": "rate_limit", "cost": -2, "limits": [{"limit": 5, "window": "1m"}]}`, `cost: want a number of 0 or more, or placeholders, got \"-2\"`},
		{"", `{"handler": "rate_limit", "count_status": [700], "limits": [{"limit": 5, "window": "1m"}]}`, "count_status: 700 is not a status: want 100 to 599"},
		{"", `{"handler": "rate_limit", "namespace": "api", "limits": [{"limit": 5, "window": "1m"}]}`, `unknown namespace \"api\" (namespaces: default)`},
		{`"rate_limit": {"namespaces": {"api": {"zone": "big"}}},`, `{"handler": "static_response"}`, `namespace \"api\": zone: unknown zone \"big\" (zones: default)`},
		{`"rate_limit": {"zones": {"z": {"max_keys": -3}}},`, `{"handler": "static_response"}`, `zone \"z\": max_keys must be positive, got -3`},
		{`"rate_limit": {"namespaces": {"api": {"sync_rate": "10us", "strategy": {"module": "redis"}}}},`, `{"handler": "static_response"}`, "sync_rate: 10µs is too short"},
		{`"rate_limit": {"namespaces": {"api": {"sync_rate": "1s", "strategy": {"module": "memcached"}}}},`, `{"handler": "static_response"}`, "rate_limit.strategies.memcached"},
	} {
		caddytest.AssertLoadError(t, config(tc.app, tc.handler), "json", tc.want)
	}
}

// TestKongOrder checks that once a limit rejects, the larger windows are
// read but not incremented, and that disable_penalty takes back what a
// rejected request added.
func TestKongOrder(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /penalty {
			key order-{http.request.header.X-Key}
			limit 2 1m
			limit 100 1h
		}
		rate_limit /nopenalty {
			key order-np-{http.request.header.X-Key}
			limit 2 1m
			limit 100 1h
			disable_penalty
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	clearOfWindowEnds(time.Minute, time.Hour)
	if got := countAdmitted(t, tester, "/penalty", key, 4); got != 2 {
		t.Fatalf("admitted %d of 4, want 2", got)
	}
	if m, h := count(t, "default", "order-"+key, time.Minute), count(t, "default", "order-"+key, time.Hour); m != 4 || h != 2 {
		t.Errorf("with the penalty: minute %v, hour %v; want 4 and 2 (the hour only read after the minute rejected)", m, h)
	}
	if got := countAdmitted(t, tester, "/nopenalty", key, 4); got != 2 {
		t.Fatalf("admitted %d of 4, want 2", got)
	}
	if m, h := count(t, "default", "order-np-"+key, time.Minute), count(t, "default", "order-np-"+key, time.Hour); m != 2 || h != 2 {
		t.Errorf("with disable_penalty: minute %v, hour %v; want 2 and 2", m, h)
	}
}

// TestResetIsPerKey compares two clients of one limit: the busier one gets
// a unit of quota back sooner, as its current count fades faster.
func TestResetIsPerKey(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 100 1h
			headers kong
		}
		respond "ok"
	}`)
	quiet, busy := uniqueKey(t), uniqueKey(t)
	// Both keys' hits in one hour: the resets count from its end.
	clearOfWindowEnds(time.Hour)
	resp, _ := get(t, tester, "/", quiet)
	quietReset, _ := strconv.Atoi(resp.Header.Get("RateLimit-Reset"))
	for range 9 {
		resp, _ = get(t, tester, "/", busy)
	}
	busyReset, _ := strconv.Atoi(resp.Header.Get("RateLimit-Reset"))
	// quiet: 1 hit fades by one over the whole next hour; busy: 9 hits fade
	// by one in a ninth of it.
	if !(busyReset > 0 && busyReset < quietReset) {
		t.Fatalf("RateLimit-Reset quiet %d, busy %d: want the busy key's sooner", quietReset, busyReset)
	}
}

func TestRetryAfterJitterVaries(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 1 1h
			window_type fixed
			retry_after_jitter 30s
		}
		respond "ok"
	}`)
	key := uniqueKey(t)
	get(t, tester, "/", key)
	seen := map[string]bool{}
	for range 20 {
		resp, _ := get(t, tester, "/", key)
		seen[resp.Header.Get("Retry-After")] = true
	}
	if len(seen) < 3 {
		t.Fatalf("20 rejections gave Retry-After values %v: the jitter does not vary", seen)
	}
}

// TestDraftHeadersAreIntegers checks RateLimit-Policy against
// draft-ietf-httpapi-ratelimit-headers-11, whose q and w are Integers: a
// fractional limit is rounded down, and a sub-second window is listed
// without w (which the draft makes optional).
func TestDraftHeadersAreIntegers(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit /draft {
			key {http.request.header.X-Key}
			limit 2.5 1s
			limit 1000 500ms
		}
		respond "ok"
	}`)
	resp, _ := get(t, tester, "/draft", uniqueKey(t))
	if got, want := resp.Header.Get("RateLimit-Policy"), `"default-0.5";q=1000, "default-Second";q=2;w=1`; got != want {
		t.Errorf("RateLimit-Policy = %q, want %q", got, want)
	}
	if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, `"default-Second";r=1;t=`) {
		t.Errorf("RateLimit = %q, want the 1s policy with 1 left", got)
	}
}
