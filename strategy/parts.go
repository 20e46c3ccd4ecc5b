package strategy

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Parted is a Store made of parts that fail one at a time: a Redis
// Cluster, whose masters each serve some of its slots, can lose one
// master while the others answer. A caller that knows which part of the
// store holds a key keeps using the parts that answer, and counts
// locally only the keys of the parts that do not.
//
// A Parted store's calls fail with a *PartialError that names the parts
// that failed whenever the failure concerns some parts only: the rest of
// the call was done (diffs of the other parts pushed, their counts read,
// their hits applied). Pushing a batch again with the same ID, holding
// the diffs of the failed parts only, applies each of them at most once
// (the ID is recorded per part). An error that is not a PartialError
// concerns the whole call.
type Parted interface {
	Store

	// Parts returns how many parts the store has: 1 for a store that
	// answers or fails as a whole (a standalone server), whose errors
	// then concern whole calls.
	Parts() int

	// PartOf returns the part of the store that holds key's data in
	// namespace, in [0, Parts()): its counters, rates, slots and hit IDs.
	// A namespace's bans, near marks and fleet roster are in the part of
	// its empty key. A part never moves: a store maps it to a server
	// (a Redis Cluster's slot) by itself.
	PartOf(namespace, key string) int

	// PingParts asks the servers of the given parts whether they answer,
	// once per server, and returns nil when all do, or a *PartialError
	// that names the parts whose servers did not. A caller learns so
	// that a part came back although no call of its keys was due.
	PingParts(ctx context.Context, parts []int) error
}

// PartialError is the error of a call of a Parted store of which only
// some parts failed: Parts lists them, ascending and without repeats.
// It wraps the failure (ErrNotSent when no request to those parts was
// sent), so errors.Is sees through it.
type PartialError struct {
	// Parts are the parts whose share of the call failed.
	Parts []int
	// Err is the failure.
	Err error
}

// Error says which parts failed, and why.
func (e *PartialError) Error() string {
	return fmt.Sprintf("%d parts of the store failed: %v", len(e.Parts), e.Err)
}

// Unwrap returns the failure.
func (e *PartialError) Unwrap() error { return e.Err }

// Partial returns err as the failure of the given parts of a Parted
// store's call: a *PartialError with the parts sorted and deduplicated.
// A nil err stays nil.
func Partial(err error, parts ...int) error {
	if err == nil {
		return nil
	}
	p := slices.Clone(parts)
	slices.Sort(p)
	return &PartialError{Parts: slices.Compact(p), Err: err}
}

// FailedParts returns the parts that err, the error of a call of a
// Parted store, says failed, and whether it names any: false for an
// error that concerns the whole call (or none).
func FailedParts(err error) ([]int, bool) {
	var pe *PartialError
	if !errors.As(err, &pe) {
		return nil, false
	}
	return pe.Parts, true
}
