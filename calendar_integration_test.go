package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
	"github.com/ratesync/caddy-ratelimit/window"
)

// TestCalendarWindowThroughCaddy spends a monthly quota of 3 in New York
// through Caddy, on the wall clock: the fourth request is rejected with
// Retry-After and the draft's t counting down to local midnight of the
// next 1st, RateLimit-Policy states this month's length as w, and the
// admin API shows the key's use of its month.
func TestCalendarWindowThroughCaddy(t *testing.T) {
	tester := load(t, `
	http://localhost:9080 {
		rate_limit {
			key {http.request.header.X-Key}
			limit 3 month
			limit 1000 1m
			timezone America/New_York
		}
		respond "ok"
	}`)
	ny, _ := time.LoadLocation("America/New_York")
	key := fmt.Sprint("calendar-", rand.Uint64())
	for i := range 3 {
		if resp, _ := send(t, tester, http.MethodGet, "/", key); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d, want 200", i+1, resp.StatusCode)
		}
	}
	resp, _ := send(t, tester, http.MethodGet, "/", key)
	now := time.Now().In(ny)
	start := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, ny)
	next := start.AddDate(0, 1, 0)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("request 4: %d, want 429", resp.StatusCode)
	}
	// Whole seconds, rounded up, read a moment after the server did.
	near := func(got string, want time.Duration) bool {
		n, err := strconv.Atoi(got)
		secs := int(want.Seconds())
		return err == nil && n >= secs && n <= secs+3
	}
	if got := resp.Header.Get("Retry-After"); !near(got, next.Sub(now)) {
		t.Errorf("Retry-After %q, want the %v until %v", got, next.Sub(now).Round(time.Second), next)
	}
	field := resp.Header.Get("RateLimit")
	tPart := field[strings.LastIndex(field, ";t=")+3:]
	if !strings.HasPrefix(field, `"default-Month";r=0;t=`) || !near(tPart, next.Sub(now)) {
		t.Errorf("RateLimit %q, want the month's policy with r=0 and t the seconds until %v", field, next)
	}
	wantPolicy := fmt.Sprintf(`"default-Minute";q=1000;w=60, "default-Month";q=3;w=%d`, int(next.Sub(start).Seconds()))
	if got := resp.Header.Get("RateLimit-Policy"); got != wantPolicy {
		t.Errorf("RateLimit-Policy %q, want %q", got, wantPolicy)
	}
	k := adminReadKey(t, http.MethodGet, adminKeyPath("default", key))
	var found bool
	for _, w := range k.Windows {
		if w.Size != "month" {
			continue
		}
		found = true
		if w.Timezone != "America/New_York" || !w.Start.Equal(start) || w.End == nil || !w.End.Equal(next) || w.Current != 4 {
			t.Errorf("the admin API shows the month as %+v, want %v to %v in America/New_York with 4", w, start, next)
		}
	}
	if !found {
		t.Errorf("the admin API shows no month: %+v", k)
	}
}

// TestCalendarHeadersOnATestClock computes the headers of a monthly quota
// of 100 in New York from a zone on a test clock, around the end of DST
// (1 November 2026): w is each month's own length (October 744 hours,
// November 721), and once the quota is spent t and Retry-After count
// down to local midnight of the next 1st.
func TestCalendarHeadersOnATestClock(t *testing.T) {
	h := &Handler{Limits: []Limit{{Limit: 100, Calendar: "month"}}, Timezone: "America/New_York", Namespace: "api", ErrorCode: 429}
	if err := h.validate(); err != nil {
		t.Fatal(err)
	}
	ny, _ := time.LoadLocation("America/New_York")
	clock := fakeclock.New(time.Date(2026, 10, 20, 9, 0, 0, 0, ny))
	z, err := window.NewZone(10, clock.UnixNano)
	if err != nil {
		t.Fatal(err)
	}
	counters, _ := z.Namespace("api")
	for _, tc := range []struct {
		at   time.Time
		next time.Time
		w    time.Duration
	}{
		{time.Date(2026, 10, 20, 9, 0, 0, 0, ny), time.Date(2026, 11, 1, 0, 0, 0, 0, ny), 31 * 24 * time.Hour},
		{time.Date(2026, 11, 1, 1, 30, 0, 0, ny), time.Date(2026, 12, 1, 0, 0, 0, 0, ny), 30*24*time.Hour + time.Hour},
		{time.Date(2026, 11, 30, 23, 0, 0, 0, ny), time.Date(2026, 12, 1, 0, 0, 0, 0, ny), 30*24*time.Hour + time.Hour},
	} {
		clock.Set(tc.at)
		samples := make([]window.Sample, 1)
		for range 100 {
			counters.Hit("k", h.static.hitLimits, 1, false, true, false, samples)
		}
		rejected := counters.Hit("k", h.static.hitLimits, 1, false, true, false, samples)
		if rejected != 0 {
			t.Fatalf("at %v: the 101st request of the month admitted", tc.at)
		}
		p := h.inPeriods(&h.static, samples)
		if want := fmt.Sprintf(`"api-Month";q=100;w=%d`, int(tc.w.Seconds())); p.policy != want {
			t.Errorf("at %v: RateLimit-Policy %q, want %q", tc.at, p.policy, want)
		}
		now := samples[0].At
		secs := int(tc.next.Sub(tc.at).Seconds())
		if got := h.reset(p, 0, samples[0], 1, h.remaining(p, 0, samples[0]), now); got != secs {
			t.Errorf("at %v: t=%d, want %d", tc.at, got, secs)
		}
		if got := h.retryAfter(p, samples, 1, now); got != secs {
			t.Errorf("at %v: Retry-After %d, want %d", tc.at, got, secs)
		}
		if again := h.inPeriods(&h.static, samples); again != p {
			t.Errorf("at %v: the month's policy was written again", tc.at)
		}
	}
}
