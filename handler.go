package ratelimit

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/syncapp"
	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults of the handler's fields.
const (
	// DefaultKey counts requests by the client's address as Caddy sees
	// it: the address the request came from, or behind the server's
	// trusted_proxies, the one they forwarded ({client_ip} in a
	// Caddyfile).
	DefaultKey = "{http.vars.client_ip}"
	// DefaultErrorCode is the status of rejections.
	DefaultErrorCode = http.StatusTooManyRequests
	// DefaultMaxWaiting is max_waiting when max_delay is set.
	DefaultMaxWaiting = 1000
)

// Handler limits the rate of requests per key, in one namespace of the
// rate_limit app. Each request is a hit on every limit, in ascending window
// order: a limit's window is incremented, then its rate compared with the
// limit (rate > limit rejects); once one limit rejects, the windows after
// it are only read. A rejected request ends with a Caddy HTTP error
// (error_code, 429 by default) that handle_errors can shape, and a
// Retry-After header.
//
// What responses carry besides Retry-After is chosen by headers: by
// default the IETF draft's structured fields RateLimit-Policy (every limit,
// and max_concurrent, as a policy) and RateLimit (the state of one policy:
// the one that rejected the request, or else the limit with the least
// remaining, ties to the larger window); with "kong", for each limit
// X-RateLimit-Limit-<Window> and X-RateLimit-Remaining-<Window> (Second,
// Minute, Hour, Day, Month, Year, or else the window in seconds), and
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset for that same
// limit. The reset (RateLimit's t, RateLimit-Reset) is computed from the
// client's own counts: when a request of the same cost would be rejected,
// the seconds until it would be admitted; otherwise the seconds until one
// more hit's worth of its quota comes back. Retry-After, on a rejection, is
// the seconds until a request of the same cost is admitted: every limit
// has room for it, the key's ban (if any) has ended, at least 1, plus up
// to retry_after_jitter; it is never less than the t of the policy the
// same response names.
//
// These placeholders are set for handle_errors, logs and later handlers:
//
// Placeholder | Description
// ------------|-------------
// `{http.rate_limit.namespace}` | The namespace counted in
// `{http.rate_limit.exceeded}` | Whether a limit rejected the request (also in dry_run)
// `{http.rate_limit.window}` | The window of the limit that rejected it, or of the limit with the least remaining
// `{http.rate_limit.limit}` | That limit, as configured (fractions included)
// `{http.rate_limit.remaining}` | Requests left in that limit
// `{http.rate_limit.reset}` | Seconds until that limit's reset, as in RateLimit-Reset
// `{http.rate_limit.policy}` | The name of the policy the RateLimit field names (the concurrency policy on a max_concurrent rejection), as a client parsing the field reads it
type Handler struct {
	// The namespace of the rate_limit app to count in. The namespace
	// "default" always exists, local only; any other must be declared in
	// the rate_limit global option (or the app's JSON). Default: "default".
	Namespace string `json:"namespace,omitempty"`

	// The key to count requests by, with placeholders, e.g.
	// "{http.request.header.X-API-Key}". Default: the client's address as
	// Caddy sees it, "{http.vars.client_ip}" ("{client_ip}" works too),
	// which honours the server's trusted_proxies. A request whose key
	// renders empty, and whose fallbacks do too, is counted under the
	// empty key, one counter for all such requests.
	Key string `json:"key,omitempty"`

	// Keys to try in order when Key renders empty: the first that renders
	// non-empty is the request's key. E.g. an API key, else the client's
	// address: key "{http.request.header.X-API-Key}", key_fallbacks
	// ["{http.vars.client_ip}"]. Only with a Key.
	KeyFallbacks []string `json:"key_fallbacks,omitempty"`

	// A key that is an IPv4 address is counted under its network of this
	// many bits: 1 to 32. Default: 32, the address itself.
	IPv4Prefix int `json:"ipv4_prefix,omitempty"`

	// A key that is an IPv6 address is counted under its network of this
	// many bits, written as a prefix ("2001:db8:1:2::/64"): 1 to 128.
	// Default: 64, the network an ISP hands one customer, so that a client
	// cycling through the addresses of its /64 is one client.
	IPv6Prefix int `json:"ipv6_prefix,omitempty"`

	// The limits. Each window may appear once. A handler needs at least
	// one limit or a rate.
	Limits []Limit `json:"limits,omitempty"`

	// The time zone of the calendar windows (a limit's calendar: day,
	// week, month): an IANA name such as "America/New_York", whose
	// changes to and from daylight saving time move the boundaries with
	// the local clock. Default: "UTC". Only with a calendar window.
	Timezone string `json:"timezone,omitempty"`

	// A rate (GCRA, nginx limit_req's rate and burst), checked before the
	// limits: a request must pass both. See Rate.
	Rate *Rate `json:"rate,omitempty"`

	// "sliding" (default) weighs the previous window's count by how much of
	// it still overlaps the sliding window; "fixed" counts the current
	// window only.
	WindowType string `json:"window_type,omitempty"`

	// If true, rejected requests do not count.
	DisablePenalty bool `json:"disable_penalty,omitempty"`

	// The rate limit headers responses carry: "draft", the IETF draft's
	// structured fields RateLimit-Policy and RateLimit
	// (draft-ietf-httpapi-ratelimit-headers-11); "kong", Kong's
	// X-RateLimit-Limit-<Window>, X-RateLimit-Remaining-<Window>,
	// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset; both:
	// ["draft", "kong"], or ["both"]; or ["none"]. Retry-After is sent on every
	// rejection whatever this says. Policy names are the namespace and
	// the window's name joined by "-" (such as "api-Minute"), with every
	// byte that is not printable ASCII, and %, " and \, percent-encoded
	// as %xx in lowercase hex (a namespace "café" gives
	// "caf%c3%a9-Minute"), so that the name is the same in the field and
	// in the {http.rate_limit.policy} placeholder. Kong's headers are
	// Integers: a fractional limit is shown rounded down, as is what
	// remains. Default: ["draft"].
	Headers []string `json:"headers,omitempty"`

	// An older spelling of headers ["none"]: if true, responses carry no
	// rate limit headers (Retry-After is still set on rejections).
	HideClientHeaders bool `json:"hide_client_headers,omitempty"`

	// An older spelling that adds "draft" to headers.
	DraftHeaders bool `json:"draft_headers,omitempty"`

	// The most random time added to Retry-After, so that rejected clients
	// do not all come back at once. Default: 0.
	RetryAfterJitter caddy.Duration `json:"retry_after_jitter,omitempty"`

	// The status code of rejections, 400 to 599. Default: 429.
	ErrorCode int `json:"error_code,omitempty"`

	// If true, requests are counted and headers set, but none is rejected:
	// a way to try limits on live traffic.
	DryRun bool `json:"dry_run,omitempty"`

	// The most requests of one key in flight at once; the next one is
	// rejected with error_code and Retry-After: 1. In a local namespace
	// they are counted on this node; in a namespace with a store, across
	// the fleet, as slots in the store that a node holds as leases (the
	// slots of a node that dies come back within 30s). A request the rate
	// limits admit takes a place; one they reject takes none. 0 (default):
	// no limit.
	MaxConcurrent int `json:"max_concurrent,omitempty"`

	// How long a request that a limit would reject may wait for its key's
	// rate to admit it instead; it is then counted and served. A request
	// whose turn is further away, or that finds max_waiting requests of
	// the handler waiting, is rejected at once. A client that goes away
	// stops waiting and is not counted. 0 (default): no waiting. Has no
	// effect in a dry run.
	MaxDelay caddy.Duration `json:"max_delay,omitempty"`

	// The most requests of this handler waiting at once under max_delay.
	// Default: 1000 when max_delay is set.
	MaxWaiting int `json:"max_waiting,omitempty"`

	// How many hits each request counts as: a number (fractions allowed),
	// or placeholders that give one, such as
	// "{http.request.header.X-Cost}". A value the placeholders give that
	// is not a non-negative number counts as 1, and is logged at debug
	// level. Default: 1.
	Cost caddyhttp.WeakString `json:"cost,omitempty"`

	// What each admitted request counts, read after its response: a
	// number, or placeholders that give one then, such as a header the
	// upstream set, "{http.response.header.X-Units}" (a budget of tokens,
	// bytes or rows). The request is admitted while every limit has room
	// for Cost (default 1), checked before it runs without counting it,
	// and is charged this in full once its response is written, even
	// past a limit: with many requests in flight the count can pass a
	// limit by what they cost beyond the room each one found. A value
	// that is not a number of 0 or more charges Cost (logged at debug
	// level). With count_status, only the responses of those statuses
	// are charged. Not with max_delay or a rate.
	ResponseCost caddyhttp.WeakString `json:"response_cost,omitempty"`

	// If set, only requests whose response has one of these statuses
	// count, such as 401 for failed logins: the limits are checked before
	// the request without counting it, and it is counted after its
	// response (the status it was written with, or else the status of
	// the error it ended with). A request the limits reject is rejected as
	// usual, and counts only if error_code is among these statuses (and
	// disable_penalty is not set). The headers of an admitted request,
	// set before its status is known, show the counts as they are once it
	// counts, as for any other request.
	CountStatus []int `json:"count_status,omitempty"`

	// Once a limit rejects a key, every request of the key is rejected
	// for this long, whatever its rate (outcome banned), with Retry-After
	// (and the reset of the headers) giving when a request is admitted:
	// the ban's end, or later when the counts that started it still
	// reject then, so that a client that obeys it is not banned again.
	// In a namespace whose store can hold bans (Redis, PostgreSQL), across
	// the fleet: the other nodes learn of the ban at their next sync and
	// reject the key without a round trip. A reset of the key (admin API)
	// lifts it. At most 366 days. 0 (default): no ban. Has no effect in a
	// dry run.
	Ban caddy.Duration `json:"ban,omitempty"`

	ns  *syncapp.Namespace
	key func(*http.Request, *caddy.Replacer) string
	// static is what requests are judged by (tiers.go): the rate, if any,
	// at index 0 of its limits (first is then 1), then the limits; unless
	// isDynamic, when some count is read per request.
	static    plan
	first     int
	isDynamic bool
	// When a request whose limits did not resolve was last logged, in
	// Unix nanoseconds.
	unresolvedLog *atomic.Int64
	fixed         bool
	// loc is the calendar windows' time zone; periods, nil without a
	// calendar window, caches the RateLimit-Policy of the static plan's
	// current periods (calendar.go).
	loc     *time.Location
	periods *atomic.Pointer[periodPolicy]
	// What headers responses carry: the draft's fields, Kong's headers.
	draft, kong bool
	// The concurrency policy's name in the draft's fields.
	concurrencyName string
	outcomes        outcomeCounters
	// newBlock allocates what a request that shows headers keeps: see
	// blockFor.
	newBlock func() (*placeholders, []string, []byte)
	// cost is what a request counts, unless costFromRequest: then the
	// placeholders of Cost give it.
	cost            float64
	costFromRequest bool
	// undo: a rejected first hit counts nothing, since the request may
	// wait (max_delay) or must not count (disable_penalty).
	undo bool
	// What max_delay needs: the requests waiting now, and how long those
	// served after waiting waited.
	waiting *atomic.Int64
	delays  prometheus.Observer
	logger  *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults, checks the config, finds the namespace in the
// rate_limit app and merges the handler's windows into it.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.Namespace == "" {
		h.Namespace = syncapp.DefaultName
	}
	if h.Key == "" {
		if len(h.KeyFallbacks) > 0 {
			return fmt.Errorf("key_fallbacks: %q without a key: the default key, the client's address, is never empty, so no fallback would be used", h.KeyFallbacks)
		}
		h.Key = DefaultKey
	}
	if h.ErrorCode == 0 {
		h.ErrorCode = DefaultErrorCode
	}
	if h.MaxDelay > 0 && h.MaxWaiting == 0 {
		h.MaxWaiting = DefaultMaxWaiting
	}
	if err := h.validate(); err != nil {
		return err
	}
	appIface, err := ctx.App("rate_limit")
	if err != nil {
		return fmt.Errorf("getting rate_limit app: %v", err)
	}
	ns, err := appIface.(*syncapp.App).Namespace(h.Namespace)
	if err != nil {
		return fmt.Errorf("namespace: %v", err)
	}
	h.ns = ns
	h.key = clientKeys(append([]string{h.Key}, h.KeyFallbacks...), h.IPv4Prefix, h.IPv6Prefix)
	for _, l := range h.static.hitLimits {
		if err := ns.AddWindowSizes(l.Size); err != nil {
			return fmt.Errorf("limits: %v", err)
		}
	}
	if h.rated() {
		if err := ns.CheckRate(time.Duration(h.Rate.Window)); err != nil {
			return fmt.Errorf("rate: %v", err)
		}
	}
	h.unresolvedLog = new(atomic.Int64)
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	h.outcomes = newOutcomeCounters(h.Namespace)
	h.delays = metrics.delays.WithLabelValues(h.Namespace)
	h.waiting = new(atomic.Int64)
	h.undo = h.DisablePenalty || h.waits()
	if h.Ban > 0 {
		ns.UseBans()
	}
	if h.MaxConcurrent > 0 {
		if err := ns.CheckConcurrency(); err != nil {
			return fmt.Errorf("max_concurrent: %v", err)
		}
	}
	return nil
}

// validate checks every field and prepares the limits (see preparePlan).
func (h *Handler) validate() error {
	switch h.WindowType {
	case "", "sliding":
	case "fixed":
		h.fixed = true
	default:
		return fmt.Errorf("window_type: unknown window type %q: want sliding or fixed", h.WindowType)
	}
	if h.ErrorCode < 400 || h.ErrorCode > 599 {
		return fmt.Errorf("error_code: %d is not an error status: want 400 to 599", h.ErrorCode)
	}
	for _, f := range []struct {
		name     string
		value    any
		negative bool
	}{
		{"max_concurrent", h.MaxConcurrent, h.MaxConcurrent < 0},
		{"max_delay", time.Duration(h.MaxDelay), h.MaxDelay < 0},
		{"max_waiting", h.MaxWaiting, h.MaxWaiting < 0},
		{"ban", time.Duration(h.Ban), h.Ban < 0},
		{"retry_after_jitter", time.Duration(h.RetryAfterJitter), h.RetryAfterJitter < 0},
	} {
		if f.negative {
			return fmt.Errorf("%s: must not be negative, got %v", f.name, f.value)
		}
	}
	if h.MaxWaiting > 0 && h.MaxDelay == 0 {
		return fmt.Errorf("max_waiting: %d has no effect without max_delay", h.MaxWaiting)
	}
	if i := slices.Index(h.KeyFallbacks, ""); i >= 0 {
		return fmt.Errorf("key_fallbacks: fallback %d is empty: want placeholders, such as {http.vars.client_ip}", i+1)
	}
	if h.IPv4Prefix == 0 {
		h.IPv4Prefix = DefaultIPv4Prefix
	}
	if h.IPv6Prefix == 0 {
		h.IPv6Prefix = DefaultIPv6Prefix
	}
	if err := checkPrefix("ipv4_prefix", h.IPv4Prefix, 32); err != nil {
		return err
	}
	if err := checkPrefix("ipv6_prefix", h.IPv6Prefix, 128); err != nil {
		return err
	}
	if time.Duration(h.Ban) > strategy.MaxBanLength {
		return fmt.Errorf("ban: %v is longer than a store keeps a ban, %v", time.Duration(h.Ban), strategy.MaxBanLength)
	}
	if err := h.checkCosts(); err != nil {
		return err
	}
	if err := h.parseHeaders(); err != nil {
		return err
	}
	return h.preparePlan()
}

// preparePlan checks the limits and the rate, and prepares the plan
// requests are judged by: the rate first, then the limits in ascending
// window order.
func (h *Handler) preparePlan() error {
	if len(h.Limits) == 0 && h.Rate == nil {
		return fmt.Errorf("limits: at least one limit is required, such as 100 per 1m, unless the handler has a rate")
	}
	if err := h.loadTimezone(); err != nil {
		return err
	}
	var limits []limit
	for _, l := range h.Limits {
		lim, err := newLimit(h.Namespace, l, h.loc)
		if err != nil {
			return err
		}
		for _, other := range limits {
			switch {
			case other.size == lim.size:
				return fmt.Errorf("limits: window %s appears twice", lim.per)
			case other.name == lim.name:
				return fmt.Errorf("limits: windows %s and %s are both named %s in the headers: keep one", other.per, lim.per, lim.name)
			}
		}
		limits = append(limits, lim)
	}
	h.periods = nil
	if slices.ContainsFunc(limits, func(l limit) bool { return l.calendar }) {
		h.periods = new(atomic.Pointer[periodPolicy])
	} else if h.Timezone != "" {
		return fmt.Errorf("timezone: %q has no effect without a calendar window (a limit per day, week or month)", h.Timezone)
	}
	slices.SortFunc(limits, func(a, b limit) int { return int(a.size - b.size) })
	h.first = 0
	if h.Rate != nil {
		if err := h.Rate.check(); err != nil {
			return err
		}
		limits = append([]limit{newRateLimit(h.Namespace, h.Rate)}, limits...)
		h.first = 1
	}
	h.static = plan{limits: limits}
	for _, l := range limits[h.first:] {
		h.static.hitLimits = append(h.static.hitLimits, syncapp.Limit{Size: l.size, Max: l.max})
	}
	h.isDynamic = slices.ContainsFunc(limits, func(l limit) bool { return l.placeholders != "" || l.burstFrom != "" })
	h.concurrencyName = policyName(h.Namespace, "concurrency")
	h.static.policy = h.policyOf(limits)
	h.newBlock = blockFor(h.headerRoom())
	return nil
}

// maxInlineLimits is how many limits a request counts without allocating.
const maxInlineLimits = 4

// counts holds what a request reads of its limits, on its caller's stack
// for up to maxInlineLimits limits: their samples, and what each has left.
type counts struct {
	samples [maxInlineLimits]window.Sample
	left    [maxInlineLimits]int
}

// of returns room for n limits: the arrays, or new slices past them.
func (c *counts) of(n int) ([]window.Sample, []int) {
	if n > maxInlineLimits {
		return make([]window.Sample, n), make([]int, n)
	}
	return c.samples[:n], c.left[:n]
}

// ServeHTTP counts the request against every limit and rejects it when one
// is exceeded.
//
// The counting is in count, whose frame (the samples of the limits, and
// what their headers and a rejection need) is gone from the stack before
// the next handler runs: a route's goroutine whose stack the garbage
// collector shrank grows it again only if a request goes deeper.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	p, key, value, o, err := h.count(w, r)
	if o.admitted() && h.MaxConcurrent > 0 {
		var release func()
		if release, err = h.acquire(w, r, p, key, value); err != nil {
			o = concurrencyRejected
		} else {
			defer release()
		}
	}
	h.outcomes.record(o)
	if err != nil {
		return err
	}
	if h.countsAfter() {
		return h.serveThenCount(w, r, next, p, key, value)
	}
	return next.ServeHTTP(w, r)
}

// count counts the request against every limit (waiting for its turn
// under max_delay; with count_status, only checking them), sets its
// headers and placeholders, and decides the outcome: allowed, delayed or
// dryRunRejected let the request through; any other comes with the error
// that ends it. It returns the plan the request was judged by (tiers.go),
// the key and the request's cost too.
func (h *Handler) count(w http.ResponseWriter, r *http.Request) (p *plan, key string, value float64, o outcome, err error) {
	ctx := r.Context()
	repl := ctx.Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if p, err = h.planFor(repl); err != nil {
		return nil, "", 0, invalidLimit, err
	}
	key = syncapp.BoundKey(h.key(r, repl))
	value = h.cost
	if h.costFromRequest {
		value = h.costOf(repl, "cost", string(h.Cost), 1)
	}
	if h.bans() {
		if until := h.ns.BannedUntil(key); !until.IsZero() {
			return p, key, value, banned, h.rejectBanned(ctx, w, repl, p, key, value, until)
		}
	}
	if refused, wait := h.ns.Refuses(key); refused {
		o, err = h.refuse(ctx, w, repl, p, key, value, wait)
		return p, key, value, o, err
	}

	var c counts
	samples, left := c.of(len(p.limits))
	o = allowed
	var rejected int
	if h.countsAfter() {
		rejected, _ = h.peek(ctx, p, key, value, samples)
		switch {
		case rejected >= 0 && !h.DisablePenalty && h.countsStatus(h.ErrorCode):
			h.hit(ctx, p, key, value, false, samples)
		case rejected < 0:
			// The headers of an admitted request show the counts as they
			// are once it counts, as everywhere else: a request that
			// ends with a status of count_status (a failed login) does.
			for i := range samples {
				if !p.limits[i].rate {
					samples[i].Current += value
				} else {
					samples[i] = h.afterRate(p, samples[i], value)
				}
			}
		}
	} else {
		rejected = h.hit(ctx, p, key, value, h.undo, samples)
	}
	if rejected >= 0 && h.waits() {
		if rejected, err = h.delay(ctx, p, key, value, samples); err != nil {
			return p, key, value, clientGone, err
		}
		if rejected < 0 {
			o = delayed
		}
	}
	for i, s := range samples {
		left[i] = h.remaining(p, i, s)
	}

	p = h.inPeriods(p, samples)
	shown := shown(left, rejected)
	remaining := left[shown]
	now := samples[shown].At // when the zone counted the request: no second clock reading
	reset := h.reset(p, shown, samples[shown], value, remaining, now)
	if rejected >= 0 && h.bans() {
		reset = max(reset, ceilSeconds(time.Duration(h.Ban).Seconds()))
	}
	h.show(w, repl, p, left, shown, reset, rejected >= 0)
	if rejected < 0 {
		return p, key, value, o, nil
	}
	o, err = h.reject(ctx, w, p, key, rejected, value, samples, now)
	return p, key, value, o, err
}

// show sets the placeholders and, unless they are hidden, the headers:
// left is what each limit has left, shown the limit the RateLimit-*
// headers describe.
//
// What outlives the call takes one allocation, sized for the handler:
// the placeholders (unless an earlier rate_limit handler registered them)
// and the header values. Registering the placeholders takes a second one,
// the method value.
func (h *Handler) show(w http.ResponseWriter, repl *caddy.Replacer, p *plan, left []int, shown, reset int, exceeded bool) {
	ph := findPlaceholders(repl)
	var own *placeholders
	var vals []string
	var text []byte
	if !h.showsHeaders() {
		if ph == nil {
			own = new(placeholders)
		}
	} else {
		own, vals, text = h.newBlock()
	}
	if ph == nil {
		ph = own
		repl.Map(ph.get)
	}
	*ph = placeholders{lim: &p.limits[shown], remaining: left[shown], reset: reset, exceeded: exceeded}
	if h.showsHeaders() {
		h.setHeaders(w.Header(), p, vals, text, left, shown, reset)
	}
}

// reject handles a request that limit i rejected: in a dry run, it lets
// it through; otherwise it returns the error that ends it, with
// Retry-After set.
func (h *Handler) reject(ctx context.Context, w http.ResponseWriter, p *plan, key string, i int, value float64, samples []window.Sample, now int64) (outcome, error) {
	l := &p.limits[i]
	if h.DryRun {
		if c := h.logger.Check(zap.DebugLevel, "dry run: request would be rejected"); c != nil {
			c.Write(zap.String("namespace", h.Namespace), zap.String("window", l.name))
		}
		return dryRunRejected, nil
	}
	if h.bans() {
		h.ns.Ban(ctx, key, time.Now().Add(time.Duration(h.Ban)))
	}
	secs := h.retryAfter(p, samples, value, now)
	if l.rate {
		return rejected, h.rejection(w, secs, "rate limit exceeded: faster than %s per %s with a burst of %s in namespace %s",
			l.limitValue, l.per, formatCount(l.burst), h.Namespace)
	}
	return rejected, h.rejection(w, secs, "rate limit exceeded: more than %s per %s in namespace %s", l.limitValue, l.per, h.Namespace)
}

// acquire takes one of max_concurrent places of the key for the request,
// or returns the error that rejects it. A rejection's Retry-After is at
// least 1s (when a place frees is not known), or longer when the limits
// have no room for another request of this cost until then (this one was
// counted); the RateLimit field names the concurrency policy, with that
// wait as its t.
func (h *Handler) acquire(w http.ResponseWriter, r *http.Request, p *plan, key string, value float64) (release func(), err error) {
	release, ok := h.ns.Acquire(r.Context(), key, h.MaxConcurrent)
	if !ok {
		var c counts
		samples, _ := c.of(len(p.limits))
		_, wait := h.peek(r.Context(), p, key, value, samples)
		secs := max(1, ceilSeconds(wait.Seconds()))
		if ph := findPlaceholders(r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)); ph != nil {
			ph.concurrency, ph.exceeded, ph.remaining, ph.reset = true, true, 0, secs
		}
		h.setConcurrencyField(w.Header(), secs)
		return nil, h.rejection(w, secs, "concurrency limit exceeded: more than %d requests of the key in flight in namespace %s",
			h.MaxConcurrent, h.Namespace)
	}
	return release, nil
}

// shown picks the limit the RateLimit-* headers and placeholders describe:
// the one that rejected, or else the one with the least remaining (ties:
// the larger window).
func shown(left []int, rejected int) int {
	if rejected >= 0 {
		return rejected
	}
	best, bestLeft := 0, math.MaxInt
	for i, n := range left {
		if n <= bestLeft {
			best, bestLeft = i, n
		}
	}
	return best
}

// remaining is how many more requests the limit admits now, rounded down:
// for a rate, how many may come at once.
func (h *Handler) remaining(p *plan, i int, s window.Sample) int {
	l := &p.limits[i]
	if l.rate {
		return rateSampleOf(s).Remaining(l.gcra())
	}
	return max(0, int(math.Floor(l.max-s.Rate(h.fixed)+1e-9)))
}

// reset returns the reset of limit i (RateLimit's t, RateLimit-Reset),
// which admits left more hits, for requests of cost value: when the limit
// has no room for such a request, the whole seconds (rounded up) until the
// key's rate under it admits one, as Retry-After computes it; otherwise
// until one more hit's worth of quota comes back. Both depend on the key's
// own counts, never on the window alone, except in a fixed window, whose
// counts all restart at its end.
//
// For a rate, the reset is when a request of cost value is admitted, if
// it is not now, or else when one more request can come at once.
func (h *Handler) reset(p *plan, i int, s window.Sample, value float64, left int, now int64) int {
	if w := h.admitWait(p, i, s, value, now); w > 0 {
		return ceilSeconds(w.Seconds())
	}
	if p.limits[i].rate {
		return ceilSeconds(rateSampleOf(s).Refill(p.limits[i].gcra()).Seconds())
	}
	target := p.limits[i].max - 1
	if left > 0 {
		target = s.Rate(h.fixed) - 1
	}
	return ceilSeconds(s.Until(target, now, h.fixed).Seconds())
}

func ceilSeconds(secs float64) int { return max(0, int(math.Ceil(secs-1e-9))) }

// retryAfter is the Retry-After value before jitter: the seconds until
// every limit admits one more request of this cost (a larger window may be
// exhausted too, though only the first to reject was incremented), or
// until the ban this rejection sets ends, at least 1, in whole seconds.
func (h *Handler) retryAfter(p *plan, samples []window.Sample, value float64, now int64) int {
	secs := 1
	if h.bans() {
		secs = max(secs, ceilSeconds(time.Duration(h.Ban).Seconds()))
	}
	for i, s := range samples {
		secs = max(secs, ceilSeconds(h.admitWait(p, i, s, value, now).Seconds()))
	}
	return secs
}

// admitWait returns how long until limit i, sampled in s at now, has room
// for a request of cost value, if no more hits come: 0 if it has room now.
// A rate says it exactly (its sample's own instant is now); a request
// whose cost is more than a rate's whole burst never fits, and waits
// until the burst is whole again.
func (h *Handler) admitWait(p *plan, i int, s window.Sample, value float64, now int64) time.Duration {
	if l := &p.limits[i]; l.rate {
		rs := rateSampleOf(s)
		if w := rs.Wait(l.gcra(), value); w != window.Never {
			return w
		}
		return rs.Full()
	}
	target := p.limits[i].max - value
	if s.Rate(h.fixed) <= target+1e-9 {
		return 0
	}
	return s.Until(max(target, 0), now, h.fixed)
}

// rejection sets the Retry-After of a rejected request, secs plus up to
// retry_after_jitter, and returns the error that ends it.
func (h *Handler) rejection(w http.ResponseWriter, secs int, format string, args ...any) error {
	if j := time.Duration(h.RetryAfterJitter); j > 0 {
		secs += rand.IntN(ceilSeconds(j.Seconds()) + 1)
	}
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	return caddyhttp.Error(h.ErrorCode, fmt.Errorf(format, args...))
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
