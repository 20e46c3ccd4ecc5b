package ratelimit

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ratesync/caddy-ratelimit/window"
)

// statusClientClosedRequest ends a request whose client went away while
// it waited, as Caddy's reverse proxy records such requests (nginx's 499).
const statusClientClosedRequest = 499

// waits says whether a request the limits reject may wait for its turn.
// A dry run rejects nothing, so nothing waits in it.
func (h *Handler) waits() bool { return h.MaxDelay > 0 && !h.DryRun }

// delay lets a request that the first hit rejected (counting nothing) wait
// for its key's rate to admit it, for at most max_delay and while fewer
// than max_waiting requests of the handler wait. It returns -1 once the
// request is counted and admitted. Otherwise the request gives up: it is
// counted as a request that no waiting helped, penalty included unless
// disable_penalty is set, and delay returns the index of the limit that
// rejected it (or -1, should it fit by then). samples receive the window
// states of the last hit.
//
// The wait is what the key's counts say (window.Namespace.HitIfRoom, or
// the store's rate as for Retry-After; a rate's GCRA says when the
// request's turn comes, to the nanosecond), and the hit is tried again when it
// ends, so that the waiters of one key pass one at a time as the rate
// admits them. A waiting request holds its own goroutine and one timer;
// a client that goes away ends the wait, uncounted, with an error.
func (h *Handler) delay(ctx context.Context, p *plan, key string, value float64, samples []window.Sample) (rejected int, err error) {
	if h.waiting.Add(1) > int64(h.MaxWaiting) {
		h.waiting.Add(-1)
		return h.hit(ctx, p, key, value, h.DisablePenalty, samples), nil // gives up at once
	}
	defer h.waiting.Add(-1)

	start := time.Now()
	deadline := start.Add(time.Duration(h.MaxDelay))
	for {
		rejected, wait := h.hitIfRoom(ctx, p, key, value, samples)
		if rejected < 0 {
			h.delays.Observe(time.Since(start).Seconds())
			return -1, nil
		}
		if wait < 0 || time.Until(deadline) < wait {
			return h.hit(ctx, p, key, value, h.DisablePenalty, samples), nil // gives up
		}
		select {
		case <-time.After(wait): // unreferenced, a timer is collected even if it never fired
		case <-ctx.Done():
			return 0, caddyhttp.Error(statusClientClosedRequest,
				fmt.Errorf("client went away after waiting %v for the rate limit in namespace %s: %w",
					time.Since(start).Round(time.Millisecond), h.Namespace, ctx.Err()))
		}
	}
}
