package syncapp

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// The rate of the fleet's rate tests, as the handler's TestRateBurst:
// rate 10/1s burst 5, 6 at once, then one per 100ms.
var fleetRate = Rate{Window: time.Second, N: 10, Burst: 5}

const fleetInterval = 100 * time.Millisecond

// rateFleet starts three nodes in synchronous mode on the store, each
// connected.
func rateFleet(t *testing.T, s fleetStore) []*Namespace {
	nodes := synchronousNodes(t, s, 3)
	for _, ns := range nodes {
		if err := ns.CheckRate(time.Second); err != nil {
			t.Fatal(err)
		}
	}
	return nodes
}

// TestFleetRateBurstThenPace: three nodes at sync_rate 0 share rate 10/1s
// burst 5 of a key: of 20 simultaneous requests spread over them exactly
// 6 are admitted (when the 20 took less than an interval; a loaded
// machine plays the round again), then about one per 100ms, bounded by
// the client's timings as checkBurstThenPace does over HTTP.
func TestFleetRateBurstThenPace(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := rateFleet(t, s)
		var seq atomic.Int64
		hit := func(key string) bool {
			ns := nodes[seq.Add(1)%3]
			var rs RateSample
			ok, rejected := ns.HitRate(context.Background(), key, fleetRate, 1, nil, 1, false, false, nil, &rs)
			return ok && rejected < 0
		}
		var key string
		var burstStart, burstEnd time.Time
		for round := 1; ; round++ {
			key = fmt.Sprintf("burst-%d", round)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			burstStart = time.Now()
			for range 20 {
				wg.Go(func() {
					if hit(key) {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
			burstEnd = time.Now()
			took, ok := burstEnd.Sub(burstStart), int(admitted.Load())
			if most := 6 + int(took/fleetInterval); ok < 6 || ok > most {
				t.Fatalf("20 simultaneous over 3 nodes in %v: %d admitted, want 6 (at most %d in that time)", took, ok, most)
			}
			if ok == 6 {
				t.Logf("round %d: 20 simultaneous over 3 nodes in %v: 6 admitted", round, took.Round(time.Millisecond))
				break
			}
			if round == 5 {
				t.Fatalf("in 5 rounds the 20 requests never came within one interval: last %v, %d admitted", took, ok)
			}
		}
		admitted := 6
		var lastSend, lastRecv time.Time
		for {
			lastSend = time.Now()
			ok := hit(key)
			lastRecv = time.Now()
			if ok {
				admitted++
				continue
			}
			if lastSend.Sub(burstEnd) >= time.Second {
				break
			}
			time.Sleep(5 * time.Millisecond) // a poll, not a wait for the interval
		}
		most := 6 + int(lastRecv.Sub(burstStart)/fleetInterval)
		least := 6 + int(lastSend.Sub(burstEnd)/fleetInterval) - 1 // the store's clock may lag the client's by a hair
		t.Logf("%d admitted in %v after the burst's start (between %d and %d by the timings)", admitted,
			lastRecv.Sub(burstStart).Round(time.Millisecond), least, most)
		if admitted > most || admitted < least {
			t.Errorf("%d admitted by %v after the burst started, want %d to %d: not one per %v",
				admitted, lastRecv.Sub(burstStart), least, most, fleetInterval)
		}
	})
}

// TestFleetRateMaxDelay: three nodes at sync_rate 0, 15 simultaneous
// requests of a key under rate 10/1s burst 5 that wait for their turn (as
// the handler does with max_delay 2s: HitRateIfRoom, then the wait it
// says) are all served: 6 at once, then one per 100ms by the store's
// clock, each admission at least its turns after the 6th (less a jitter
// for the client recording them).
func TestFleetRateMaxDelay(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := rateFleet(t, s)
		var mu sync.Mutex
		var at []time.Time
		var wg sync.WaitGroup
		start := time.Now()
		for i := range 15 {
			wg.Go(func() {
				ns := nodes[i%3]
				deadline := time.Now().Add(2 * time.Second)
				for {
					var rs RateSample
					ok, rejected, wait := ns.HitRateIfRoom(context.Background(), "k", fleetRate, 1, nil, 1, false, nil, &rs)
					if ok && rejected < 0 {
						mu.Lock()
						at = append(at, time.Now())
						mu.Unlock()
						return
					}
					if wait < 0 || time.Until(deadline) < wait {
						t.Errorf("request %d gave up: wait %v", i, wait)
						return
					}
					time.Sleep(wait) // the turn the rate gave, as the handler's timer
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
		if len(at) != 15 {
			t.Fatalf("%d of 15 served", len(at))
		}
		t.Logf("15 served over 3 nodes in %v", took.Round(time.Millisecond))
		if took < 9*fleetInterval {
			t.Errorf("15 served in %v: the last 9 must take their turns, at least %v", took, 9*fleetInterval)
		}
		const recordJitter = 50 * time.Millisecond
		for i := 6; i < len(at); i++ {
			if d, want := at[i].Sub(at[5]), time.Duration(i-5)*fleetInterval-recordJitter; d < want {
				t.Errorf("admission %d came %v after the 6th, want at least %v", i+1, d, want)
			}
		}
	})
}

// TestRateGivesBackWhenALimitRejects: in a synchronous namespace, a
// request that the rate admits and a limit rejects gives its turn back at
// the store: under a burst of 2 and a limit of 1 per hour, the rate still
// admits 3 requests after the limit's one.
func TestRateGivesBackWhenALimitRejects(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		ns := rateFleet(t, s)[0]
		r := Rate{Window: time.Hour, N: 1, Burst: 2}
		limits := []Limit{{Size: time.Hour, Max: 1}}
		out := make([]window.Sample, 1)
		var rs RateSample
		hit := func(limits []Limit) (bool, int) {
			return ns.HitRate(context.Background(), "k", r, 1, limits, 1, false, true, out[:len(limits)], &rs)
		}
		if ok, rejected := hit(limits); !ok || rejected != -1 {
			t.Fatalf("first: rate %v, rejected %d; want admitted", ok, rejected)
		}
		for i := range 3 {
			if ok, rejected := hit(limits); !ok || rejected != 0 {
				t.Fatalf("request %d: rate %v, rejected %d; want the limit to reject", i+2, ok, rejected)
			}
		}
		for i := range 2 {
			if ok, _ := hit(nil); !ok {
				t.Fatalf("rate alone, request %d: refused: the turns were not given back", i+1)
			}
		}
		if ok, _ := hit(nil); ok {
			t.Fatal("a 4th turn under a burst of 2: admitted")
		}
	})
}
