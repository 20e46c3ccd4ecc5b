package accuracy

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
)

// ExactTolerance is how far over the limit a row that should be exact may
// go and still count as exact: 1 %, the promise's "at most 1.01". A
// synchronous row is measured at exactly 1.
const ExactTolerance = 0.01

// Claim is what the docs promise for a key in a row: exact (the limit,
// within ExactTolerance), or an overshoot of at most Allowance hits per
// window.
type Claim struct {
	Exact bool
	// Allowance is the hits over the limit a window may admit.
	Allowance float64
	// Others is what the other nodes admit of the key within one sync
	// interval when nothing stops them: (N−1) · rate/N · interval, in hits.
	Others float64
}

// ClaimFor returns the promise for a key sent keyRate requests per second
// round-robin to nodes nodes, limited to limit per Window:
//
//   - sync_rate 0: exact.
//   - periodic: the fleet overshoots by at most what the other nodes admit
//     within one sync interval, (N−1) · rate/N · interval;
//   - with sync_above s: exact while that stays under (1 − s) · limit.
func ClaimFor(row Row, nodes int, limit, keyRate float64) Claim {
	if !row.Periodic() {
		return Claim{Exact: true, Allowance: ExactTolerance * limit}
	}
	others := float64(nodes-1) * keyRate / float64(nodes) * row.SyncRate.Seconds()
	if row.SyncAbove > 0 && others < (1-row.SyncAbove)*limit {
		return Claim{Exact: true, Allowance: ExactTolerance * limit, Others: others}
	}
	return Claim{Allowance: others, Others: others}
}

// charged returns the promise of a budget charged from the response
// (response_cost, docs/limits.md): a request is admitted while the budget
// has room for one unit and charged after its response, so the requests
// in flight when the budget runs out pass it by what they cost: each up to
// units, the one that found the last room and those admitted within one
// request's time (keyRate × latency). A periodic fleet adds the other
// nodes' requests of one interval at units each, unless with sync_above
// those stay under (1 − sync_above) × limit, in units.
func (c Claim) charged(row Row, limit float64, units int, keyRate float64, latency time.Duration) Claim {
	u := float64(units)
	inFlight := u * (1 + math.Ceil(keyRate*latency.Seconds()))
	c.Others *= u
	c.Exact, c.Allowance = false, inFlight
	if row.Periodic() && !(row.SyncAbove > 0 && c.Others < (1-row.SyncAbove)*limit) {
		c.Allowance += c.Others
	}
	return c
}

// Breach is a window of a key that admitted more than its promise.
type Breach struct {
	Key      int
	Admitted int
	Allowed  float64 // the limit plus the claim's allowance
}

// Point is one admitted request of a plotted key: the time since the
// run's start, and how many the fleet had admitted in its window so far.
type Point struct {
	T        time.Duration
	Admitted int
}

// Outcome is what a row measured.
type Outcome struct {
	Row   Row
	Nodes int
	// Limit is the limit of the pattern's route, per key and Window.
	Limit float64

	// TargetRate is the limited requests per second the pattern asks for;
	// SentRate, what the load generator achieved; LateP99, the 99th
	// percentile of how late requests left after their scheduled time.
	TargetRate, SentRate float64
	LateP99              time.Duration

	// Limited requests sent, and their answers: admitted (200), rejected
	// (429) and failed (anything else, or no answer; FirstError says why).
	Limited, Admitted, Rejected, Failed int
	FirstError                          string

	// Worst is the most the fleet admitted in one window of one key, over
	// the limit: 1.00 is exact. WorstKey and WorstWindow say where.
	Worst         float64
	WorstAdmitted int
	WorstKey      int
	WorstWindow   time.Time
	// Commands are the store's calls of each command over the row, for
	// a Verbose runner on a CommandCounter ("evalsha 52, get 3").
	Commands string
	// WorstDetail tells how the worst window's admitted requests went:
	// per node, and when past the limit.
	WorstDetail string
	// Claim is the promise for the worst key, and Holds whether every
	// key's every window kept its own. When one did not, Breach is the
	// window that went furthest past its promise.
	Claim  Claim
	Holds  bool
	Breach Breach

	// LagChecked is how many admissions past the limit a periodic row
	// made, and Unexplained those of them that the other nodes' unseen
	// hits do not explain (see checkLag), in the order of keys and windows.
	LagChecked  int
	Unexplained []Unexplained

	// Ops is what the store counted during the row (Redis commands or
	// PostgreSQL transactions), and OpsRequests the limited requests that
	// caused them (the warm-up ones included).
	Ops         int64
	OpsRequests int

	// Latencies of the answered limited requests and of the bare ones of
	// the same run.
	LimitedP50, LimitedP99, BareP50, BareP99 time.Duration

	// Series is the hottest key's admitted count within its window over
	// time, for the plots; Start is the run's start.
	Series []Point
	Start  time.Time
}

// OpsPer1k is the store's operations per 1,000 limited requests.
func (o Outcome) OpsPer1k() float64 {
	if o.OpsRequests == 0 {
		return 0
	}
	return float64(o.Ops) * 1000 / float64(o.OpsRequests)
}

// AddedP50 is what the limiter adds to the median latency: the limited
// route's median minus the bare route's, in the same run on the same
// nodes.
func (o Outcome) AddedP50() time.Duration { return o.LimitedP50 - o.BareP50 }

// AddedP99 is the same for the 99th percentile.
func (o Outcome) AddedP99() time.Duration { return o.LimitedP99 - o.BareP99 }

// Intervals is the worst window's overshoot in units of the other nodes'
// hits per interval, (N−1) · rate/N · interval: how long, in sync
// intervals, the nodes went on admitting the key unaware of each other.
// It is 0 without an overshoot, and for a synchronous row.
func (o Outcome) Intervals() float64 {
	over := float64(o.WorstAdmitted) - o.Limit
	if over <= 0 || o.Claim.Others <= 0 {
		return 0
	}
	return over / o.Claim.Others
}

// Testable reports whether the row's traffic can show the periodic
// bound: whether the worst key is sent more per window than the limit
// plus the others' hits of one interval. Otherwise (steady 1×, or a long
// sync_rate) the fleet admits all it is sent within the bound anyway. A
// budget's rows have a bound of their own (Claim.charged).
func (o Outcome) Testable() bool {
	if !o.Row.Periodic() || o.Row.Pattern.Units > 0 {
		return false
	}
	perWindow := o.TargetRate * KeyShare(o.Row.Pattern, o.WorstKey) * Window.Seconds()
	if o.Row.Pattern.Length > 0 {
		perWindow = min(perWindow, o.TargetRate*o.Row.Pattern.Length.Seconds())
	}
	return perWindow > o.Limit+o.Claim.Others
}

// Bound is the worst key's promised ceiling of admitted / limit.
func (o Outcome) Bound() float64 { return 1 + o.Claim.Allowance/o.Limit }

// Analyze sums up a row's results: start is the run's start (a window's
// start), nodes the number of nodes, limit the route's limit per key and
// targetRate the limited requests per second the pattern sent.
func Analyze(row Row, nodes int, limit, targetRate float64, start time.Time, results []Result) Outcome {
	o := Outcome{Row: row, Nodes: nodes, Limit: limit, TargetRate: targetRate, Start: start, Holds: true, WorstKey: -1}
	var limitedLat, bareLat, late []time.Duration
	var first, last time.Time
	type keyWindow struct {
		key    int
		window int64
	}
	admitted := map[keyWindow]int{}
	admittedReqs := map[keyWindow][]Result{} // for the lag check
	sent := map[keyWindow]int{}              // by the client's clock: rejections carry no other
	var hottest []int64                      // server times of key 0's admitted requests
	windowMs := Window.Milliseconds()
	for _, r := range results {
		if !r.Sent.IsZero() {
			late = append(late, r.Sent.Sub(start.Add(r.At)))
		}
		if r.Bare {
			if r.Status == http.StatusOK {
				bareLat = append(bareLat, r.Latency)
			}
			continue
		}
		o.Limited++
		if !r.Sent.IsZero() {
			if first.IsZero() || r.Sent.Before(first) {
				first = r.Sent
			}
			if r.Sent.After(last) {
				last = r.Sent
			}
			sent[keyWindow{r.Key, r.Sent.UnixMilli() / windowMs}]++
		}
		switch {
		case r.Status == http.StatusOK && r.ServerMs > 0:
			o.Admitted++
			limitedLat = append(limitedLat, r.Latency)
			kw := keyWindow{r.Key, r.ServerMs / windowMs}
			admitted[kw] += max(r.Units, 1)
			if row.Periodic() && row.Pattern.Units == 0 { // checkLag counts requests
				admittedReqs[kw] = append(admittedReqs[kw], r)
			}
			if r.Key == 0 {
				hottest = append(hottest, r.ServerMs)
			}
		case r.Status == http.StatusTooManyRequests:
			o.Rejected++
			limitedLat = append(limitedLat, r.Latency)
		default:
			o.Failed++
			if o.FirstError == "" {
				o.FirstError = failure(r)
			}
		}
	}
	if o.Limited > 1 && last.After(first) {
		o.SentRate = float64(o.Limited-1) / last.Sub(first).Seconds()
	}
	o.LateP99 = Percentile(late, 0.99)
	o.LimitedP50, o.LimitedP99 = Percentile(limitedLat, 0.5), Percentile(limitedLat, 0.99)
	o.BareP50, o.BareP99 = Percentile(bareLat, 0.5), Percentile(bareLat, 0.99)

	// The worst window, and whether each key kept its own promise. A key
	// of a many-keys pattern gets its share of the rate, and in a window
	// where chance sent it more, the rate it was sent at.
	for kw, n := range admitted {
		rate := max(o.TargetRate*KeyShare(row.Pattern, kw.key), float64(sent[kw])/Window.Seconds())
		c := ClaimFor(row, nodes, limit, rate)
		if u := row.Pattern.Units; u > 0 {
			c = c.charged(row, limit, u, rate, o.LimitedP99)
		}
		if allowed := limit + c.Allowance; float64(n) > allowed+1e-9 {
			past := float64(n) - allowed
			if o.Holds || past > float64(o.Breach.Admitted)-o.Breach.Allowed ||
				past == float64(o.Breach.Admitted)-o.Breach.Allowed && kw.key < o.Breach.Key {
				o.Breach = Breach{Key: kw.key, Admitted: n, Allowed: allowed}
			}
			o.Holds = false
		}
		ratio := float64(n) / limit
		// Ties go to the earlier window of the lower key, for a stable
		// report.
		better := ratio > o.Worst ||
			ratio == o.Worst && (kw.key < o.WorstKey || kw.key == o.WorstKey && kw.window*windowMs < o.WorstWindow.UnixMilli())
		if o.WorstKey < 0 || better {
			o.Worst, o.WorstAdmitted, o.WorstKey, o.Claim = ratio, n, kw.key, c
			o.WorstWindow = time.UnixMilli(kw.window * windowMs)
		}
	}
	windows := slices.Collect(maps.Keys(admittedReqs))
	slices.SortFunc(windows, func(a, b keyWindow) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.window, b.window))
	})
	for _, kw := range windows {
		checked, bad := checkLag(admittedReqs[kw], kw.key, kw.window*windowMs, limit, row.SyncRate)
		o.LagChecked += checked
		o.Unexplained = append(o.Unexplained, bad...)
	}
	if o.WorstKey < 0 { // nothing admitted
		o.WorstKey = 0
		o.Claim = ClaimFor(row, nodes, limit, o.TargetRate*KeyShare(row.Pattern, 0))
	}
	o.Series = series(hottest, start, windowMs)
	o.WorstDetail = detail(results, o.WorstKey, o.WorstWindow, nodes, limit)
	return o
}

// detail describes the admitted requests of a key in a window: how many
// each node admitted, and when those past the limit were admitted, in
// milliseconds after the window's start, with their node.
func detail(results []Result, key int, window time.Time, nodes int, limit float64) string {
	var ms []Result
	from, to := window.UnixMilli(), window.Add(Window).UnixMilli()
	for _, r := range results {
		if !r.Bare && r.Key == key && r.Status == http.StatusOK && r.ServerMs >= from && r.ServerMs < to {
			ms = append(ms, r)
		}
	}
	slices.SortStableFunc(ms, func(a, b Result) int { return cmp.Compare(a.ServerMs, b.ServerMs) })
	perNode := make([]int, nodes)
	var past []string
	for i, r := range ms {
		if r.Node < nodes {
			perNode[r.Node]++
		}
		if float64(i+1) > limit {
			past = append(past, fmt.Sprintf("%dms@node%d", r.ServerMs-from, r.Node+1))
		}
	}
	s := fmt.Sprintf("admitted per node %v", perNode)
	if len(ms) > 0 && float64(len(ms)) >= limit {
		s += fmt.Sprintf("; the limit was reached at %dms", ms[int(limit)-1].ServerMs-from)
	}
	if len(past) > 0 {
		if len(past) > 12 {
			past = append(past[:12], fmt.Sprintf("and %d more", len(past)-12))
		}
		s += "; past it: " + strings.Join(past, " ")
	}
	return s
}

// series turns the server times of a key's admitted requests into its
// admitted count within the current window over time.
func series(ms []int64, start time.Time, windowMs int64) []Point {
	slices.Sort(ms)
	points := make([]Point, 0, len(ms))
	n, window := 0, int64(math.MinInt64)
	for _, t := range ms {
		if w := t / windowMs; w != window {
			window, n = w, 0
		}
		n++
		points = append(points, Point{T: time.UnixMilli(t).Sub(start), Admitted: n})
	}
	return points
}

// Percentile returns the p-quantile (0 < p ≤ 1) of ds by the nearest-rank
// method, or 0 for none. ds is not modified.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// failure says why a request failed: its error, a 200 without the node's
// clock (TimeHeader), or its status.
func failure(r Result) string {
	switch {
	case r.Err != nil:
		return r.Err.Error()
	case r.Status == http.StatusOK:
		return "200 without " + TimeHeader
	default:
		return fmt.Sprintf("status %d", r.Status)
	}
}
