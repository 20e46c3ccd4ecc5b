package faults

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

func TestTurnsOf(t *testing.T) {
	now := time.Unix(1000, 0).UnixNano()
	hour := int64(RateWindow)
	for _, tc := range []struct {
		name string
		tat  int64
		want int
	}{
		{"no TAT", 0, 0},
		{"a TAT that passed", now - 1, 0},
		{"a TAT at now", now, 0},
		{"one turn, just taken", now + hour, 1},
		{"one turn, a minute ago", now + hour - int64(time.Minute), 1},
		{"two turns, a minute ago", now + 2*hour - int64(time.Minute), 2},
		{"two turns, just taken", now + 2*hour, 2},
	} {
		if got := turnsOf(strategy.RateReply{TAT: tc.tat, Now: now}); got != tc.want {
			t.Errorf("%s: turnsOf = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestDownSpans(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	end := at(10_000)
	ss := []SyncSample{
		{At: at(0), Runs: 1},
		{At: at(100), Runs: 2},
		{At: at(200), Runs: 2, Errors: 1}, // a failure after 100 ms
		{At: at(300), Runs: 3, Errors: 2}, // a run that failed
		{At: at(400), Runs: 4, Errors: 2}, // a clean run, read before 500 ms
		{At: at(500), Runs: 5, Errors: 2},
		{At: at(600), Runs: 5, Errors: 3}, // down again, never back
		{At: at(700), Runs: 5, Errors: 3},
	}
	want := []timeSpan{{at(100), at(500)}, {at(500), end}}
	got := downSpans(ss, end)
	if len(got) != len(want) {
		t.Fatalf("downSpans = %v, want %v", got, want)
	}
	for i := range want {
		if !got[i].from.Equal(want[i].from) || !got[i].to.Equal(want[i].to) {
			t.Errorf("span %d = %v, want %v", i, got[i], want[i])
		}
	}
	// A clean run in the last sample: the span ends at end.
	if got := downSpans(ss[:5], end); len(got) != 1 || !got[0].to.Equal(end) {
		t.Errorf("a clean run last: %v, want one span to end", got)
	}
	if got := downSpans(ss[:2], end); len(got) != 0 {
		t.Errorf("no failure: %v", got)
	}
	if !overlaps(want, at(450), at(460)) || !overlaps(want, at(0), at(100)) || overlaps(want[:1], at(0), at(99)) || overlaps(want[:1], at(501), at(900)) {
		t.Error("overlaps: wrong at an end of a span")
	}
}

func TestTurnsJudge(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	down := []timeSpan{{at(1000), at(3000)}}
	req := func(sent, latency, status int) *Result {
		return &Result{Class: Rate, Sent: at(sent), Latency: time.Duration(latency) * time.Millisecond, Status: status}
	}
	for _, tc := range []struct {
		name string
		r    *Result
		n    int
		want Turns
	}{
		{"counted", req(0, 5, 200), 1, Turns{Admitted: 1, Counted: 1}},
		{"counted twice", req(0, 5, 200), 2, Turns{Admitted: 1, Counted: 2, Doubled: 1}},
		{"not counted, the store up", req(0, 5, 200), 0, Turns{Admitted: 1, Lost: 1}},
		{"not counted, the store held down", req(1500, 5, 200), 0, Turns{Admitted: 1, Alone: 1}},
		{"not counted, answered as the store was held down", req(990, 20, 200), 0, Turns{Admitted: 1, Alone: 1}},
		{"in doubt, counted", req(1500, 1000, 200), 1, Turns{Admitted: 1, Counted: 1, InDoubt: 1}},
		{"in doubt, not counted", req(1500, 1001, 200), 0, Turns{Admitted: 1, InDoubt: 1, Lost: 1}},
		{"in doubt, counted twice", req(1500, 1500, 200), 2, Turns{Admitted: 1, Counted: 2, InDoubt: 1, Doubled: 1}},
		{"no answer, counted", req(1500, 100, 0), 1, Turns{Counted: 1, Unanswered: 1, UnansweredCounted: 1}},
		{"no answer, not counted", req(0, 100, 0), 0, Turns{Unanswered: 1}},
		{"no answer, counted twice", req(0, 100, 0), 2, Turns{Counted: 2, Unanswered: 1, UnansweredCounted: 1, Doubled: 1}},
		{"refused, counted", req(0, 5, 429), 1, Turns{Counted: 1, Doubled: 1}},
		{"refused, not counted", req(0, 5, 429), 0, Turns{}},
	} {
		var got Turns
		got.judge(tc.r, tc.n, down)
		if got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestLatency(t *testing.T) {
	var lat []time.Duration
	for i := range 200 {
		lat = append(lat, time.Duration(200-i)*time.Millisecond)
	}
	lat[0], lat[1] = 900*time.Millisecond, 1100*time.Millisecond
	var l Latency
	l.of(lat)
	want := Latency{P50: 101 * time.Millisecond, P99: 198 * time.Millisecond, Max: 1100 * time.Millisecond, Slow: 0.01, N: 200}
	if l != want {
		t.Errorf("Latency = %+v, want %+v", l, want)
	}
	var none Latency
	if none.of(nil); none != (Latency{}) {
		t.Errorf("no latencies: %+v", none)
	}
}

func TestRatesFor(t *testing.T) {
	r := Rates{Count: 330, Limit: 150, Conc: 60, Rate: 60}
	if got := r.For(true); got != r {
		t.Errorf("sync: %v", got)
	}
	if got := r.For(false); got != (Rates{Count: 390, Limit: 150, Conc: 60}) || got.Total() != r.Total() {
		t.Errorf("periodic: %v", got)
	}
}

// TestNodeConfigRate: RatePath only at sync_rate 0, where a namespace
// takes a rate.
func TestNodeConfigRate(t *testing.T) {
	for _, sync := range []bool{false, true} {
		c := NodeConfig{Listen: "fd/3", AdminListen: "fd/4", SyncRate: PeriodicRate, Strategy: json.RawMessage(`{"module":"memory"}`),
			Limit: 5, BanLimit: 5, Ban: time.Minute, MaxConcurrent: 5, Upstream: "127.0.0.1:3"}
		if sync {
			c.SyncRate = 0
		}
		b, err := c.JSON()
		if err != nil {
			t.Fatal(err)
		}
		has := strings.Contains(string(b), `"`+RatePath+`"`) && strings.Contains(string(b), `"window": "1h0m0s"`) &&
			strings.Contains(string(b), `"burst": 100`)
		if has != sync {
			t.Errorf("sync %v: a rate route %v, want %v:\n%s", sync, has, sync, b)
		}
	}
}

// TestRatesTable checks the table of rates a report shows when a row's
// load had them, and the rates' promises.
func TestRatesTable(t *testing.T) {
	r := report()
	if r.HasRates() {
		t.Fatal("a periodic row has rates")
	}
	o := r.Outcomes[0]
	o.Row.Sync, o.Rates = true, DefaultRates
	o.Turns = Turns{Admitted: 1500, Counted: 1301, InDoubt: 6, Alone: 200, Unanswered: 2, UnansweredCounted: 1,
		Latency: Latency{P50: time.Millisecond, P99: 1020 * time.Millisecond, Max: 1090 * time.Millisecond, Slow: 0.004}}
	md, err := r.Markdown()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"### Rates at sync_rate 0\n\n| fault | turns admitted / counted in the store |",
		"| Redis paused 10 s (SIGSTOP, SIGCONT) | 1500 / 1301 | 6 | 200 | 0 | 0 | 2 (1) | 1 / 1020 / 1090 | 0.40 % |\n\n### Recovery",
		"| rates: 0 turns lost (admitted at the store or in doubt, not in its TAT) | 1 | ✅ 1 |",
		"| rates: p99 ≤ read_timeout + 50 ms (1,050 ms) | 1 | ✅ 1 |",
		"`/rate` (`rate 1/1h burst 100`, a new key per request;",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q:\n%s", want, md)
		}
	}
	o.Turns.Lost, o.Turns.Latency.Slow = 1, 0.02
	var failed []string
	for _, c := range o.Checks() {
		if !c.Held {
			failed = append(failed, c.Promise)
		}
	}
	want := []string{"rates: 0 turns lost (admitted at the store or in doubt, not in its TAT)", "rates: ≤ 1 % of requests wait ≥ 900 ms"}
	if strings.Join(failed, "; ") != strings.Join(want, "; ") {
		t.Errorf("failed promises %q, want %q", failed, want)
	}
}
