package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/window"
)

// Rate is a limit of the generic cell rate algorithm (GCRA), nginx
// limit_req's rate and burst: a key may send 1 + burst requests at once,
// then one every window/rate. A request past that is rejected (nginx's
// nodelay), or, with max_delay, waits for its turn (nginx's default). A
// rejected request does not use a turn. A key's state is one timestamp:
// in a local namespace in the zone, in a synchronous one (sync_rate 0) in
// the store, which decides every request; a periodic namespace refuses a
// rate at load.
type Rate struct {
	// How many requests per window: a positive number (fractions
	// allowed), or in JSON a string of placeholders that give one per
	// request, such as "{plan_rate}". Required.
	Rate float64 `json:"rate"`

	// The window the rate is spread over, such as "1s" or "1m": the rate
	// admits one request every window/rate. It names the key's state:
	// two handlers' rates of one window in one namespace share it.
	// Required.
	Window caddy.Duration `json:"window"`

	// How many more requests than one may come at once: a number of 0 or
	// more, or in JSON a string of placeholders that give one per
	// request. Default: 0.
	Burst float64 `json:"burst,omitempty"`

	// The placeholders of rate and burst, when JSON gave strings: they
	// are read per request (see Limit.Placeholders).
	RatePlaceholders  string `json:"-"`
	BurstPlaceholders string `json:"-"`
}

// UnmarshalJSON reads a rate whose rate and burst are numbers or strings
// of placeholders.
func (r *Rate) UnmarshalJSON(b []byte) error {
	var raw struct {
		Rate   json.RawMessage `json:"rate"`
		Window caddy.Duration  `json:"window"`
		Burst  json.RawMessage `json:"burst"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("rate: %v", err)
	}
	*r = Rate{Window: raw.Window}
	var err error
	if r.Rate, r.RatePlaceholders, err = decodeAmount(raw.Rate, "rate: rate"); err != nil {
		return err
	}
	r.Burst, r.BurstPlaceholders, err = decodeAmount(raw.Burst, "rate: burst")
	return err
}

// MarshalJSON writes numbers as numbers and placeholders as strings.
func (r Rate) MarshalJSON() ([]byte, error) {
	out := struct {
		Rate   any            `json:"rate"`
		Window caddy.Duration `json:"window"`
		Burst  any            `json:"burst,omitempty"`
	}{encodeAmount(r.Rate, r.RatePlaceholders), r.Window, nil}
	if r.Burst != 0 || r.BurstPlaceholders != "" {
		out.Burst = encodeAmount(r.Burst, r.BurstPlaceholders)
	}
	return json.Marshal(out)
}

// UnmarshalJSON reads a limit whose limit is a number or a string of
// placeholders.
func (l *Limit) UnmarshalJSON(b []byte) error {
	var raw struct {
		Limit    json.RawMessage `json:"limit"`
		Window   caddy.Duration  `json:"window"`
		Calendar string          `json:"calendar"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("limits: %v", err)
	}
	*l = Limit{Window: raw.Window, Calendar: raw.Calendar}
	var err error
	l.Limit, l.Placeholders, err = decodeAmount(raw.Limit, "limits: limit")
	return err
}

// MarshalJSON writes the limit as a number, or its placeholders as a
// string.
func (l Limit) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Limit    any            `json:"limit"`
		Window   caddy.Duration `json:"window,omitempty"`
		Calendar string         `json:"calendar,omitempty"`
	}{encodeAmount(l.Limit, l.Placeholders), l.Window, l.Calendar})
}

// decodeAmount reads a JSON number, or a string: placeholders, or a
// number written as a string. Absent, it is 0.
func decodeAmount(raw json.RawMessage, field string) (float64, string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		s = string(raw) // a number, or what parseAmount refuses
	}
	return parseAmount(s, field)
}

// parseAmount reads a count as a Caddyfile or a JSON string gives it:
// placeholders, kept to read per request, or a number.
func parseAmount(s, field string) (float64, string, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "{") {
		return 0, s, nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, "", fmt.Errorf("%s: want a number or placeholders, got %q", field, s)
	}
	return v, "", nil
}

func encodeAmount(v float64, placeholders string) any {
	if placeholders != "" {
		return placeholders
	}
	return v
}

// parseRate reads the arguments of a Caddyfile rate line: <n>/<window>
// [burst <m>].
func parseRate(args []string) (*Rate, error) {
	const want = "rate: want <n>/<window> [burst <m>], such as 'rate 10/1s burst 20'"
	if len(args) != 1 && len(args) != 3 {
		return nil, fmt.Errorf("%s", want)
	}
	slash := strings.LastIndex(args[0], "/")
	if slash < 0 {
		return nil, fmt.Errorf("%s; got %q", want, args[0])
	}
	r := new(Rate)
	var err error
	if r.Rate, r.RatePlaceholders, err = parseAmount(args[0][:slash], "rate"); err != nil {
		return nil, err
	}
	win, err := caddy.ParseDuration(args[0][slash+1:])
	if err != nil || win <= 0 {
		return nil, fmt.Errorf("rate: the window must be a positive duration, got %q", args[0][slash+1:])
	}
	r.Window = caddy.Duration(win)
	if len(args) == 3 {
		if args[1] != "burst" {
			return nil, fmt.Errorf("%s; got %q", want, args[1])
		}
		if r.Burst, r.BurstPlaceholders, err = parseAmount(args[2], "rate: burst"); err != nil {
			return nil, err
		}
	}
	return r, r.check()
}

// check checks the numbers a rate was given; placeholders are checked
// per request.
func (r *Rate) check() error {
	if r.RatePlaceholders == "" && (!(r.Rate > 0) || math.IsInf(r.Rate, 1)) {
		return fmt.Errorf("rate: the rate must be a positive number, got %v (window %v)", r.Rate, time.Duration(r.Window))
	}
	if r.Window <= 0 {
		return fmt.Errorf("rate: the window must be positive, got %v", time.Duration(r.Window))
	}
	if r.BurstPlaceholders == "" && !validCost(r.Burst) {
		return fmt.Errorf("rate: the burst must be a number of 0 or more, got %v", r.Burst)
	}
	return nil
}

// newRateLimit returns the handler's entry of a rate among its limits:
// it is checked first, and headers show it beside the limits, named
// "rate-<Window>" in the draft's fields and Rate-<Window> in Kong's
// headers.
func newRateLimit(namespace string, r *Rate) limit {
	size := time.Duration(r.Window)
	l := namedLimit(namespace, size, "Rate-"+windowName(size), policyName(namespace, "rate-"+windowName(size)))
	l.rate, l.per = true, size.String()
	l.placeholders, l.burstFrom = r.RatePlaceholders, r.BurstPlaceholders
	return l.judged(r.Rate, r.Burst)
}

// judged returns the limit with its count (and a rate's burst) set to
// those a request is judged by, and the header values that show them.
func (l limit) judged(v, burst float64) limit {
	l.max, l.burst = v, burst
	l.limitValue = formatCount(v)
	l.headerLimit = formatCount(math.Floor(v))
	l.limitAsAny = l.limitValue
	l.policy = draftPolicy(l.policyName, v, l.size)
	if l.rate {
		// An extension parameter, which the draft has clients ignore
		// when they do not know it.
		l.policy += ";burst=" + formatCount(math.Floor(burst))
	}
	return l
}

// gcra returns the rate of a rate's entry.
func (l *limit) gcra() window.Rate {
	return window.Rate{Window: l.size, N: l.max, Burst: l.burst}
}

// rateSample carries a rate's state in a window.Sample, so that the
// headers and waits of a request handle the rate and the limits alike:
// Start holds the TAT.
func rateSample(rs window.RateSample, size time.Duration) window.Sample {
	return window.Sample{Start: rs.TAT, At: rs.At, Size: size}
}

func rateSampleOf(s window.Sample) window.RateSample {
	return window.RateSample{TAT: s.Start, At: s.At}
}

// hit counts a request against the plan's rate and limits (see
// syncapp.Namespace.HitRate), into samples, aligned with p.limits, and
// returns the index of the one that rejected it, or -1.
func (h *Handler) hit(ctx context.Context, p *plan, key string, value float64, undo bool, samples []window.Sample) int {
	if !h.rated() {
		return h.ns.Hit(ctx, key, p.hitLimits, value, h.fixed, undo, samples)
	}
	l := &p.limits[0]
	var rs window.RateSample
	ok, rejected := h.ns.HitRate(ctx, key, l.gcra(), value, p.hitLimits, value, h.fixed, undo, samples[1:], &rs)
	samples[0] = rateSample(rs, l.size)
	return planIndex(ok, rejected)
}

// hitIfRoom is hit for a request that may wait for its turn (max_delay):
// it counts nothing unless the rate and every limit admit the request,
// and then says how long until they may.
func (h *Handler) hitIfRoom(ctx context.Context, p *plan, key string, value float64, samples []window.Sample) (rejected int, wait time.Duration) {
	if !h.rated() {
		return h.ns.HitIfRoom(ctx, key, p.hitLimits, value, h.fixed, samples)
	}
	l := &p.limits[0]
	var rs window.RateSample
	ok, rejected, wait := h.ns.HitRateIfRoom(ctx, key, l.gcra(), value, p.hitLimits, value, h.fixed, samples[1:], &rs)
	samples[0] = rateSample(rs, l.size)
	return planIndex(ok, rejected), wait
}

// peek reads what a request of cost value would meet, counting nothing
// (see syncapp.Namespace.Peek): the first of the plan's limits that would
// reject it, or -1, and how long until all would admit it.
func (h *Handler) peek(ctx context.Context, p *plan, key string, value float64, samples []window.Sample) (rejected int, wait time.Duration) {
	if !h.rated() {
		return h.ns.Peek(ctx, key, p.hitLimits, value, h.fixed, samples)
	}
	rejected = -1
	if len(p.hitLimits) > 0 {
		if rejected, wait = h.ns.Peek(ctx, key, p.hitLimits, value, h.fixed, samples[1:]); rejected >= 0 {
			rejected++
		}
	}
	l := &p.limits[0]
	rs := h.ns.PeekRate(key, l.size)
	samples[0] = rateSample(rs, l.size)
	if w := h.admitWait(p, 0, samples[0], value, rs.At); w > 0 {
		rejected, wait = 0, max(wait, w)
	}
	return rejected, wait
}

// afterRate returns a rate's sample as it is once a request of cost
// value, which the rate admits, counts.
func (h *Handler) afterRate(p *plan, s window.Sample, value float64) window.Sample {
	rs := rateSampleOf(s)
	if next, wait := window.Conform(rs.TAT, rs.At, p.limits[0].gcra(), value); wait == 0 {
		rs.TAT = next
	}
	return rateSample(rs, s.Size)
}

// planIndex turns what HitRate says into an index among a plan's limits:
// 0 when the rate rejected, 1+i when limit i did, or -1.
func planIndex(rateOK bool, rejected int) int {
	switch {
	case !rateOK:
		return 0
	case rejected >= 0:
		return rejected + 1
	}
	return -1
}
