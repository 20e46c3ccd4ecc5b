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

	"github.com/ratesync/caddy-ratelimit/window"
)

// parseCost prepares cost: a number now, or placeholders to read per
// request.
func (h *Handler) parseCost() error {
	h.cost, h.costFromRequest = 1, false
	c := strings.TrimSpace(string(h.Cost))
	if c == "" {
		return nil
	}
	if strings.Contains(c, "{") {
		h.costFromRequest = true
		return nil
	}
	v, err := strconv.ParseFloat(c, 64)
	if err != nil || !validCost(v) {
		return fmt.Errorf("cost: want a number of 0 or more, or placeholders, got %q", string(h.Cost))
	}
	h.cost = v
	return nil
}

func validCost(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// requestCost is the cost that the placeholders of cost give for this
// request, or 1 when they do not give a number of 0 or more.
func (h *Handler) requestCost(repl *caddy.Replacer) float64 {
	s := repl.ReplaceKnown(string(h.Cost), "")
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !validCost(v) {
		if c := h.logger.Check(zap.DebugLevel, "cost is not a number of 0 or more: counting 1"); c != nil {
			c.Write(zap.String("namespace", h.Namespace), zap.String("cost", s))
		}
		return 1
	}
	return v
}

// countsAfter reports whether requests are checked before they run and
// counted after their response: with count_status or response_cost.
func (h *Handler) countsAfter() bool { return len(h.CountStatus) > 0 || h.ResponseCost != "" }

// countsStatus reports whether a response of status counts: any, unless
// count_status names some.
func (h *Handler) countsStatus(status int) bool {
	return len(h.CountStatus) == 0 || slices.Contains(h.CountStatus, status)
}

// checkResponseCost checks response_cost: placeholders, or a number of 0
// or more.
func checkResponseCost(c string) error {
	if strings.Contains(c, "{") {
		return nil
	}
	if v, err := strconv.ParseFloat(strings.TrimSpace(c), 64); err != nil || !validCost(v) {
		return fmt.Errorf("response_cost: want a number of 0 or more, or placeholders such as {http.response.header.X-Units}, got %q", c)
	}
	return nil
}

// responseCost is what response_cost gives once the response is written,
// or value (the request's cost) when it is not a number of 0 or more.
func (h *Handler) responseCost(repl *caddy.Replacer, value float64) float64 {
	s := repl.ReplaceKnown(string(h.ResponseCost), "")
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !validCost(v) {
		if c := h.logger.Check(zap.DebugLevel, "response_cost is not a number of 0 or more: charging cost"); c != nil {
			c.Write(zap.String("namespace", h.Namespace), zap.String("response_cost", s), zap.Float64("cost", value))
		}
		return value
	}
	return v
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
			value = h.responseCost(r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer), value)
		}
		// The response is on its way: a client that went away must not
		// keep the request from counting.
		var buf [maxInlineLimits]window.Sample
		samples := buf[:]
		if len(p.limits) > len(buf) {
			samples = make([]window.Sample, len(p.limits))
		}
		h.hit(context.WithoutCancel(r.Context()), p, key, value, false, samples[:len(p.limits)])
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
	var buf [maxInlineLimits]window.Sample
	var leftBuf [maxInlineLimits]int
	samples, left := buf[:], leftBuf[:]
	n := len(p.limits)
	if n > len(buf) {
		samples, left = make([]window.Sample, n), make([]int, n)
	}
	samples, left = samples[:n], left[:n]
	h.peek(ctx, p, key, value, samples)
	wait := time.Until(until)
	shown := n - 1
	for i, s := range samples {
		if w := h.admitWait(p, i, s, value, s.At); w > wait {
			wait, shown = w, i
		}
	}
	secs := max(1, ceilSeconds(wait.Seconds()))
	h.show(w, repl, p, left, shown, secs, true)
	w.Header().Set("Retry-After", strconv.Itoa(h.jitter(secs)))
	return caddyhttp.Error(h.ErrorCode, fmt.Errorf("key banned for %ds more in namespace %s", secs, h.Namespace))
}
