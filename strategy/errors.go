package strategy

import (
	"fmt"
	"strings"
)

// Errors words the errors of one store, so that every store of this module
// (and a third-party one that wants to) reports its failures alike: each
// error of an operation names the store, the operation and the namespace,
// and wraps ErrNotSent or ErrRejected by the rules of Store. A store keeps
// one in a package variable:
//
//	var errs = strategy.Errors{Store: "redis"}
//
//	func (s *Store) Reset(ctx context.Context, namespace, key string, sizes []time.Duration, now time.Time) (err error) {
//		defer errs.Reset(&err, namespace)
//		...
//	}
//
// The methods named after an operation take the address of the
// operation's error, to be deferred as above: they wrap a non-nil error
// and leave a nil one alone.
type Errors struct {
	// Store names the store in its errors, in lower case: "redis".
	Store string
}

// Settings returns what is wrong with a store's settings, the errors that
// are not nil, as one error that wraps them all: "<store> strategy: <err>;
// <err>...". It returns nil when every error is nil.
func (e Errors) Settings(errs ...error) error {
	var args []any
	for _, err := range errs {
		if err != nil {
			args = append(args, err)
		}
	}
	if len(args) == 0 {
		return nil
	}
	return fmt.Errorf(e.Store+" strategy: %w"+strings.Repeat("; %w", len(args)-1), args...)
}

// Closed returns the error of a call made on a closed store: it wraps
// ErrNotSent, as a closed store sends nothing.
func (e Errors) Closed() error {
	return fmt.Errorf("%w: the %s store is closed", ErrNotSent, e.Store)
}

// NotSent returns err, which shows that a request surely never reached
// the store, wrapped with ErrNotSent.
func (e Errors) NotSent(err error) error {
	return fmt.Errorf("%w: %w", ErrNotSent, err)
}

// Rejected returns an error that wraps ErrRejected, for input the store
// can never accept; format and args say what is wrong with it.
func (e Errors) Rejected(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRejected, fmt.Sprintf(format, args...))
}

// wrap wraps *errp, unless it is nil, with what the store was doing.
func (e Errors) wrap(errp *error, format string, args ...any) {
	if *errp != nil {
		*errp = fmt.Errorf("%s store: %s: %w", e.Store, fmt.Sprintf(format, args...), *errp)
	}
}

// PushDiffs wraps the error of Store.PushDiffs of batch b.
func (e Errors) PushDiffs(errp *error, b Batch) {
	e.wrap(errp, "pushing %d diffs of namespace %q", len(b.Diffs), b.Namespace)
}

// GetCounters wraps the error of Store.GetCounters of n keys.
func (e Errors) GetCounters(errp *error, namespace string, n int) {
	e.wrap(errp, "fetching counters of %d keys of namespace %q", n, namespace)
}

// MarkNear wraps the error of NearFeed.MarkNear of n marks.
func (e Errors) MarkNear(errp *error, namespace string, n int) {
	e.wrap(errp, "marking %d keys of namespace %q near their limits", n, namespace)
}

// Reset wraps the error of Store.Reset.
func (e Errors) Reset(errp *error, namespace string) {
	e.wrap(errp, "resetting a key of namespace %q", namespace)
}

// HitBatch wraps the error of one hit, hits[i], of BatchHitter.HitBatch.
func (e Errors) HitBatch(errp *error, namespace string, i int) {
	e.wrap(errp, "hitting windows of namespace %q: hits[%d]", namespace, i)
}

// CheckBatch readies the results of a BatchHitter.HitBatch: it checks
// every hit as CheckHitRequest does (with the batch's id), sets the Err of each
// bad one, worded as HitBatch does, and the others to no error, no counts
// and Rejected -1. It returns the indexes of the good hits, in order. It
// panics if results and hits differ in length, a caller's bug.
func (e Errors) CheckBatch(namespace, id string, hits []HitRequest, results []HitResult) []int {
	if len(results) != len(hits) {
		panic(fmt.Sprintf("strategy: HitBatch of %d hits given %d results", len(hits), len(results)))
	}
	good := make([]int, 0, len(hits))
	for i := range hits {
		err := CheckHitRequest(id, &hits[i])
		if err != nil {
			e.HitBatch(&err, namespace, i)
		} else {
			good = append(good, i)
		}
		results[i] = HitResult{Rejected: -1, Err: err}
	}
	return good
}

// FailBatch sets the Err of the results of the hits at the given indexes
// to err, worded as HitBatch does.
func (e Errors) FailBatch(results []HitResult, namespace string, hits []int, err error) {
	for _, i := range hits {
		err := err
		e.HitBatch(&err, namespace, i)
		results[i] = HitResult{Rejected: -1, Err: err}
	}
}

// AcquireSlot wraps the error of Slotter.AcquireSlot.
func (e Errors) AcquireSlot(errp *error, namespace string) {
	e.wrap(errp, "acquiring a slot of namespace %q", namespace)
}

// ReleaseSlots wraps the error of Slotter.ReleaseSlots of n slots.
func (e Errors) ReleaseSlots(errp *error, namespace string, n int) {
	e.wrap(errp, "releasing %d slots of namespace %q", n, namespace)
}

// RenewSlots wraps the error of Slotter.RenewSlots of n slots.
func (e Errors) RenewSlots(errp *error, namespace string, n int) {
	e.wrap(errp, "renewing %d slots of namespace %q", n, namespace)
}

// SetBans wraps the error of Banner.SetBans of n bans.
func (e Errors) SetBans(errp *error, namespace string, n int) {
	e.wrap(errp, "setting %d bans of namespace %q", n, namespace)
}

// GetBans wraps the error of Banner.GetBans.
func (e Errors) GetBans(errp *error, namespace string) {
	e.wrap(errp, "getting the bans of namespace %q", namespace)
}

// Ping wraps the error of Pinger.Ping.
func (e Errors) Ping(errp *error) {
	e.wrap(errp, "pinging")
}

// Attend wraps the error of Roster.Attend.
func (e Errors) Attend(errp *error, namespace string) {
	e.wrap(errp, "attending the fleet of namespace %q", namespace)
}
