package accuracy

import (
	"math"
	"net/http"
	"testing"
	"time"
)

func TestClaimFor(t *testing.T) {
	ms100 := 100 * time.Millisecond
	for _, tc := range []struct {
		name      string
		row       Row
		keyRate   float64
		exact     bool
		allowance float64
	}{
		{"synchronous", Row{SyncRate: 0}, 400, true, 2},
		// 3 nodes at 400 req/s: the other two get 2·400/3 per second, so
		// 26.7 hits in 100ms.
		{"periodic", Row{SyncRate: ms100}, 400, false, 2 * 400.0 / 3 * 0.1},
		// 26.7 < (1 − 0.8)·200 = 40: exact.
		{"sync_above 0.8 at 2x", Row{SyncRate: ms100, SyncAbove: 0.8}, 400, true, 2},
		// 26.7 ≥ (1 − 0.9)·200 = 20: the periodic bound.
		{"sync_above 0.9 at 2x", Row{SyncRate: ms100, SyncAbove: 0.9}, 400, false, 2 * 400.0 / 3 * 0.1},
		{"sync_above 0.8 at 5x", Row{SyncRate: ms100, SyncAbove: 0.8}, 1000, false, 2 * 1000.0 / 3 * 0.1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ClaimFor(tc.row, 3, 200, tc.keyRate)
			if c.Exact != tc.exact || math.Abs(c.Allowance-tc.allowance) > 1e-9 {
				t.Errorf("ClaimFor = %+v, want exact %v, allowance %v", c, tc.exact, tc.allowance)
			}
		})
	}
}

// admittedAt is a result of an admitted request of key at ms after start.
func admittedAt(start time.Time, key int, ms int64, latency time.Duration) Result {
	return Result{
		Request:  Request{Key: key},
		Sent:     start.Add(time.Duration(ms) * time.Millisecond),
		Latency:  latency,
		Status:   http.StatusOK,
		ServerMs: start.UnixMilli() + ms,
	}
}

func TestAnalyze(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000) // a window's start
	row := Row{Pattern: Steady2x, Store: "redis", SyncRate: 100 * time.Millisecond}
	var results []Result
	// Window 0: 11 admitted of a limit of 10; window 1: 10 admitted and
	// 5 rejected.
	for i := range 11 {
		results = append(results, admittedAt(start, 0, int64(i*50), 2*time.Millisecond))
	}
	for i := range 10 {
		results = append(results, admittedAt(start, 0, int64(1000+i*50), 2*time.Millisecond))
	}
	for i := range 5 {
		results = append(results, Result{Request: Request{At: time.Duration(1500+i) * time.Millisecond},
			Sent: start.Add(time.Duration(1500+i) * time.Millisecond), Latency: time.Millisecond, Status: http.StatusTooManyRequests})
	}
	for i := range 4 {
		results = append(results, Result{Request: Request{Bare: true}, Sent: start.Add(time.Duration(i) * time.Millisecond),
			Latency: time.Millisecond, Status: http.StatusOK})
	}

	o := Analyze(row, 3, 10, 20, start, results)
	if o.Limited != 26 || o.Admitted != 21 || o.Rejected != 5 || o.Failed != 0 {
		t.Errorf("counts: limited %d admitted %d rejected %d failed %d, want 26 21 5 0", o.Limited, o.Admitted, o.Rejected, o.Failed)
	}
	if o.Worst != 1.1 || o.WorstAdmitted != 11 || !o.WorstWindow.Equal(start) {
		t.Errorf("worst %.2f (%d) at %v, want 1.10 (11) at %v", o.Worst, o.WorstAdmitted, o.WorstWindow, start)
	}
	// Steady 2× of 10 is 20 req/s: the others admit 2·20/3·0.1 = 1.33
	// hits in an interval, so 11 is within the bound.
	if !o.Holds || o.Claim.Exact {
		t.Errorf("claim %+v, holds %v: want the periodic bound, kept", o.Claim, o.Holds)
	}
	if got := o.AddedP50(); got != time.Millisecond {
		t.Errorf("added p50 %v, want 1ms", got)
	}
	if len(o.Series) != 21 || o.Series[10].Admitted != 11 || o.Series[11].Admitted != 1 || o.Series[11].T != time.Second {
		t.Errorf("series: %d points, [10] %+v, [11] %+v", len(o.Series), o.Series[10], o.Series[11])
	}

	// Two more in window 0 are past the bound.
	results = append(results, admittedAt(start, 0, 990, time.Millisecond), admittedAt(start, 0, 995, time.Millisecond))
	if o := Analyze(row, 3, 10, 20, start, results); o.Holds || o.WorstAdmitted != 13 {
		t.Errorf("13 admitted of 10: holds %v, worst %d; want not kept, 13", o.Holds, o.WorstAdmitted)
	}

	// A failed request and a 200 without the node's clock count as failed.
	bad := []Result{{Status: http.StatusBadGateway}, {Status: http.StatusOK}}
	if o := Analyze(row, 3, 10, 20, start, bad); o.Failed != 2 || o.FirstError != "status 502" {
		t.Errorf("failed %d (%q), want 2 (status 502)", o.Failed, o.FirstError)
	}
}

func TestAnalyzeManyKeys(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000)
	row := Row{Pattern: ManyKeys, Store: "redis", SyncRate: 100 * time.Millisecond}
	var results []Result
	for i := range 8 { // key 0: 8 of a limit of 8
		results = append(results, admittedAt(start, 0, int64(i), time.Millisecond))
	}
	for i := range 9 { // key 50, far less popular: 9 of 8 is past its own bound
		results = append(results, admittedAt(start, 50, int64(i), time.Millisecond))
	}
	o := Analyze(row, 3, 8, 80, start, results)
	if o.WorstKey != 50 || o.WorstAdmitted != 9 || o.Holds || o.Breach.Key != 50 || o.Breach.Admitted != 9 {
		t.Errorf("worst key %d (%d), holds %v, breach %+v: want key 50 (9), not kept", o.WorstKey, o.WorstAdmitted, o.Holds, o.Breach)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	if p := Percentile(ds, 0.5); p != 50 {
		t.Errorf("p50 = %v, want 50", p)
	}
	if p := Percentile(ds, 0.99); p != 99 {
		t.Errorf("p99 = %v, want 99", p)
	}
	if p := Percentile(nil, 0.5); p != 0 {
		t.Errorf("p50 of none = %v", p)
	}
	if ds[0] != 100 {
		t.Error("Percentile sorted its input")
	}
}
