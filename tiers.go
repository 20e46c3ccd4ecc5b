package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/syncapp"
)

// Tiers: the count of a limit, and a rate's rate and burst, may be
// placeholders read per request (such as {plan_quota}, which Caddy's map
// sets from a header or a client certificate), while the window stays
// fixed and names the counter. A key is then judged by the numbers its
// request gives, and its headers show them.
//
// A request whose placeholders give no positive number (a burst: no
// number of 0 or more) is rejected with 500 and counts nothing: a
// config that cannot tell a request's limit is a server error, and the
// safe answer is never an unlimited pass, nor a guess at the tier. It is
// logged at error level, at most once per unresolvedLogInterval per
// handler, and counted as the outcome invalid_limit.

// unresolvedLogInterval is the least time between two logs of a
// handler's requests whose limits did not resolve.
const unresolvedLogInterval = 10 * time.Second

// plan is what a request is judged by: the rate, if any, first, then the
// limits in ascending window order, and what the namespace and the
// headers need of them.
type plan struct {
	limits []limit
	// The window limits, limits[h.first:], as the namespace checks them.
	hitLimits []syncapp.Limit
	// The RateLimit-Policy field.
	policy string
}

// rated says whether the handler has a rate: the first of a plan's
// limits.
func (h *Handler) rated() bool { return h.first == 1 }

// policyOf returns the RateLimit-Policy field of limits: every limit and
// the concurrency policy.
func (h *Handler) policyOf(limits []limit) string {
	items := make([]string, len(limits), len(limits)+1)
	for i, l := range limits {
		items[i] = l.policy
	}
	if h.MaxConcurrent > 0 {
		items = append(items, sfString(h.concurrencyName)+";q="+strconv.Itoa(h.MaxConcurrent)+`;qu="concurrent-requests"`)
	}
	return strings.Join(items, ", ")
}

// planFor returns the plan a request is judged by: the handler's own, or,
// when some count is read per request, one with the numbers this request
// gives. It returns an error, the request's 500, when one gives none.
func (h *Handler) planFor(repl *caddy.Replacer) (*plan, error) {
	if !h.isDynamic {
		return &h.static, nil
	}
	p := &plan{limits: make([]limit, len(h.static.limits)), hitLimits: make([]syncapp.Limit, len(h.static.hitLimits))}
	copy(p.hitLimits, h.static.hitLimits)
	for i, l := range h.static.limits {
		v, burst := l.max, l.burst
		var ok bool
		var got string
		if l.placeholders != "" {
			if v, got, ok = numberOf(repl, l.placeholders); !ok || v == 0 {
				return nil, h.unresolved(l, l.placeholders, got)
			}
		}
		if l.burstFrom != "" {
			if burst, got, ok = numberOf(repl, l.burstFrom); !ok {
				return nil, h.unresolved(l, l.burstFrom, got)
			}
		}
		p.limits[i] = l.judged(v, burst)
		if i >= h.first {
			p.hitLimits[i-h.first].Max = v
		}
	}
	p.policy = h.policyOf(p.limits)
	return p, nil
}

// unresolved logs (throttled) a request whose placeholders gave no count
// (but got), and returns the error that ends it.
func (h *Handler) unresolved(l limit, placeholders, got string) error {
	what := "limit of window " + l.per
	if l.rate {
		what = "rate of window " + l.per
		if placeholders == l.burstFrom {
			what = "burst of the " + what
		}
	}
	now := time.Now().UnixNano()
	if last := h.unresolvedLog.Load(); now-last >= int64(unresolvedLogInterval) && h.unresolvedLog.CompareAndSwap(last, now) {
		h.logger.Error("a limit's placeholders give no number for a request: rejecting it with 500",
			zap.String("namespace", h.Namespace), zap.String("which", what),
			zap.String("placeholders", placeholders), zap.String("value", got),
			zap.Duration("logged_at_most_every", unresolvedLogInterval))
	}
	return caddyhttp.Error(http.StatusInternalServerError,
		fmt.Errorf("rate limit: the %s, %s, gives %q, not a positive number, in namespace %s", what, placeholders, got, h.Namespace))
}
