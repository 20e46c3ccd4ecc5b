package ratelimit

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// The rate of the rate tests: rate 10/1s burst 5, nginx's 10r/s with
// burst=5: 6 requests at once, then one per interval.
const (
	rateInterval = 100 * time.Millisecond
	rateAtOnce   = 6
)

// checkBurstThenPace checks rate 10/1s burst 5 through send, which makes
// one request of a key and returns its status. It bounds every count by
// the client's own timings, never by a sleep into the interval:
//
//   - 20 simultaneous requests of a new key: exactly 6 are admitted when
//     the 20 took less than one interval from the first send to the last
//     answer; when they took longer (a loaded machine), a 7th may rightly
//     have been admitted, so at most 6 + the intervals they took are, and
//     the round is played again with a new key (5 rounds at most).
//   - Then the key is asked again and again for about a second, until a
//     request is rejected: a rate admits 6 + one per interval since the
//     first request of the burst, so the admissions, counted up to the
//     last request (rejected), are 6 + the whole intervals between the
//     burst's first decision and the last's: each bounded by when the
//     client sent and got them.
func checkBurstThenPace(t *testing.T, send func(key string) int) {
	t.Helper()
	var key string
	var burstStart, burstEnd time.Time
	for round := 1; ; round++ {
		key = uniqueKey(t)
		var mu sync.Mutex
		var wg sync.WaitGroup
		statuses := make(map[int]int)
		burstStart = time.Now()
		for range 20 {
			wg.Go(func() {
				s := send(key)
				mu.Lock()
				statuses[s]++
				mu.Unlock()
			})
		}
		wg.Wait()
		burstEnd = time.Now()
		took := burstEnd.Sub(burstStart)
		ok := statuses[http.StatusOK]
		if ok+statuses[http.StatusTooManyRequests] != 20 {
			t.Fatalf("20 simultaneous: statuses %v, want only 200 and 429", statuses)
		}
		most := rateAtOnce + int(took/rateInterval)
		if ok < rateAtOnce || ok > most {
			t.Fatalf("20 simultaneous in %v: %d admitted, want %d (at most %d in that time)", took, ok, rateAtOnce, most)
		}
		if ok == rateAtOnce {
			t.Logf("round %d: 20 simultaneous in %v: %d admitted", round, took.Round(time.Millisecond), ok)
			break
		}
		if round == 5 {
			t.Fatalf("in 5 rounds the 20 requests never came within one interval: last %v, %d admitted", took, ok)
		}
	}

	admitted := rateAtOnce
	var lastSend, lastRecv time.Time
	var longestGap time.Duration
	prev := burstEnd
	for {
		lastSend = time.Now()
		status := send(key)
		lastRecv = time.Now()
		longestGap = max(longestGap, lastSend.Sub(prev))
		prev = lastRecv
		switch status {
		case http.StatusOK:
			admitted++
			continue
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("status %d", status)
		}
		if lastSend.Sub(burstEnd) >= time.Second {
			break
		}
		time.Sleep(5 * time.Millisecond) // not a wait: a client trying every 5 ms for a second of the rate
	}
	most := rateAtOnce + int(lastRecv.Sub(burstStart)/rateInterval)
	least := rateAtOnce + int(lastSend.Sub(burstEnd)/rateInterval)
	t.Logf("%d admitted in %v after the burst's start (between %d and %d by the timings)", admitted,
		lastRecv.Sub(burstStart).Round(time.Millisecond), least, most)
	if admitted > most {
		t.Errorf("%d admitted by %v after the burst started, want at most %d: faster than one per %v",
			admitted, lastRecv.Sub(burstStart), most, rateInterval)
	}
	// The key keeps its turns only while it asks within its burst of
	// 500ms: a machine that stalled the client longer gave some away.
	if longestGap < 500*time.Millisecond && admitted < least {
		t.Errorf("%d admitted by %v after the burst ended, want at least %d: slower than one per %v",
			admitted, lastSend.Sub(burstEnd), least, rateInterval)
	}
}

// TestRateBurst: rate 10/1s burst 5 over real HTTP in a local namespace:
// 6 of 20 simultaneous requests at once, then one per 100ms; rejections
// carry Retry-After and the draft's fields name the rate's policy.
func TestRateBurst(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			rate 10/1s burst 5
		}
		respond "ok"
	}`)
	checkBurstThenPace(t, func(key string) int {
		resp, _ := get(t, tester, "/", key)
		return resp.StatusCode
	})

	key := uniqueKey(t)
	resp, _ := get(t, tester, "/", key)
	if got, want := resp.Header.Get("RateLimit-Policy"), `"default-rate-Second";q=10;w=1;burst=5`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
	if got, want := resp.Header.Get("RateLimit"), `"default-rate-Second";r=5;t=1`; got != want {
		t.Errorf("after one request: RateLimit %q, want %q", got, want)
	}
	for range 5 {
		get(t, tester, "/", key)
	}
	resp, _ = get(t, tester, "/", key)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" ||
		resp.Header.Get("RateLimit") != `"default-rate-Second";r=0;t=1` {
		t.Errorf("the 7th at once: %d, Retry-After %q, RateLimit %q; want 429, 1, r=0;t=1",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
}

// TestRateMaxDelay: with max_delay 2s, 15 simultaneous requests of one key
// under rate 10/1s burst 5 are all served: 6 at once, then the others one
// per 100ms as their turns come (nginx's limit_req without nodelay). The
// admissions are recorded by the next handler: the 9 that waited are
// spread over at least 900ms from the first send, each at least its
// turns after the 6th (less the time a loaded machine may take to record
// the first ones), and no request waited past max_delay.
func TestRateMaxDelay(t *testing.T) {
	tester := loadWithOptions(t, "order test_admitted after rate_limit", `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			rate 10/1s burst 5
			max_delay 2s
		}
		test_admitted
		respond "ok"
	}`)
	key := uniqueKey(t)
	start := time.Now()
	if got, _ := simultaneous(t, tester, "/", key, 15); got[http.StatusOK] != 15 {
		t.Fatalf("statuses %v, want all 15 served", got)
	}
	took := time.Since(start)
	admitted.Lock()
	at := slices.Clone(admitted.at[key])
	admitted.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	t.Logf("15 served in %v, admitted at +%v", took.Round(time.Millisecond), offsets(at))
	if len(at) != 15 {
		t.Fatalf("%d admissions recorded, want 15", len(at))
	}
	if took < 9*rateInterval {
		t.Errorf("15 served in %v: the last 9 must take their turns, at least %v", took, 9*rateInterval)
	}
	if took > 2*time.Second+time.Second {
		t.Errorf("15 served in %v: some waited far past max_delay", took)
	}
	const recordJitter = 50 * time.Millisecond
	for i := rateAtOnce; i < len(at); i++ {
		if d, want := at[i].Sub(at[rateAtOnce-1]), time.Duration(i-rateAtOnce+1)*rateInterval-recordJitter; d < want {
			t.Errorf("admission %d came %v after the 6th, want at least %v", i+1, d, want)
		}
	}
}

// TestTiers: two clients on one route, whose plans (through Caddy's map)
// give 3 and 10 requests per minute, are each limited at their own
// number, with headers to match; a plan that gives no number is a 500,
// counted as invalid_limit, never a pass.
func TestTiers(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		map {http.request.header.X-Plan} {plan_quota} {plan_rate} {
			gold 10 20
			broken none 5
			default 3 4
		}
		rate_limit /quota {
			key {http.request.header.X-Key}
			limit {plan_quota} 1m
		}
		rate_limit /rate {
			key {http.request.header.X-Key}
			rate {plan_rate}/1m burst {plan_rate}
			headers draft kong
		}
		respond "ok"
	}`)
	for _, tc := range []struct {
		plan  string
		quota int
	}{{"basic", 3}, {"gold", 10}} {
		key := uniqueKey(t)
		ok := 0
		for i := range tc.quota + 2 {
			resp, _ := send(t, tester, http.MethodGet, "/quota", key, "X-Plan", tc.plan)
			if resp.StatusCode == http.StatusOK {
				ok++
			}
			if got, want := resp.Header.Get("RateLimit-Policy"), fmt.Sprintf(`"default-Minute";q=%d;w=60`, tc.quota); got != want {
				t.Errorf("plan %s: RateLimit-Policy %q, want %q", tc.plan, got, want)
			}
			wantR := max(0, tc.quota-i-1)
			if got := resp.Header.Get("RateLimit"); !strings.HasPrefix(got, fmt.Sprintf(`"default-Minute";r=%d;`, wantR)) {
				t.Errorf("plan %s, request %d: RateLimit %q, want r=%d", tc.plan, i+1, got, wantR)
			}
		}
		if ok != tc.quota {
			t.Errorf("plan %s: %d of %d admitted, want %d", tc.plan, ok, tc.quota+2, tc.quota)
		}
	}

	// A rate from the plan: 1 + burst at once, and Kong's headers show
	// the plan's rate.
	for _, tc := range []struct {
		plan   string
		atOnce int
		rate   string
	}{{"basic", 5, "4"}, {"gold", 21, "20"}} {
		key := uniqueKey(t)
		ok := 0
		var last *http.Response
		for range tc.atOnce + 2 {
			resp, _ := send(t, tester, http.MethodGet, "/rate", key, "X-Plan", tc.plan)
			if resp.StatusCode == http.StatusOK {
				ok++
			}
			last = resp
		}
		if ok != tc.atOnce {
			t.Errorf("rate of plan %s: %d at once, want %d", tc.plan, ok, tc.atOnce)
		}
		if got := last.Header.Get("X-Ratelimit-Limit-Rate-Minute"); got != tc.rate {
			t.Errorf("rate of plan %s: X-RateLimit-Limit-Rate-Minute %q, want %q", tc.plan, got, tc.rate)
		}
	}

	const invalid = `caddy_rate_limit_requests_total{namespace="default",outcome="invalid_limit"}`
	before := metricValue(t, invalid)
	resp, _ := send(t, tester, http.MethodGet, "/quota", uniqueKey(t), "X-Plan", "broken")
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("a plan whose quota is %q: status %d, want 500", "none", resp.StatusCode)
	}
	if got := metricValue(t, invalid) - before; got != 1 {
		t.Errorf("outcome invalid_limit: +%v, want +1", got)
	}
}

// TestRateLoadErrors: bad rates are refused at load naming the field and
// the value, and a periodic namespace refuses a rate, saying why (a
// synchronous one takes it: see syncapp's TestFleetRateBurstThenPace).
func TestRateLoadErrors(t *testing.T) {
	for _, tc := range []struct{ rl, want string }{
		{"rate 10", "rate: want <n>/<window>"},
		{"rate 0/1s", `rate: the rate must be a positive number`},
		{"rate 10/0s", `rate: the window must be a positive duration, got "0s"`},
		{"rate 10/1s burst -1", "rate: the burst must be a number of 0 or more, got -1"},
		{"rate 10/1s bursts 2", `got "bursts"`},
		{"limit many 1m", `limit: the limit must be a positive number or placeholders, got "many"`},
	} {
		_, _, err := caddyAdapt("http://localhost:9080 {\n\trate_limit {\n\t\t" + tc.rl + "\n\t}\n}\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.rl, err, tc.want)
		}
	}
	for _, tc := range []struct{ syncRate, want string }{
		{"100ms", "does not add up across nodes"},
	} {
		caddytest.AssertLoadError(t, withOptions(`
		rate_limit {
			namespace api {
				sync_rate `+tc.syncRate+`
				strategy memory
			}
		}`)+`
	http://localhost:9080 {
		rate_limit {
			namespace api
			rate 10/1s
		}
	}`, "caddyfile", tc.want)
	}
}
