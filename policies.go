package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// checkCosts checks cost, response_cost and count_status, and what they
// cannot be combined with, and prepares cost: a number now, or
// placeholders to read per request.
func (h *Handler) checkCosts() (err error) {
	if h.cost, h.costFromRequest, err = parseCostField("cost", string(h.Cost), "placeholders", 1); err != nil {
		return err
	}
	if h.ResponseCost != "" {
		if _, _, err := parseCostField("response_cost", string(h.ResponseCost), "placeholders such as {http.response.header.X-Units}", 0); err != nil {
			return err
		}
		if h.MaxDelay > 0 {
			return fmt.Errorf("response_cost: cannot be combined with max_delay (%v): a request that waits for its turn takes it before its cost is known", time.Duration(h.MaxDelay))
		}
		if h.Rate != nil {
			return fmt.Errorf("response_cost: cannot be combined with rate: a rate's turn is taken before the request runs, not charged after it")
		}
	}
	for _, code := range h.CountStatus {
		if code < 100 || code > 599 {
			return fmt.Errorf("count_status: %d is not a status: want 100 to 599", code)
		}
	}
	if len(h.CountStatus) > 0 && h.MaxDelay > 0 {
		return fmt.Errorf("count_status: cannot be combined with max_delay (%v): a request that waits for its turn takes it", time.Duration(h.MaxDelay))
	}
	return nil
}

// parseCostField reads a cost field (cost, response_cost): a number of 0
// or more, or placeholders to read later (reported by placeholders; v is
// def then, as for "" or a bad value). The error names the field, what it
// wants (a number of 0 or more, or want) and the value.
func parseCostField(field, c, want string, def float64) (v float64, placeholders bool, err error) {
	c = strings.TrimSpace(c)
	switch {
	case c == "":
		return def, false, nil
	case strings.Contains(c, "{"):
		return def, true, nil
	}
	v, err = strconv.ParseFloat(c, 64)
	if err != nil || !validCost(v) {
		return def, false, fmt.Errorf("%s: want a number of 0 or more, or %s, got %q", field, want, c)
	}
	return v, false, nil
}

func validCost(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// costOf is what the placeholders of a cost field give now, or fallback
// when that is not a number of 0 or more (logged at debug level).
func (h *Handler) costOf(repl *caddy.Replacer, field, template string, fallback float64) float64 {
	v, got, ok := numberOf(repl, template)
	if !ok {
		if c := h.logger.Check(zap.DebugLevel, field+" is not a number of 0 or more: counting the fallback"); c != nil {
			c.Write(zap.String("namespace", h.Namespace), zap.String(field, got), zap.Float64("fallback", fallback))
		}
		return fallback
	}
	return v
}

// numberOf reads placeholders that give a number of 0 or more (a cost, a
// tier's count) for this request: ok is false when what they give, got,
// is not one.
func numberOf(repl *caddy.Replacer, placeholders string) (v float64, got string, ok bool) {
	got = repl.ReplaceKnown(placeholders, "")
	v, err := strconv.ParseFloat(strings.TrimSpace(got), 64)
	return v, got, err == nil && validCost(v)
}

// countsAfter reports whether requests are checked before they run and
// counted after their response: with count_status or response_cost.
func (h *Handler) countsAfter() bool { return len(h.CountStatus) > 0 || h.ResponseCost != "" }

// countsStatus reports whether a response of status counts: any, unless
// count_status names some.
func (h *Handler) countsStatus(status int) bool {
	return len(h.CountStatus) == 0 || slices.Contains(h.CountStatus, status)
}

// serveThenCount runs the next handler, and counts the request
// (count_status, response_cost) when the status of its response is one of
// count_status, or any with no count_status: the status it was written
// with, or else the status of the error it ended with (such as
// basic_auth's 401, which handle_errors writes later). It counts what
// response_cost gives then, or else the request's cost.
func (h *Handler) serveThenCount(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, p *plan, key string, value float64) error {
	rec := caddyhttp.NewResponseRecorder(w, nil, nil)
	err := next.ServeHTTP(rec, r)
	status := rec.Status()
	if status == 0 {
		status = http.StatusOK
		if err != nil {
			status = http.StatusInternalServerError
			var herr caddyhttp.HandlerError
			if errors.As(err, &herr) && herr.StatusCode != 0 {
				status = herr.StatusCode
			}
		}
	}
	if h.countsStatus(status) {
		if h.ResponseCost != "" {
			// What response_cost gives now, or the request's cost.
			value = h.costOf(r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer), "response_cost", string(h.ResponseCost), value)
		}
		// The response is on its way: a client that went away must not
		// keep the request from counting.
		var c counts
		samples, _ := c.of(len(p.limits))
		h.hit(context.WithoutCancel(r.Context()), p, key, value, false, samples)
	}
	return err
}

// bans says whether a rejection bans the key. A dry run rejects nothing,
// so it bans nothing, and no ban rejects its requests.
func (h *Handler) bans() bool { return h.Ban > 0 && !h.DryRun }

// rejectBanned rejects a request of a key banned until the given time,
// counting nothing. Its Retry-After is when a request of the same cost is
// admitted: once the ban has ended and every limit has room for it (the
// counts that started the ban may outlast it), so that a client that
// obeys it never starts a new ban. Its headers and placeholders say that
// no limit has room until then, and show the limit that keeps the key out
// longest (or the largest window, when only the ban does).
func (h *Handler) rejectBanned(ctx context.Context, w http.ResponseWriter, repl *caddy.Replacer, p *plan, key string, value float64, until time.Time) error {
	var c counts
	samples, left := c.of(len(p.limits))
	h.peek(ctx, p, key, value, samples)
	wait := time.Until(until)
	shown := len(p.limits) - 1
	for i, s := range samples {
		if w := h.admitWait(p, i, s, value, s.At); w > wait {
			wait, shown = w, i
		}
	}
	secs := max(1, ceilSeconds(wait.Seconds()))
	h.show(w, repl, p, left, shown, secs, true)
	return h.rejection(w, secs, "key banned for %ds more in namespace %s", secs, h.Namespace)
}

// refuse answers a request that the namespace's on_store_failure deny
// rejects while the node cannot reach the store, without counting it: the
// headers show the limit of the largest window spent, and the request's
// wait (when the node next asks the store) in its reset and Retry-After.
// In a dry run it lets the request through, as a limit's rejection.
func (h *Handler) refuse(ctx context.Context, w http.ResponseWriter, repl *caddy.Replacer, p *plan, key string, value float64, wait time.Duration) (outcome, error) {
	var c counts
	samples, left := c.of(len(p.limits))
	h.peek(ctx, p, key, value, samples) // local: the store is away
	secs := max(1, ceilSeconds(wait.Seconds()))
	h.show(w, repl, h.inPeriods(p, samples), left, len(p.limits)-1, secs, true)
	if h.DryRun {
		if c := h.logger.Check(zap.DebugLevel, "dry run: request would be rejected: the store is unreachable"); c != nil {
			c.Write(zap.String("namespace", h.Namespace))
		}
		return dryRunRejected, nil
	}
	return storeUnreachable, h.rejection(w, secs, "rate limit store unreachable in namespace %s: on_store_failure deny rejects requests until it is back", h.Namespace)
}
