package strategytest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// testRate runs the tests of a rate decided alone (a hit of a
// strategy.RateBatcher with a rate and no window) if the store implements
// it. Every decision is checked against the GCRA at the store's own clock
// (RateReply.Now), so the tests hold however slow the machine is.
func testRate(t *testing.T, h Harness) {
	rs, ok := h.open(t).(strategy.RateBatcher)
	if !ok {
		t.Log("the store decides no rates (it is not a strategy.RateBatcher): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Harness, strategy.RateBatcher)
	}{
		{"BurstThenPace", testRateBurstThenPace},
		{"Concurrent", testRateConcurrent},
		{"Cost", testRateCost},
		{"Expiry", testRateExpiry},
		{"RejectsInput", testRateRejectsInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, h, rs) })
	}
}

// rateCase is a store, a context and a namespace of its own.
type rateCase struct {
	t   *testing.T
	s   strategy.RateBatcher
	ctx context.Context
	ns  string
}

func newRateCase(t *testing.T, s strategy.RateBatcher) *rateCase {
	return &rateCase{t: t, s: s, ctx: testContext(t), ns: unique("rate")}
}

// req is a request of cost under a rate of one per interval, with burst
// more at once, over a window of one interval.
func req(interval time.Duration, burst, cost float64) strategy.RateRequest {
	return strategy.RateRequestOf(interval, 1, burst, cost)
}

// decide sends a batch of one hit of key under r, with no window, and
// returns its reply and error.
func (c *rateCase) decide(key string, r strategy.RateRequest) (strategy.RateReply, error) {
	return strategy.RateAsBatch(c.ctx, c.s, c.ns, key, newID(), r)
}

// rate decides a request of key under r, and returns the reply.
func (c *rateCase) rate(key string, r strategy.RateRequest) strategy.RateReply {
	c.t.Helper()
	rep, err := c.decide(key, r)
	if err != nil {
		c.t.Fatalf("rate of key %q: %v", key, err)
	}
	if rep.Now <= 0 || rep.TAT%1000 != 0 || rep.Now%1000 != 0 {
		c.t.Fatalf("rate of key %q: TAT %d and now %d are not Unix nanoseconds in whole microseconds", key, rep.TAT, rep.Now)
	}
	return rep
}

// tat reads key's TAT under window without taking a turn: a request of
// cost 0 is admitted only when the key has its whole burst, and then
// only sets the TAT to the store's now, which means the same.
func (c *rateCase) tat(key string, window time.Duration) int64 {
	c.t.Helper()
	rep := c.rate(key, strategy.RateRequest{Window: window, Tolerance: time.Microsecond})
	return max(rep.TAT, rep.Now)
}

// checkDecision checks a reply against the GCRA from the TAT before it.
func checkDecision(t *testing.T, what string, before int64, r strategy.RateRequest, rep strategy.RateReply) {
	t.Helper()
	due := max(before, rep.Now) + int64(r.Increment)
	wantOK := due-rep.Now <= int64(r.Tolerance)
	wantTAT := before
	if wantOK {
		wantTAT = due
	}
	if rep.OK != wantOK || rep.TAT != wantTAT {
		t.Fatalf("%s: from TAT %d at now %d: got ok %v, TAT %d; want %v, %d", what, before, rep.Now, rep.OK, rep.TAT, wantOK, wantTAT)
	}
}

// testRateBurstThenPace checks that a key gets 1 + burst requests at once
// and then one per interval, every decision matching the GCRA at the
// store's clock, and that rates of two windows are two states.
func testRateBurstThenPace(t *testing.T, h Harness, s strategy.RateBatcher) {
	c := newRateCase(t, s)
	r := req(hour, 4, 1)
	first := c.rate("k", r)
	if !first.OK || first.TAT != first.Now+int64(hour) {
		t.Fatalf("first request: got %+v, want admitted with TAT now+1h", first)
	}
	for i := 2; i <= 5; i++ {
		if rep := c.rate("k", r); !rep.OK || rep.TAT != first.Now+int64(i)*int64(hour) {
			t.Fatalf("request %d of a burst of 4: got %+v, want admitted, TAT %d", i, rep, first.Now+int64(i)*int64(hour))
		}
	}
	if rep := c.rate("k", r); rep.OK || rep.TAT != first.Now+5*int64(hour) {
		t.Fatalf("request 6: got %+v, want refused, TAT unchanged", rep)
	}
	// Another window is another state.
	if rep := c.rate("k", req(2*hour, 0, 1)); !rep.OK {
		t.Fatalf("a rate of another window: got %+v, want admitted", rep)
	}

	// Pace: one per 100ms, burst 0. Requests come as fast as the store
	// answers, for a second of its clock; each decision is checked, and
	// the admitted ones are an interval apart.
	const interval = 100 * time.Millisecond
	r = req(interval, 0, 1)
	rep := c.rate("pace", r)
	if !rep.OK {
		t.Fatalf("first paced request refused: %+v", rep)
	}
	start, tat, admitted := rep.Now, rep.TAT, 1
	for rep.Now < start+int64(time.Second) {
		before := tat
		rep = c.rate("pace", r)
		checkDecision(t, "paced request", before, r, rep)
		if rep.OK {
			admitted++
		}
		tat = rep.TAT
		time.Sleep(5 * time.Millisecond) // not to flood the store
	}
	// Admitted requests are an interval apart by the store's clock
	// (checked above, decision by decision); at least the one after the
	// first interval is admitted, however slowly the store answers.
	if most := 1 + int((rep.Now-start)/int64(interval)); admitted < 2 || admitted > most {
		t.Fatalf("%d requests admitted in %v of the store's clock at one per %v, want 2 to %d", admitted, time.Duration(rep.Now-start), interval, most)
	}
}

// testRateConcurrent checks that of 50 concurrent requests of a key under
// a burst of 4, exactly 5 are admitted.
func testRateConcurrent(t *testing.T, h Harness, s strategy.RateBatcher) {
	c := newRateCase(t, s)
	r := req(hour, 4, 1)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		oks  int
		errs []error
	)
	for range 50 {
		wg.Go(func() {
			rep, err := c.decide("k", r)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if rep.OK {
				oks++
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d concurrent requests failed, the first with %v", len(errs), errs[0])
	}
	if oks != 5 {
		t.Fatalf("%d of 50 concurrent requests admitted under a burst of 4, want 5", oks)
	}
}

// testRateCost checks requests that cost more than one: cost 3 under a
// burst of 4 is admitted once, moving the TAT three intervals, then
// refused; a cost of 6 is never admitted.
func testRateCost(t *testing.T, h Harness, s strategy.RateBatcher) {
	c := newRateCase(t, s)
	rep := c.rate("k", req(hour, 4, 3))
	if !rep.OK || rep.TAT != rep.Now+3*int64(hour) {
		t.Fatalf("cost 3: got %+v, want admitted, TAT now+3h", rep)
	}
	checkDecision(t, "a second cost 3", rep.TAT, req(hour, 4, 3), c.rate("k", req(hour, 4, 3)))
	if rep := c.rate("k", req(hour, 4, 2)); !rep.OK {
		t.Fatalf("cost 2 after cost 3 under a burst of 4: got %+v, want admitted", rep)
	}
	if rep := c.rate("other", req(hour, 4, 6)); rep.OK || rep.TAT > rep.Now {
		t.Fatalf("cost 6 under a burst of 4: got %+v, want refused and no TAT", rep)
	}
}

// testRateExpiry checks that a key whose TAT has passed leaves the store,
// using Harness.Rates, polling the store rather than sleeping a set time.
func testRateExpiry(t *testing.T, h Harness, s strategy.RateBatcher) {
	if h.Rates == nil {
		t.Log("Harness.Rates is nil: the store's rate state is not counted")
		return
	}
	c := newRateCase(t, s)
	// Long enough that the keys outlive the requests and the count on a
	// loaded machine, short enough to expire well within expiryWait.
	r := req(2*time.Second, 1, 1)
	for _, key := range []string{"a", "b", "c"} {
		c.rate(key, r)
		c.rate(key, r)
	}
	if n := h.Rates(t, s, c.ns); n != 3 {
		t.Fatalf("%d rate keys held right after 3 keys' requests, want 3", n)
	}
	poll.Until(t, expiryWait, "the rate keys to expire once their TATs passed", func() bool {
		return h.Rates(t, s, c.ns) == 0
	})
}

// testRateRejectsInput checks that impossible input is refused with
// strategy.ErrRejected, before anything changes.
func testRateRejectsInput(t *testing.T, h Harness, s strategy.RateBatcher) {
	c := newRateCase(t, s)
	good := req(hour, 0, 1)
	for _, tc := range []struct {
		name string
		r    strategy.RateRequest
	}{
		{"window not whole ms", strategy.RateRequest{Window: 1500 * time.Microsecond, Increment: time.Millisecond, Tolerance: time.Millisecond}},
		{"negative increment", strategy.RateRequest{Window: time.Second, Increment: -time.Microsecond, Tolerance: time.Millisecond}},
		{"zero tolerance", strategy.RateRequest{Window: time.Second, Increment: time.Microsecond}},
		{"tolerance not whole µs", strategy.RateRequest{Window: time.Second, Increment: time.Microsecond, Tolerance: 1500}},
		{"tolerance too long", strategy.RateRequest{Window: time.Second, Tolerance: strategy.MaxRateSpan + time.Microsecond}},
	} {
		if _, err := c.decide("k", tc.r); !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("%s: got %v, want an error wrapping strategy.ErrRejected", tc.name, err)
		}
	}
	if rep := c.rate("k", good); !rep.OK {
		t.Fatalf("a good request after refused ones: refused (%+v)", rep)
	}
}
