package ratelimit

import (
	"fmt"
	"slices"
	"time"
	// The time zone database, for machines without one (a scratch or
	// distroless image): timezone names load everywhere, for 450 KB.
	_ "time/tzdata"

	"github.com/ratesync/caddy-ratelimit/window"
)

// loadTimezone loads the calendar windows' time zone: UTC unless
// timezone names one.
func (h *Handler) loadTimezone() error {
	h.loc = time.UTC
	switch h.Timezone {
	case "":
		return nil
	case "Local":
		return fmt.Errorf("timezone: %q is each machine's own zone, which a fleet does not share: want an IANA name such as America/New_York", h.Timezone)
	}
	loc, err := time.LoadLocation(h.Timezone)
	if err != nil {
		return fmt.Errorf("timezone: unknown time zone %q: want an IANA name such as America/New_York (%v)", h.Timezone, err)
	}
	h.loc = loc
	return nil
}

// periodPolicy is a RateLimit-Policy field written for the periods that
// start at starts (one per limit; 0 for limits without a calendar).
type periodPolicy struct {
	starts []int64
	plan   plan
}

// inPeriods returns the plan whose RateLimit-Policy states the length of
// the current period of each calendar window (its w), as samples place
// the request: p itself when it has no calendar window. The handler's own
// plan is rewritten once per period, and kept; a plan read per request
// (tiers) gets its field anew.
func (h *Handler) inPeriods(p *plan, samples []window.Sample) *plan {
	if h.periods == nil {
		return p
	}
	cached := p == &h.static
	if cached {
		if c := h.periods.Load(); c != nil && samePeriods(c.starts, p.limits, samples) {
			return &c.plan
		}
	}
	c := &periodPolicy{starts: make([]int64, len(p.limits)), plan: *p}
	c.plan.limits = slices.Clone(p.limits)
	for i := range c.plan.limits {
		if l := &c.plan.limits[i]; l.calendar {
			c.starts[i] = samples[i].Start
			l.policy = draftPolicy(l.policyName, l.max, samples[i].Length())
		}
	}
	c.plan.policy = h.policyOf(c.plan.limits)
	if cached {
		h.periods.Store(c)
	}
	return &c.plan
}

// samePeriods reports whether samples fall in the periods of starts.
func samePeriods(starts []int64, limits []limit, samples []window.Sample) bool {
	for i := range limits {
		if limits[i].calendar && starts[i] != samples[i].Start {
			return false
		}
	}
	return true
}
