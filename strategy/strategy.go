// Package strategy defines how a namespace's counters reach a central store,
// so that several Caddy nodes enforce one shared limit. A strategy is a
// Caddy module in the rate_limit.strategies namespace; the redis strategy
// lives in the subpackage of that name.
//
// The interface is the Go form of the strategy functions of Kong's
// rate-limiting library (push_diffs, get_counters, get_window), plus Hit for
// the synchronous mode (sync_rate 0), which applies one hit and answers in a
// single round trip.
package strategy

import (
	"context"
	"errors"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// Strategy is a central store of window counters. Implementations must be
// safe for concurrent use. Every counter is identified by (namespace, key,
// window size, window start); keys are arbitrary bytes and must reach the
// store only as data.
type Strategy interface {
	// PushDiffs adds every diff of the batch to the store's counters. A push
	// that fails may have been applied in part, in full or not at all; pushing
	// the same batch again (same ID) must never apply a diff twice, so that a
	// caller can retry a failed push without counting anything twice.
	PushDiffs(ctx context.Context, batch Batch) error

	// GetCounters returns the store's counts of the window holding now and of
	// the one before it, for every window size of every given key. It costs
	// in proportion to len(keys)*len(sizes), never to the size of the
	// namespace in the store. Counters the store does not hold are omitted
	// or reported as zero.
	GetCounters(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time) ([]window.Count, error)

	// GetWindow returns one counter: key's window of the given size that
	// starts at start (Unix nanoseconds). A missing counter is zero.
	GetWindow(ctx context.Context, namespace, key string, size time.Duration, start int64) (float64, error)

	// Hit applies one hit to several windows of a key, in one round trip
	// to the store, deciding the way the rate limiter does (Kong's order):
	// in the order given (ascending window size), each window's current
	// count is incremented by its Value and its rate, current +
	// previous*Weight, compared with its Max; once a window's rate exceeds
	// its Max, the windows after it are only read, not incremented. With
	// undo, the increments of a rejected hit are taken back before the call
	// returns (disable_penalty).
	//
	// id, unless empty, names the hit: the store records it, for at least
	// a minute (the Redis strategy: at most two), as if it were a Batch of
	// that ID pushed to the key's counters. A caller whose hit failed after
	// it may have been applied pushes the hit's diffs later as a Batch with
	// that ID, which the store applies only if the hit was not.
	//
	// It returns each window's counts after the hit, in the order given,
	// and the index of the window that rejected the hit, or -1. An error
	// wraps ErrNotSent when the request surely never reached the store, so
	// the caller may count the hit elsewhere without counting it twice.
	Hit(ctx context.Context, namespace, key, id string, windows []WindowHit, undo bool) (counts []WindowCounts, rejected int, err error)
}

// WindowHit is one window of a Hit.
type WindowHit struct {
	// Size is the window size.
	Size time.Duration
	// Start is the start of the current window, in Unix nanoseconds.
	Start int64
	// Value is added to the current window's count.
	Value float64
	// Max is the limit: the hit is rejected when the window's rate exceeds
	// it. math.Inf(1) never rejects.
	Max float64
	// Weight is the previous window's weight in the rate, in [0, 1]: the
	// sliding weight at the time of the hit, or 0 for a fixed window.
	Weight float64
}

// WindowCounts are one window's counts after a Hit.
type WindowCounts struct {
	// Current is the count of the window that starts at WindowHit.Start.
	Current float64
	// Previous is the count of the window before it.
	Previous float64
}

// Batch is one push of diffs, all of one namespace.
type Batch struct {
	// ID identifies the batch across retries. A caller that retries a failed
	// push sends the same ID, and gives every new batch a new one.
	ID string
	// Namespace is the namespace of every diff.
	Namespace string
	// Diffs are the changes to push.
	Diffs []window.Diff
}

// ErrRejected is wrapped by the errors a strategy returns for input it can
// never accept, such as a window size its layout cannot express. Retrying
// such a push cannot succeed, so callers drop it instead.
var ErrRejected = errors.New("rejected by the strategy")

// ErrNotSent is wrapped by the errors of requests that surely never reached
// the store (it could not be dialed, or the client is closed). Any other
// failure may have been applied.
var ErrNotSent = errors.New("request not sent to the store")
