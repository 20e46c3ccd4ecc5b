package accuracy

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// spreadResults are a client's results, sent at ms after start: admitted
// (200) the first admit of them, rejected (429) the rest, each answered
// in 1ms.
func spreadResults(start time.Time, key, admit int, ms ...int64) []Result {
	var rs []Result
	for i, m := range ms {
		sent := start.Add(time.Duration(m) * time.Millisecond)
		r := Result{Request: Request{Key: key}, Sent: sent, Latency: time.Millisecond, Status: http.StatusTooManyRequests}
		if i < admit {
			r.Status, r.ServerMs = http.StatusOK, sent.UnixMilli()+1
		}
		rs = append(rs, r)
	}
	return rs
}

func TestSpreadBound(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000)
	ms100 := 100 * time.Millisecond
	five := SpreadLimit{5, time.Minute}
	// A client of 5 per minute as SpreadSchedule sends it: three fast
	// requests 25ms apart, then one every 100ms or every second.
	every100 := []int64{0, 25, 50, 150, 250, 350, 450, 550}
	every1s := []int64{0, 25, 50, 1050, 2050, 3050, 4050, 5050}
	for _, tc := range []struct {
		name   string
		rate   time.Duration
		above  float64
		admit  int
		ms     []int64
		bound  int
		hits   int
		limitN SpreadLimit
	}{
		{"synchronous", 0, 0, 5, every100, 5, 0, five},
		// The 5th admitted at 250ms: the request at 350ms falls within
		// 100ms + a 10ms beat + 2ms (and its answer's 1ms), 450ms not.
		{"off, every 100ms", ms100, 0, 7, every100, 6, 1, five},
		// Nothing within an interval and a beat of the 5th: exact.
		{"off, every 1s", ms100, 0, 8, every1s, 5, 0, five},
		// The count reached 2.5 (rounded up: 3) at 50ms; the hit at 150ms
		// is within 113ms of it: 3 + 1 ≤ 5, exact.
		{"sync_above 0.5, every 100ms", ms100, 0.5, 5, every100, 5, 1, five},
		// 4 at 150ms, and 250ms within: 4 + 1, exact.
		{"sync_above 0.8, every 100ms", ms100, 0.8, 5, every100, 5, 1, five},
		// Hits 25ms apart: 3 at 50ms, then four more within 113ms: 3 + 4
		// = 7, the others' hits of an interval are not under (1 − 0.5) ×
		// 5.
		{"sync_above 0.5, every 25ms", ms100, 0.5, 6, []int64{0, 25, 50, 75, 100, 125, 150, 175}, 7, 4, five},
		// The count never reached the mark: the limit.
		{"fewer than the mark", ms100, 0.8, 3, every1s[:3], 5, 0, five},
		// 100 per hour at 0.8: the 80th of 98 fast ones at 1975ms, then
		// four within 113ms: 84, exact.
		{"100 per hour, sync_above 0.8", ms100, 0.8, 100, fastThen(98, 100, 1000), 100, 4, SpreadLimit{100, time.Hour}},
		// The 100th at 97·25 + 2000ms, the next 1s later: exact.
		{"100 per hour, off, every 1s", ms100, 0, 100, fastThen(98, 100, 1000), 100, 0, SpreadLimit{100, time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row := SpreadRow{Store: "redis", Nodes: 6, Every: ms100, Limit: tc.limitN, SyncRate: tc.rate, SyncAbove: tc.above}
			bound, hits := SpreadBound(row, spreadResults(start, 0, tc.admit, tc.ms...))
			if bound != tc.bound || hits != tc.hits {
				t.Errorf("SpreadBound = %d, %d hits, want %d, %d hits", bound, hits, tc.bound, tc.hits)
			}
		})
	}
}

// fastThen returns the send times of fast requests 25ms apart, then tail
// more every ms after the last.
func fastThen(fast, tail int, every int64) []int64 {
	var ms []int64
	for i := range fast {
		ms = append(ms, int64(i)*25)
	}
	last := ms[len(ms)-1]
	for j := range tail {
		ms = append(ms, last+int64(j+1)*every)
	}
	return ms
}

func TestAnalyzeSpread(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000)
	row := SpreadRow{Store: "redis", Nodes: 6, Every: time.Second, Limit: SpreadLimit{5, time.Minute}, SyncRate: 100 * time.Millisecond}
	every1s := []int64{0, 25, 50, 1050, 2050, 3050, 4050, 5050}
	var results []Result
	// Client 0: 5; client 1: 7 (over its bound of 5); client 2: 7 too
	// (a tie: client 1 stays the worst); client 3: 6.
	for c, admit := range []int{5, 7, 7, 6} {
		results = append(results, spreadResults(start, c, admit, every1s...)...)
	}
	// A request of client 3 that failed.
	results = append(results, Result{Request: Request{Key: 3}, Sent: start, Status: http.StatusBadGateway})
	o := AnalyzeSpread(row, 4, start, results)
	if o.Worst != 1 || o.WorstAdmitted() != 7 || o.WorstBound() != 5 {
		t.Errorf("worst: client %d, %d of bound %d; want client 1, 7 of bound 5", o.Worst, o.WorstAdmitted(), o.WorstBound())
	}
	if o.Holds || o.Breach != 1 || o.Past != 3 {
		t.Errorf("holds %v, breach client %d, %d past the limit; want false, client 1, 3", o.Holds, o.Breach, o.Past)
	}
	if n := len(o.BreachRequests); n != len(every1s) || o.BreachRequests[0].Key != 1 ||
		!slices.IsSortedFunc(o.BreachRequests, func(a, b Result) int { return a.Sent.Compare(b.Sent) }) {
		t.Errorf("the breaching client's requests: %+v, want client 1's %d in the order sent", o.BreachRequests, len(every1s))
	}
	if o.Ratio() != 1.4 || o.BoundRatio() != 1 {
		t.Errorf("ratio %v, bound %v; want 1.4, 1", o.Ratio(), o.BoundRatio())
	}
	if o.Limited != 33 || o.Rejected != 32-25 || o.Failed != 1 || o.FirstError != "status 502" {
		t.Errorf("limited %d, rejected %d, failed %d (%q); want 33, 7, 1 (status 502)", o.Limited, o.Rejected, o.Failed, o.FirstError)
	}

	// Every client within its bound: the first of the most admitted is
	// the worst.
	results = nil
	for c := range 3 {
		results = append(results, spreadResults(start, c, 5, every1s...)...)
	}
	o = AnalyzeSpread(row, 3, start, results)
	if !o.Holds || o.Worst != 0 || o.Past != 0 || o.Breach != -1 || o.BreachRequests != nil {
		t.Errorf("holds %v, worst %d, past %d, breach %d; want true, 0, 0, -1", o.Holds, o.Worst, o.Past, o.Breach)
	}
}

func TestSpreadSchedule(t *testing.T) {
	row := SpreadRow{Store: "redis", Nodes: 6, Every: 10 * time.Second, Limit: SpreadLimit{100, time.Hour}, SyncRate: 100 * time.Millisecond}
	reqs := SpreadSchedule(row, 2)
	if len(reqs) != 98+SpreadTail {
		t.Fatalf("%d requests, want %d", len(reqs), 98+SpreadTail)
	}
	for i, r := range reqs {
		if r.Node != (2+i)%6 {
			t.Fatalf("request %d to node %d, want %d (round-robin from node 2)", i, r.Node, (2+i)%6)
		}
	}
	if reqs[97].At != 97*SpreadFastGap || reqs[98].At != 97*SpreadFastGap+10*time.Second || reqs[102].At != 97*SpreadFastGap+50*time.Second {
		t.Errorf("fast phase ends at %v, tail at %v to %v", reqs[97].At, reqs[98].At, reqs[102].At)
	}
	row.Random = true
	a, b := SpreadSchedule(row, 2), SpreadSchedule(row, 2)
	seen := map[int]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("random schedules differ at %d: %+v, %+v", i, a[i], b[i])
		}
		if a[i].Node < 0 || a[i].Node >= 6 {
			t.Fatalf("request %d to node %d", i, a[i].Node)
		}
		seen[a[i].Node] = true
	}
	if len(seen) != 6 {
		t.Errorf("random: %d of 6 nodes reached by 103 requests", len(seen))
	}
}

func TestPlanStarts(t *testing.T) {
	mk := func(l SpreadLimit, every time.Duration, c int) *spreadClient {
		row := SpreadRow{Nodes: 6, Every: every, Limit: l, SyncRate: 100 * time.Millisecond}
		return &spreadClient{reqs: SpreadSchedule(row, c), window: l.Window, phase: time.Duration(c) * 100 * time.Millisecond / SpreadClients}
	}
	minute, hour := SpreadLimits[0], SpreadLimits[1]
	for _, ready := range []time.Time{
		time.Unix(1_800_000_000, 0).Truncate(time.Hour).Add(2 * time.Second),   // early in a minute
		time.Unix(1_800_000_000, 0).Truncate(time.Hour).Add(30 * time.Second),  // late for a 10s client of 5 per minute
		time.Unix(1_800_000_000, 0).Truncate(time.Hour).Add(-20 * time.Second), // late in an hour
	} {
		var clients []*spreadClient
		for c := range SpreadClients {
			for _, every := range SpreadEvery {
				clients = append(clients, mk(minute, every, c), mk(hour, every, c))
			}
		}
		end := planStarts(clients, ready)
		var last time.Time
		for _, c := range clients {
			if c.start.Before(ready) || !withinWindow(c.start, c.length(), c.window) {
				t.Errorf("ready %v: a client of a %v window starts at %v for %v", ready, c.window, c.start, c.length())
			}
			if e := c.start.Add(c.length()); e.After(last) {
				last = e
			}
		}
		if !end.Equal(last) {
			t.Errorf("ready %v: end %v, want the last run's end %v", ready, end, last)
		}
		// The 10s clients of 5 per minute fit in the minute that holds
		// ready only early in it; then the family's fleet takes about a
		// minute.
		if took := end.Sub(ready); ready.Second() == 2 && took > 57*time.Second {
			t.Errorf("ready early in a minute: the fleet's traffic takes %v", took)
		}
	}
	// The fast phases are staggered: no two hourly clients start within
	// 150ms of each other.
	var clients []*spreadClient
	for c := range SpreadClients {
		clients = append(clients, mk(hour, time.Second, c))
	}
	planStarts(clients, time.Unix(1_800_000_000, 0).Truncate(time.Hour).Add(time.Minute))
	for i, a := range clients {
		for _, b := range clients[i+1:] {
			if d := a.start.Sub(b.start).Abs(); d < 150*time.Millisecond {
				t.Errorf("two hourly clients start %v apart", d)
			}
		}
	}
}

func TestSpreadPlan(t *testing.T) {
	rows := SpreadPlan([]string{"redis", "postgres"}, true)
	if want := 2 * 3 * 4 * 2 * 2 * 3; len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	ids := map[string]bool{}
	for _, r := range rows {
		if ids[r.ID()] {
			t.Fatalf("two rows %s", r.ID())
		}
		ids[r.ID()] = true
	}
	if fleets := groupFleets(rows); len(fleets) != 24 || len(fleets[0].rows) != 12 {
		t.Errorf("%d fleets of %d rows, want 24 of 12", len(fleets), len(fleets[0].rows))
	}
	if id := (SpreadRow{Store: "redis", Nodes: 6, Every: time.Second, Limit: SpreadLimits[0], SyncRate: 100 * time.Millisecond, SyncAbove: 0.5}).ID(); id != "redis-spread6-rr-every1s-5per1m-sync100ms-above05" {
		t.Errorf("ID %s", id)
	}
	if id := (SpreadRow{Store: "postgres", Nodes: 10, Every: 10 * time.Second, Random: true, Limit: SpreadLimits[1]}).ID(); id != "postgres-spread10-random-every10s-100per1h-sync0-aboveoff" {
		t.Errorf("ID %s", id)
	}
	if n := len(SpreadPlan([]string{"redis"}, false)); n != 3*2*2*2*3 {
		t.Errorf("without sync_above: %d rows, want %d", n, 3*2*2*2*3)
	}
	if q := SpreadQuickPlan("redis", true); len(q) != 4 || len(groupFleets(q)) != 2 {
		t.Errorf("quick plan: %d rows on %d fleets, want 4 on 2", len(q), len(groupFleets(q)))
	}
}

func TestWriteSpreadTables(t *testing.T) {
	row := SpreadRow{Store: "redis", Nodes: 6, Every: time.Second, Limit: SpreadLimits[0], SyncRate: 100 * time.Millisecond}
	random := row
	random.Random = true
	outcomes := []SpreadOutcome{
		{Row: row, Admitted: []int{5, 5}, Bounds: []int{5, 5}, Holds: true, Breach: -1, FleetOps: 500, FleetRequests: 1000},
		{Row: random, Admitted: []int{5, 7}, Bounds: []int{5, 5}, Worst: 1, Breach: 1, FleetOps: 500, FleetRequests: 1000},
	}
	var b strings.Builder
	WriteSpreadTables(&b, outcomes, nil)
	got := b.String()
	for _, want := range []string{
		"| nodes | sync_rate | sync_above | limit | rr, every 1s | random, every 1s | ops/1k (fleet) |",
		"| 6 | 100ms | off | 5 / 1m | 1.00 (5 ≤ 5) | 1.40 (7, bound 5) **no** | 500 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tables lack %q:\n%s", want, got)
		}
	}
}
