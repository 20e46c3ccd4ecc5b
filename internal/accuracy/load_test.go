package accuracy

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

func TestSchedule(t *testing.T) {
	reqs := Schedule(Steady2x, 3, 200, 3*time.Second, 1)
	var limited, bare int
	perNode := map[int]int{}
	for i, r := range reqs {
		if i > 0 && r.At < reqs[i-1].At {
			t.Fatalf("request %d at %v before its predecessor's %v", i, r.At, reqs[i-1].At)
		}
		if r.Bare {
			bare++
			continue
		}
		if r.Node != limited%3 {
			t.Fatalf("limited request %d to node %d, want round-robin %d", limited, r.Node, limited%3)
		}
		limited++
		perNode[r.Node]++
	}
	if limited != 1200 || bare != 1200/BareEvery {
		t.Errorf("%d limited, %d bare; want 2·200/s·3s = 1200 and %d", limited, bare, 1200/BareEvery)
	}
	if last := reqs[len(reqs)-1].At; last >= 3*time.Second {
		t.Errorf("last request at %v, past the run", last)
	}

	burst := Schedule(Burst10x, 3, 200, 3*time.Second, 1)
	if burst[0].At != 250*time.Millisecond || burst[len(burst)-1].At >= 1250*time.Millisecond {
		t.Errorf("burst from %v to %v, want within [250ms, 1.25s)", burst[0].At, burst[len(burst)-1].At)
	}
}

func TestScheduleManyKeys(t *testing.T) {
	reqs := Schedule(ManyKeys, 3, 200, 3*time.Second, 1)
	counts := map[int]int{}
	n := 0
	for _, r := range reqs {
		if !r.Bare {
			counts[r.Key]++
			n++
		}
	}
	// The same seed sends the same keys.
	again := Schedule(ManyKeys, 3, 200, 3*time.Second, 1)
	for i := range reqs {
		if reqs[i] != again[i] {
			t.Fatalf("request %d differs between two schedules of one seed", i)
		}
	}
	for _, key := range []int{0, 1, 2} {
		want := KeyShare(ManyKeys, key) * float64(n)
		if got := float64(counts[key]); math.Abs(got-want) > 4*math.Sqrt(want) {
			t.Errorf("key %d: %v requests, want about %.0f", key, got, want)
		}
	}
	var sum float64
	for k := range ManyKeys.Keys {
		sum += KeyShare(ManyKeys, k)
	}
	if math.Abs(sum-1) > 1e-9 {
		t.Errorf("shares sum to %v", sum)
	}
	// The hottest key gets about 2.3 times its limit: its share of twice
	// the limit's rate, over a fifth of the limit.
	if r := KeyShare(ManyKeys, 0) * ManyKeys.Rate * ManyKeys.LimitDiv; r < 2.2 || r > 2.5 {
		t.Errorf("the hottest key gets %.2f × its limit", r)
	}
}

// A key flood gives each limited request a key of its own.
func TestScheduleKeyFlood(t *testing.T) {
	reqs := Schedule(KeyFlood, 3, 200, 3*time.Second, 1)
	seen := map[int]bool{}
	for _, r := range reqs {
		if r.Bare {
			continue
		}
		if seen[r.Key] {
			t.Fatalf("key %d sent twice", r.Key)
		}
		seen[r.Key] = true
	}
	if want := int(KeyFlood.Rate * 200 * 3); len(seen) != want {
		t.Errorf("%d keys, want %d: one per request", len(seen), want)
	}
}

func TestSend(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		switch {
		case r.URL.Path == BarePath:
			w.Header().Set(TimeHeader, "1")
		case r.Header.Get(KeyHeader) == "rejected":
			http.Error(w, "no", http.StatusTooManyRequests)
			return
		default:
			w.Header().Set(TimeHeader, strconv.FormatInt(time.Now().UnixMilli(), 10))
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	client := NewClient()
	defer client.CloseIdleConnections()

	target := Target{Nodes: []string{srv.URL, srv.URL}, Path: OnePath, Keys: []string{"a", "rejected"}}
	reqs := []Request{
		{At: 0, Node: 0, Key: 0},
		{At: 20 * time.Millisecond, Node: 1, Key: 1},
		{At: 40 * time.Millisecond, Node: 1, Bare: true},
	}
	start := time.Now().Add(10 * time.Millisecond)
	res := Send(t.Context(), client, target, start, reqs)
	if len(res) != 3 || calls.Load() != 3 {
		t.Fatalf("%d results, %d calls; want 3", len(res), calls.Load())
	}
	if res[0].Status != http.StatusOK || res[0].ServerMs == 0 {
		t.Errorf("admitted: %+v", res[0])
	}
	if res[1].Status != http.StatusTooManyRequests || res[1].ServerMs != 0 {
		t.Errorf("rejected: %+v", res[1])
	}
	for i, r := range res {
		if r.Sent.Before(start.Add(r.At)) {
			t.Errorf("request %d sent at %v, before its time %v", i, r.Sent, start.Add(r.At))
		}
		if r.Latency <= 0 {
			t.Errorf("request %d: latency %v", i, r.Latency)
		}
	}
}
