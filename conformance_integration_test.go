package ratelimit

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"
	"github.com/dunglas/httpsfv"
)

// conformanceCase is one route of TestConformance: a handler config, and
// what the test needs to predict its responses.
type conformanceCase struct {
	name    string
	limits  []Limit // ascending windows, as the handler orders them
	cost    float64
	extra   string // more subdirectives
	headers string // "draft", "kong", "draft kong", "none" ("" = default draft)
	ban     time.Duration
	status  int  // what the route answers when admitted
	counts  bool // whether that status counts (count_status)
	dryRun  bool
	errCode int
	jitter  int  // seconds
	obey    bool // windows of a few seconds: wait Retry-After and retry
	conc    bool // max_concurrent 1, with one request of the key held in flight
	sends   int
}

func lim(n float64, d time.Duration) Limit { return Limit{Limit: n, Window: caddy.Duration(d)} }

// TestConformance parses every rate limit header of every response of a
// matrix of configurations with httpsfv (RFC 9651) and checks them against
// draft-ietf-httpapi-ratelimit-headers-11 and against what the limiter
// does: the draft's fields' types and required parameters, the names
// RateLimit gives among those RateLimit-Policy lists, r and t against the
// counts the test sent (Kong's headers too, and both alike when both are
// sent), and on rejections Retry-After >= t and equal to when the next
// request is admitted: predicted from the counts for windows of a minute
// or more (within the second the request took), and for windows of a few
// seconds by a client that waits it and is admitted. It logs how many
// responses it checked.
func TestConformance(t *testing.T) {
	cases := []conformanceCase{
		{name: "one", limits: []Limit{lim(3, time.Minute)}, sends: 5},
		{name: "two", limits: []Limit{lim(3, time.Minute), lim(5, time.Hour)}, sends: 5},
		{name: "two-second", limits: []Limit{lim(5, time.Minute), lim(3, time.Hour)}, headers: "draft kong", sends: 5},
		{name: "fractional", limits: []Limit{lim(2.5, time.Minute)}, headers: "draft kong", sends: 4},
		{name: "subsecond", limits: []Limit{lim(2, 500*time.Millisecond), lim(100, time.Hour)}, headers: "draft kong", obey: true, sends: 4},
		{name: "window1500", limits: []Limit{lim(2, 1500*time.Millisecond)}, headers: "draft kong", obey: true, sends: 4},
		{name: "ban", limits: []Limit{lim(2, time.Minute)}, ban: 30 * time.Second, headers: "draft kong", sends: 5},
		{name: "ban-short", limits: []Limit{lim(2, 4*time.Second)}, ban: 2 * time.Second, obey: true, sends: 4},
		{name: "concurrent", limits: []Limit{lim(100, time.Minute)}, conc: true, headers: "draft kong", sends: 3},
		{name: "concurrent-full", limits: []Limit{lim(2, time.Minute)}, conc: true, headers: "draft kong", sends: 2},
		{name: "cost2", limits: []Limit{lim(5, time.Minute)}, cost: 2, headers: "draft kong", sends: 4},
		{name: "cost-half", limits: []Limit{lim(2, time.Minute)}, cost: 0.5, headers: "draft kong", sends: 6},
		{name: "count-status", limits: []Limit{lim(2, time.Minute)}, status: 401, counts: true, extra: "count_status 401", headers: "draft kong", sends: 4},
		{name: "dry-run", limits: []Limit{lim(2, time.Minute)}, dryRun: true, extra: "dry_run", headers: "draft kong", sends: 4},
		{name: "error-code", limits: []Limit{lim(2, time.Minute)}, errCode: 503, extra: "error_code 503", sends: 4},
		{name: "jitter", limits: []Limit{lim(2, time.Minute)}, jitter: 3, extra: "retry_after_jitter 3s", headers: "draft kong", sends: 6},
		{name: "kong", limits: []Limit{lim(3, time.Minute), lim(10, time.Hour)}, headers: "kong", sends: 5},
		{name: "none", limits: []Limit{lim(3, time.Minute)}, headers: "none", sends: 5},
	}
	held := make(chan struct{})
	arrived := make(chan struct{}, 1)
	upstream := slowUpstreamFunc(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Hold") != "" {
			arrived <- struct{}{}
			<-held
		}
		w.Write([]byte("ok"))
	})
	var sites strings.Builder
	sites.WriteString("http://localhost:9080 {\n")
	for i := range cases {
		c := &cases[i]
		if c.cost == 0 {
			c.cost = 1
		}
		if c.status == 0 {
			c.status = http.StatusOK
		}
		if c.errCode == 0 {
			c.errCode = http.StatusTooManyRequests
		}
		fmt.Fprintf(&sites, "\thandle /%s {\n\t\trate_limit {\n\t\t\tkey {http.request.header.X-Key}\n", c.name)
		for _, l := range c.limits {
			fmt.Fprintf(&sites, "\t\t\tlimit %v %v\n", l.Limit, time.Duration(l.Window))
		}
		if c.cost != 1 {
			fmt.Fprintf(&sites, "\t\t\tcost %v\n", c.cost)
		}
		if c.ban > 0 {
			fmt.Fprintf(&sites, "\t\t\tban %v\n", c.ban)
		}
		if c.headers != "" {
			fmt.Fprintf(&sites, "\t\t\theaders %s\n", c.headers)
		}
		if c.conc {
			sites.WriteString("\t\t\tmax_concurrent 1\n")
		}
		if c.extra != "" {
			fmt.Fprintf(&sites, "\t\t\t%s\n", c.extra)
		}
		sites.WriteString("\t\t}\n")
		if c.conc {
			fmt.Fprintf(&sites, "\t\treverse_proxy %s\n\t}\n", upstream)
		} else {
			fmt.Fprintf(&sites, "\t\trespond \"ok\" %d\n\t}\n", c.status)
		}
	}
	sites.WriteString("}\n")
	tester := load(t, sites.String())
	var inFlight sync.WaitGroup

	checked := 0
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checked += runConformanceCase(t, tester, c, arrived, &inFlight)
		})
	}
	// Release the held requests, and wait for their answers: a server
	// with a request in flight outlives the next test's config load.
	close(held)
	inFlight.Wait()
	t.Logf("checked %d responses of %d configurations", checked, len(cases))
}

// keyState is what the test knows of its key: the hits it sent that
// count, per limit, all in one window of each (of a minute or more), and
// when the ban they started began (between two instants).
type keyState struct {
	counted  []float64
	banStart [2]time.Time
}

// Outcomes of a request, besides the index of the limit that rejected it.
const (
	admittedOutcome    = -1
	bannedOutcome      = -2
	concurrencyOutcome = -3
)

func runConformanceCase(t *testing.T, tester *caddytest.Tester, c conformanceCase, arrived chan struct{}, inFlight *sync.WaitGroup) (checked int) {
	key := uniqueKey(t)
	if !c.obey {
		var sizes []time.Duration
		for _, l := range c.limits {
			sizes = append(sizes, time.Duration(l.Window))
		}
		clearOfWindowEnds(sizes...)
	}
	st := keyState{counted: make([]float64, len(c.limits))}
	var last *http.Response
	for i := range c.sends {
		var resp *http.Response
		sent := time.Now()
		if c.conc && i == 0 {
			// One request of the key held in flight: the key's next one
			// is counted, then rejected by max_concurrent.
			inFlight.Go(func() {
				req, _ := http.NewRequest(http.MethodGet, "http://localhost:9080/"+c.name, nil)
				req.Header.Set("X-Key", key)
				req.Header.Set("X-Hold", "1")
				if resp, err := tester.Client.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			})
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the held request never reached the upstream")
			}
			sent = time.Now()
			resp, _ = get(t, tester, "/"+c.name, key)
			for j := range st.counted {
				st.counted[j] += 2 * c.cost // the held one, and this one
			}
			checkResponse(t, c, &st, resp, concurrencyOutcome, sent, time.Now())
		} else if c.conc {
			// Still held: a request the limits admit is counted, and
			// rejected by max_concurrent.
			resp, _ = get(t, tester, "/"+c.name, key)
			recv := time.Now()
			outcome := predict(c, &st, sent, recv)
			if outcome == admittedOutcome {
				outcome = concurrencyOutcome
			}
			checkResponse(t, c, &st, resp, outcome, sent, recv)
		} else {
			resp, _ = get(t, tester, "/"+c.name, key)
			recv := time.Now()
			checkResponse(t, c, &st, resp, predict(c, &st, sent, recv), sent, recv)
		}
		checked++
		last = resp
	}
	if c.obey && last.StatusCode == c.errCode {
		wait := time.Duration(retryAfter(t, last)) * time.Second
		time.Sleep(wait) // not a wait for an event: the client obeys Retry-After, which the test checks
		resp, _ := get(t, tester, "/"+c.name, key)
		checked++
		if resp.StatusCode != c.status {
			t.Errorf("after waiting Retry-After %v: %d, want admitted", wait, resp.StatusCode)
		}
	}
	return checked
}

// predict returns what the limiter decides for a request sent at send
// and answered at recv, and counts it in st as the limiter does: a
// rejected request (penalty) in the windows up to the one that rejected
// it, an admitted one in all (with count_status, only if its status
// counts), a banned one nowhere. For windows of a few seconds, whose
// counts fade while the test runs, it returns -4: not predicted.
func predict(c conformanceCase, st *keyState, send, recv time.Time) int {
	if c.obey {
		return -4
	}
	if !st.banStart[0].IsZero() && recv.Before(st.banStart[0].Add(c.ban)) {
		return bannedOutcome
	}
	for i, l := range c.limits {
		if st.counted[i]+c.cost > l.Limit+1e-9 {
			if c.counts && !c.dryRun {
				return i // count_status: a rejection with error_code does not count
			}
			for j := 0; j <= i; j++ {
				st.counted[j] += c.cost
			}
			if c.ban > 0 && !c.dryRun {
				st.banStart = [2]time.Time{send, recv}
			}
			return i
		}
	}
	for i := range st.counted {
		st.counted[i] += c.cost
	}
	return admittedOutcome
}

// untilTarget is the time from at until the sliding rate of a limit whose
// window started at start with count, and an empty previous window, falls
// to target: the draft's t and Retry-After, as the limiter computes them.
func untilTarget(count, target float64, size time.Duration, at time.Time) time.Duration {
	start := at.Truncate(size) // windows start at Unix multiples of their size
	if count <= target+1e-9 {
		return 0
	}
	end := start.Add(size)
	if target < 0 {
		return end.Add(size).Sub(at)
	}
	return end.Add(time.Duration(float64(size) * (1 - target/count))).Sub(at)
}

// secondsBetween returns the whole seconds (rounded up) that a wait which
// is w(at) at the instant the limiter answered may show, at being between
// send and recv.
func secondsBetween(w func(at time.Time) time.Duration, send, recv time.Time) (lo, hi int64) {
	ceil := func(d time.Duration) int64 { return int64(math.Ceil(d.Seconds() - 1e-9)) }
	return max(0, ceil(w(recv)-5*time.Millisecond)), max(0, ceil(w(send)+5*time.Millisecond))
}

// checkResponse parses a response's rate limit headers and checks them,
// and its status, against the outcome predicted.
func checkResponse(t *testing.T, c conformanceCase, st *keyState, resp *http.Response, outcome int, send, recv time.Time) {
	t.Helper()
	rejected := outcome >= 0 || outcome == bannedOutcome || outcome == concurrencyOutcome
	if c.dryRun && outcome >= 0 {
		rejected = false
	}
	switch {
	case outcome == -4:
		rejected = resp.StatusCode == c.errCode
	case rejected && resp.StatusCode != c.errCode:
		t.Fatalf("status %d, want the rejection's %d (outcome %d, counts %v)", resp.StatusCode, c.errCode, outcome, st.counted)
	case !rejected && resp.StatusCode != c.status:
		t.Fatalf("status %d, want %d (counts %v)", resp.StatusCode, c.status, st.counted)
	}
	draft := c.headers == "" || strings.Contains(c.headers, "draft")
	kong := strings.Contains(c.headers, "kong")
	for name := range resp.Header {
		n := strings.ToLower(name)
		if !strings.Contains(n, "ratelimit") {
			continue
		}
		isDraft := n == "ratelimit" || n == "ratelimit-policy"
		if isDraft && !draft || !isDraft && !kong {
			t.Errorf("headers %q: the response has %s", c.headers, name)
		}
	}

	// What the limiter should show: the policy, r, and t (as a range).
	shown, r := -1, int64(-1)
	var wait func(at time.Time) time.Duration // t of the policy shown
	var retry func(at time.Time) time.Duration
	admitWait := func(i int, at time.Time) time.Duration {
		l := c.limits[i]
		return untilTarget(st.counted[i], l.Limit-c.cost, time.Duration(l.Window), at)
	}
	banWait := func(at time.Time) time.Duration {
		if st.banStart[0].IsZero() || c.dryRun {
			return 0
		}
		return st.banStart[0].Add(c.ban).Sub(at)
	}
	if outcome != -4 {
		left := make([]int64, len(c.limits))
		for i, l := range c.limits {
			left[i] = max(0, int64(math.Floor(l.Limit-st.counted[i]+1e-9)))
		}
		retry = func(at time.Time) time.Duration {
			w := banWait(at)
			for i := range c.limits {
				w = max(w, admitWait(i, at))
			}
			return max(w, time.Second)
		}
		switch {
		case outcome >= 0:
			shown, r = outcome, left[outcome]
			wait = func(at time.Time) time.Duration {
				if c.ban > 0 && !c.dryRun {
					return max(admitWait(outcome, at), c.ban)
				}
				return admitWait(outcome, at)
			}
		case outcome == bannedOutcome:
			shown, r = len(c.limits)-1, 0
			longest := banWait(recv)
			for i := range c.limits {
				if w := admitWait(i, recv); w > longest {
					longest, shown = w, i
				}
			}
			wait = retry
		case outcome == concurrencyOutcome:
			r, wait = 0, retry
		default:
			best := int64(math.MaxInt64)
			for i, n := range left {
				if n <= best {
					shown, best = i, n
				}
			}
			r = left[shown]
			wait = func(at time.Time) time.Duration {
				i, l := shown, c.limits[shown]
				if w := admitWait(i, at); w > 0 {
					return w
				}
				target := l.Limit - 1
				if left[i] > 0 {
					target = st.counted[i] - 1
				}
				return untilTarget(st.counted[i], target, time.Duration(l.Window), at)
			}
		}
	}

	var field rateLimitField
	if draft {
		policies := parsePolicies(t, c, resp)
		field = parseRateLimit(t, resp)
		q, ok := policies[field.name]
		if !ok {
			t.Errorf("RateLimit names %q, which RateLimit-Policy %q does not list", field.name, resp.Header.Get("RateLimit-Policy"))
		}
		if field.r < 0 || field.r > q || field.t < 0 {
			t.Errorf("RateLimit %q: want 0 <= r <= q=%d and t >= 0", resp.Header.Get("RateLimit"), q)
		}
		wantName := "default-concurrency"
		if shown >= 0 {
			wantName = policyName("default", windowName(time.Duration(c.limits[shown].Window)))
		}
		if outcome != -4 && (field.name != wantName || field.r != r) {
			t.Errorf("RateLimit %q: want %s with r=%d (counts sent %v, outcome %d)", resp.Header.Get("RateLimit"), wantName, r, st.counted, outcome)
		}
		if wait != nil {
			if lo, hi := secondsBetween(wait, send, recv); field.t < lo || field.t > hi {
				t.Errorf("RateLimit %q: t=%d, want %d to %d (counts sent %v)", resp.Header.Get("RateLimit"), field.t, lo, hi, st.counted)
			}
		}
	}
	if kong {
		for i, l := range c.limits {
			w := windowName(time.Duration(l.Window))
			if got := sfInteger(t, resp, "X-RateLimit-Limit-"+w); got != int64(math.Floor(l.Limit)) {
				t.Errorf("X-RateLimit-Limit-%s %d, want %v rounded down", w, got, l.Limit)
			}
			got := sfInteger(t, resp, "X-RateLimit-Remaining-"+w)
			if want := max(0, int64(math.Floor(l.Limit-st.counted[i]+1e-9))); outcome != -4 && outcome != bannedOutcome && got != want {
				t.Errorf("X-RateLimit-Remaining-%s %d, want %d (counts sent %v)", w, got, want, st.counted)
			}
		}
		limit, remaining, reset := sfInteger(t, resp, "RateLimit-Limit"), sfInteger(t, resp, "RateLimit-Remaining"), sfInteger(t, resp, "RateLimit-Reset")
		if remaining < 0 || remaining > limit || reset < 0 {
			t.Errorf("RateLimit-Limit %d, -Remaining %d, -Reset %d: want 0 <= remaining <= limit, reset >= 0", limit, remaining, reset)
		}
		if draft && outcome != concurrencyOutcome && (remaining != field.r || reset != field.t) {
			t.Errorf("RateLimit-Remaining %d and -Reset %d, RateLimit %q: want the same r and t", remaining, reset, resp.Header.Get("RateLimit"))
		}
	}
	if !rejected {
		if v := resp.Header.Get("Retry-After"); v != "" {
			t.Errorf("admitted with Retry-After %q", v)
		}
		return
	}
	ra := int64(retryAfter(t, resp))
	if draft && ra < field.t {
		t.Errorf("Retry-After %d is earlier than the t=%d of %q", ra, field.t, resp.Header.Get("RateLimit"))
	}
	if retry != nil {
		lo, hi := secondsBetween(retry, send, recv)
		if ra < lo || ra > hi+int64(c.jitter) {
			t.Errorf("Retry-After %d, want when the next request is admitted: %d to %d (counts sent %v)", ra, lo, hi+int64(c.jitter), st.counted)
		}
	}
}

// parsePolicies parses RateLimit-Policy: a List of Strings with an
// Integer q each, w an Integer if present, qu a String if present, no name
// twice. It returns each policy's q, and checks them against the config.
func parsePolicies(t *testing.T, c conformanceCase, resp *http.Response) map[string]int64 {
	t.Helper()
	list, err := httpsfv.UnmarshalList(resp.Header.Values("RateLimit-Policy"))
	if err != nil {
		t.Fatalf("RateLimit-Policy %q: %v", resp.Header.Values("RateLimit-Policy"), err)
	}
	qs := make(map[string]int64)
	var got []string
	for _, m := range list {
		item, ok := m.(httpsfv.Item)
		name, isString := item.Value.(string)
		if !ok || !isString {
			t.Fatalf("RateLimit-Policy %q: a member is not a String item", resp.Header.Get("RateLimit-Policy"))
		}
		if _, dup := qs[name]; dup {
			t.Errorf("RateLimit-Policy %q: %s twice", resp.Header.Get("RateLimit-Policy"), name)
		}
		q, ok := param[int64](item, "q")
		if !ok || q < 0 {
			t.Errorf("RateLimit-Policy %q: %s has no Integer q", resp.Header.Get("RateLimit-Policy"), name)
		}
		desc := fmt.Sprintf("%s;q=%d", name, q)
		if _, has := item.Params.Get("w"); has {
			w, ok := param[int64](item, "w")
			if !ok || w <= 0 {
				t.Errorf("RateLimit-Policy %q: %s has a w that is not a positive Integer", resp.Header.Get("RateLimit-Policy"), name)
			}
			desc += fmt.Sprintf(";w=%d", w)
		}
		if _, has := item.Params.Get("qu"); has {
			qu, ok := param[string](item, "qu")
			if !ok {
				t.Errorf("RateLimit-Policy %q: %s has a qu that is not a String", resp.Header.Get("RateLimit-Policy"), name)
			}
			desc += ";qu=" + qu
		}
		qs[name] = q
		got = append(got, desc)
	}
	var want []string
	for _, l := range c.limits {
		size := time.Duration(l.Window)
		desc := fmt.Sprintf("%s;q=%d", policyName("default", windowName(size)), int64(math.Floor(l.Limit)))
		if size%time.Second == 0 {
			desc += fmt.Sprintf(";w=%d", size/time.Second)
		}
		want = append(want, desc)
	}
	if c.conc {
		want = append(want, "default-concurrency;q=1;qu=concurrent-requests")
	}
	if !slices.Equal(got, want) {
		t.Errorf("RateLimit-Policy %q: policies %q, want %q", resp.Header.Get("RateLimit-Policy"), got, want)
	}
	return qs
}

// param returns an item's parameter of type T.
func param[T any](item httpsfv.Item, key string) (T, bool) {
	v, _ := item.Params.Get(key)
	x, ok := v.(T)
	return x, ok
}

// sfInteger parses a header that must be a Structured Field Integer.
func sfInteger(t *testing.T, resp *http.Response, name string) int64 {
	t.Helper()
	item, err := httpsfv.UnmarshalItem(resp.Header.Values(name))
	n, ok := item.Value.(int64)
	if err != nil || !ok || item.Params != nil && len(item.Params.Names()) > 0 {
		t.Fatalf("%s %q: not an Integer (%v)", name, resp.Header.Values(name), err)
	}
	return n
}
