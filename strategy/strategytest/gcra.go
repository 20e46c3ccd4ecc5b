package strategytest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// testRate runs the tests of strategy.Rater if the store implements it.
// Every decision is checked against the GCRA at the store's own clock
// (RateReply.Now), so the tests hold however slow the machine is.
func testRate(t *testing.T, h Harness) {
	rs, ok := h.open(t).(strategy.Rater)
	if !ok {
		t.Log("the store decides no rates (it is not a strategy.Rater): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Harness, strategy.Rater)
	}{
		{"BurstThenPace", testRateBurstThenPace},
		{"Concurrent", testRateConcurrent},
		{"Cost", testRateCost},
		{"ExactlyOnce", testRateExactlyOnce},
		{"GiveBack", testRateGiveBack},
		{"Expiry", testRateExpiry},
		{"RejectsInput", testRateRejectsInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, h, rs) })
	}
}

// rateCase is a store, a context and a namespace of its own.
type rateCase struct {
	t   *testing.T
	s   strategy.Rater
	ctx context.Context
	ns  string
}

func newRateCase(t *testing.T, s strategy.Rater) *rateCase {
	return &rateCase{t: t, s: s, ctx: testContext(t), ns: unique("rate")}
}

// req is a request of cost under a rate of one per interval, with burst
// more at once, over a window of one interval.
func req(interval time.Duration, burst, cost float64) strategy.RateRequest {
	return strategy.RateRequestOf(interval, 1, burst, cost)
}

// rate sends a Rate and returns its reply.
func (c *rateCase) rate(key, id string, r strategy.RateRequest) strategy.RateReply {
	c.t.Helper()
	rep, err := c.s.Rate(c.ctx, c.ns, key, id, r)
	if err != nil {
		c.t.Fatalf("rate of key %q, id %q: %v", key, id, err)
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
	rep := c.rate(key, "", strategy.RateRequest{Window: window, Tolerance: time.Microsecond})
	return max(rep.TAT, rep.Now)
}

// giveBack sends a GiveBack.
func (c *rateCase) giveBack(key, id string, window time.Duration) {
	c.t.Helper()
	if err := c.s.GiveBack(c.ctx, c.ns, key, id, window); err != nil {
		c.t.Fatalf("giving back id %q of key %q: %v", id, key, err)
	}
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
func testRateBurstThenPace(t *testing.T, h Harness, s strategy.Rater) {
	c := newRateCase(t, s)
	r := req(hour, 4, 1)
	first := c.rate("k", "", r)
	if !first.OK || first.TAT != first.Now+int64(hour) {
		t.Fatalf("first request: got %+v, want admitted with TAT now+1h", first)
	}
	for i := 2; i <= 5; i++ {
		if rep := c.rate("k", "", r); !rep.OK || rep.TAT != first.Now+int64(i)*int64(hour) {
			t.Fatalf("request %d of a burst of 4: got %+v, want admitted, TAT %d", i, rep, first.Now+int64(i)*int64(hour))
		}
	}
	if rep := c.rate("k", "", r); rep.OK || rep.TAT != first.Now+5*int64(hour) {
		t.Fatalf("request 6: got %+v, want refused, TAT unchanged", rep)
	}
	// Another window is another state.
	if rep := c.rate("k", "", req(2*hour, 0, 1)); !rep.OK {
		t.Fatalf("a rate of another window: got %+v, want admitted", rep)
	}

	// Pace: one per 100ms, burst 0. Requests come as fast as the store
	// answers, for a second of its clock; each decision is checked, and
	// the admitted ones are an interval apart.
	const interval = 100 * time.Millisecond
	r = req(interval, 0, 1)
	rep := c.rate("pace", "", r)
	if !rep.OK {
		t.Fatalf("first paced request refused: %+v", rep)
	}
	start, tat, admitted := rep.Now, rep.TAT, 1
	for rep.Now < start+int64(time.Second) {
		before := tat
		rep = c.rate("pace", "", r)
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
func testRateConcurrent(t *testing.T, h Harness, s strategy.Rater) {
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
			rep, err := s.Rate(c.ctx, c.ns, "k", newID(), r)
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
func testRateCost(t *testing.T, h Harness, s strategy.Rater) {
	c := newRateCase(t, s)
	rep := c.rate("k", "", req(hour, 4, 3))
	if !rep.OK || rep.TAT != rep.Now+3*int64(hour) {
		t.Fatalf("cost 3: got %+v, want admitted, TAT now+3h", rep)
	}
	checkDecision(t, "a second cost 3", rep.TAT, req(hour, 4, 3), c.rate("k", "", req(hour, 4, 3)))
	if rep := c.rate("k", "", req(hour, 4, 2)); !rep.OK {
		t.Fatalf("cost 2 after cost 3 under a burst of 4: got %+v, want admitted", rep)
	}
	if rep := c.rate("other", "", req(hour, 4, 6)); rep.OK || rep.TAT > rep.Now {
		t.Fatalf("cost 6 under a burst of 4: got %+v, want refused and no TAT", rep)
	}
}

// testRateExactlyOnce checks the IDs: a Rate resent under its ID takes no
// second turn and answers as the first did; a forced resend of a refused
// ID takes its turn, once.
func testRateExactlyOnce(t *testing.T, h Harness, s strategy.Rater) {
	c := newRateCase(t, s)
	r := req(hour, 1, 1)
	a := c.rate("k", "a", r)
	if again := c.rate("k", "a", r); !again.OK || again.TAT != a.TAT {
		t.Fatalf("resent id a: got %+v, want admitted, TAT %d unchanged", again, a.TAT)
	}
	c.rate("k", "b", r) // the burst's second
	refused := c.rate("k", "c", r)
	if refused.OK {
		t.Fatalf("third request under a burst of 1: admitted")
	}
	if again := c.rate("k", "c", r); again.OK || again.TAT != refused.TAT {
		t.Fatalf("resent refused id c: got %+v, want refused, TAT unchanged", again)
	}
	forced := r
	forced.Force = true
	if rep := c.rate("k", "c", forced); !rep.OK || rep.TAT != refused.TAT+int64(hour) {
		t.Fatalf("forced id c: got %+v, want admitted, TAT %d", rep, refused.TAT+int64(hour))
	}
	if rep := c.rate("k", "c", forced); !rep.OK || rep.TAT != refused.TAT+int64(hour) {
		t.Fatalf("forced id c again: got %+v, want admitted once, TAT %d", rep, refused.TAT+int64(hour))
	}
	if rep := c.rate("k", "d", forced); !rep.OK || rep.TAT != refused.TAT+2*int64(hour) {
		t.Fatalf("forced new id d over the burst: got %+v, want admitted, TAT %d", rep, refused.TAT+2*int64(hour))
	}
}

// testRateGiveBack checks that a turn given back is free again, once
// however often it is given back, and that an ID given back before its
// Rate reaches the store takes no turn.
func testRateGiveBack(t *testing.T, h Harness, s strategy.Rater) {
	c := newRateCase(t, s)
	r := req(hour, 2, 1)
	c.rate("k", "a", r)
	b := c.rate("k", "b", r)
	c.giveBack("k", "a", hour)
	c.giveBack("k", "a", hour)
	if got := c.tat("k", hour); got != b.TAT-int64(hour) {
		t.Fatalf("TAT after giving a back (twice): %d, want %d", got, b.TAT-int64(hour))
	}
	if rep := c.rate("k", "a", r); rep.OK || rep.TAT != b.TAT-int64(hour) {
		t.Fatalf("resending id a after its give-back: got %+v, want refused, TAT unchanged", rep)
	}
	// Two more fit: the one given back, and the burst's third.
	for _, id := range []string{"c", "d"} {
		if rep := c.rate("k", id, r); !rep.OK {
			t.Fatalf("id %s after a give-back: refused (%+v)", id, rep)
		}
	}
	if rep := c.rate("k", "e", r); rep.OK {
		t.Fatalf("id e past the burst: admitted (%+v)", rep)
	}
	// Given back before it arrives: it never takes a turn, forced or not.
	c.giveBack("new", "late", hour)
	forced := r
	forced.Force = true
	if rep := c.rate("new", "late", forced); rep.OK || rep.TAT > rep.Now {
		t.Fatalf("a Rate that arrives after its give-back: got %+v, want refused, no TAT", rep)
	}
	// Giving back what a refused request never took changes nothing.
	before := c.tat("k", hour)
	c.giveBack("k", "e", hour)
	if got := c.tat("k", hour); got != before {
		t.Fatalf("giving back a refused id moved the TAT from %d to %d", before, got)
	}
}

// testRateExpiry checks that a key whose TAT has passed leaves the store,
// using Harness.Rates, polling the store rather than sleeping a set time.
func testRateExpiry(t *testing.T, h Harness, s strategy.Rater) {
	if h.Rates == nil {
		t.Log("Harness.Rates is nil: the store's rate state is not counted")
		return
	}
	c := newRateCase(t, s)
	// Long enough that the keys outlive the requests and the count on a
	// loaded machine, short enough to expire well within expiryWait.
	r := req(2*time.Second, 1, 1)
	for _, key := range []string{"a", "b", "c"} {
		c.rate(key, "", r)
		c.rate(key, "", r)
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
func testRateRejectsInput(t *testing.T, h Harness, s strategy.Rater) {
	c := newRateCase(t, s)
	good := req(hour, 0, 1)
	for _, tc := range []struct {
		name string
		id   string
		r    strategy.RateRequest
	}{
		{"window not whole ms", "", strategy.RateRequest{Window: 1500 * time.Microsecond, Increment: time.Millisecond, Tolerance: time.Millisecond}},
		{"negative increment", "", strategy.RateRequest{Window: time.Second, Increment: -time.Microsecond, Tolerance: time.Millisecond}},
		{"zero tolerance", "", strategy.RateRequest{Window: time.Second, Increment: time.Microsecond}},
		{"tolerance not whole µs", "", strategy.RateRequest{Window: time.Second, Increment: time.Microsecond, Tolerance: 1500}},
		{"tolerance too long", "", strategy.RateRequest{Window: time.Second, Tolerance: strategy.MaxRateSpan + time.Microsecond}},
		{"id too long", strings.Repeat("x", strategy.MaxIDLen+1), good},
	} {
		if _, err := s.Rate(c.ctx, c.ns, "k", tc.id, tc.r); !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("%s: got %v, want an error wrapping strategy.ErrRejected", tc.name, err)
		}
	}
	if err := s.GiveBack(c.ctx, c.ns, "k", "", hour); !errors.Is(err, strategy.ErrRejected) {
		t.Errorf("give-back without an id: got %v, want an error wrapping strategy.ErrRejected", err)
	}
	if rep := c.rate("k", "", good); !rep.OK {
		t.Fatalf("a good request after refused ones: refused (%+v)", rep)
	}
}
