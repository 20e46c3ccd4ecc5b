package accuracy

import (
	"cmp"
	"math"
	"net/http"
	"slices"
	"time"
)

// SpreadBound is the most the SPEC lets a fleet admit of one client of a
// spread row, from what the client sent (its results, in any order):
//
//   - sync_rate 0: the limit.
//   - periodic: past the limit, only the hits the fleet took of the key
//     within one sync_rate, plus the fetch beat, after its fleet count
//     reached the limit, or with sync_above f, f × the limit (rounded
//     up: the hit that took it there). Once every node has seen that
//     count (the key is near its limit, so the nodes decide it at the
//     store), nothing more is admitted past the limit; so the fleet
//     admits at most the larger of the limit and the count then plus
//     those hits. With f, that is the limit when those hits stay under
//     (1 − f) × the limit: exact.
//
// The count reached its mark when the node answered the hit that took it
// there (its send time plus its latency); the hits after it are those the
// client sent (admitted or not) within SyncRate + FetchBeat +
// FetchAllowance of it. It returns the bound and how many hits were
// sent within that lag (0 when the count never got there).
func SpreadBound(row SpreadRow, results []Result) (bound, hits int) {
	limit := row.Limit.Count
	if !row.Periodic() {
		return limit, 0
	}
	mark := limit
	if row.SyncAbove > 0 {
		mark = int(math.Ceil(row.SyncAbove*float64(limit) - 1e-9))
	}
	var admitted []Result
	for _, r := range results {
		if r.Status == http.StatusOK && r.ServerMs > 0 {
			admitted = append(admitted, r)
		}
	}
	if len(admitted) < mark || mark < 1 {
		return limit, 0
	}
	slices.SortStableFunc(admitted, func(a, b Result) int {
		return cmp.Or(cmp.Compare(a.ServerMs, b.ServerMs), a.Sent.Compare(b.Sent))
	})
	at := admitted[mark-1]
	until := at.Sent.Add(at.Latency + row.SyncRate + FetchBeat(row.SyncRate) + FetchAllowance)
	for _, r := range results {
		if !r.Sent.IsZero() && r.Sent.After(at.Sent) && !r.Sent.After(until) {
			hits++
		}
	}
	return max(limit, mark+hits), hits
}

// SpreadOutcome is what a spread row measured.
type SpreadOutcome struct {
	Row SpreadRow
	// Admitted is how many of each client's requests the fleet admitted,
	// and Bounds each client's bound (SpreadBound).
	Admitted []int
	Bounds   []int
	// Worst is the client admitted the most (the lowest of those tied),
	// and WorstHits the hits its bound counts.
	Worst     int
	WorstHits int
	// Holds reports whether every client stayed within its bound; when
	// one did not, Breach is the client that went furthest past it.
	Holds  bool
	Breach int
	// BreachRequests are the requests of the client Breach, in the order
	// sent: how it went past its bound.
	BreachRequests []Result
	// Past is how many clients were admitted more than the limit.
	Past int

	// Limited requests sent, and their answers: admitted (200), rejected
	// (429) and failed (anything else, or no answer; FirstError says why).
	Limited, Rejected, Failed int
	FirstError                string
	// LateP99 is the 99th percentile of how late requests left after
	// their scheduled time.
	LateP99 time.Duration

	// FleetOps is what the store counted while the row's fleet ran (its
	// rows at once: the figure is the fleet's, not the row's), and
	// FleetRequests the limited requests of the fleet's rows, warm-up
	// requests included.
	FleetOps      int64
	FleetRequests int
	// FleetTook is how long the fleet's traffic lasted.
	FleetTook time.Duration
}

// WorstAdmitted is the most the fleet admitted of one client.
func (o SpreadOutcome) WorstAdmitted() int {
	if len(o.Admitted) == 0 {
		return 0
	}
	return o.Admitted[o.Worst]
}

// WorstBound is the worst client's bound.
func (o SpreadOutcome) WorstBound() int {
	if len(o.Bounds) == 0 {
		return o.Row.Limit.Count
	}
	return o.Bounds[o.Worst]
}

// Ratio is the worst client's admitted / limit.
func (o SpreadOutcome) Ratio() float64 {
	return float64(o.WorstAdmitted()) / float64(o.Row.Limit.Count)
}

// BoundRatio is the worst client's bound / limit.
func (o SpreadOutcome) BoundRatio() float64 {
	return float64(o.WorstBound()) / float64(o.Row.Limit.Count)
}

// OpsPer1k is the store's operations per 1,000 limited requests of the
// row's fleet.
func (o SpreadOutcome) OpsPer1k() float64 {
	if o.FleetRequests == 0 {
		return 0
	}
	return float64(o.FleetOps) * 1000 / float64(o.FleetRequests)
}

// AnalyzeSpread sums up a spread row: results are its clients' requests,
// Request.Key the client's index (0 to clients − 1) and At after base.
func AnalyzeSpread(row SpreadRow, clients int, base time.Time, results []Result) SpreadOutcome {
	o := SpreadOutcome{Row: row, Admitted: make([]int, clients), Bounds: make([]int, clients), Holds: true, Breach: -1}
	per := make([][]Result, clients)
	var late []time.Duration
	for _, r := range results {
		if r.Key < 0 || r.Key >= clients {
			continue
		}
		per[r.Key] = append(per[r.Key], r)
		o.Limited++
		if !r.Sent.IsZero() {
			late = append(late, r.Sent.Sub(base.Add(r.At)))
		}
		switch {
		case r.Status == http.StatusOK && r.ServerMs > 0:
			o.Admitted[r.Key]++
		case r.Status == http.StatusTooManyRequests:
			o.Rejected++
		default:
			o.Failed++
			if o.FirstError == "" {
				o.FirstError = failure(r)
			}
		}
	}
	o.LateP99 = Percentile(late, 0.99)
	for c := range clients {
		var hits int
		o.Bounds[c], hits = SpreadBound(row, per[c])
		if o.Admitted[c] > row.Limit.Count {
			o.Past++
		}
		if past := o.Admitted[c] - o.Bounds[c]; past > 0 {
			if o.Holds || past > o.Admitted[o.Breach]-o.Bounds[o.Breach] {
				o.Breach = c
			}
			o.Holds = false
		}
		if o.Admitted[c] > o.Admitted[o.Worst] || c == 0 {
			o.Worst, o.WorstHits = c, hits
		}
	}
	if !o.Holds {
		o.BreachRequests = slices.SortedStableFunc(slices.Values(per[o.Breach]), func(a, b Result) int { return a.Sent.Compare(b.Sent) })
	}
	return o
}
