package strategy

import "context"

// Maintainer is a Store with housekeeping of its own, such as deleting
// what expired, that a periodic namespace's sync runs carry out after
// their calls, one after the other: so the housekeeping uses the
// connection a run just gave back, where at a time of its own it could
// find that connection busy and have the pool open another. The store
// does it by itself when no run has for a while (a store only
// synchronous namespaces use).
type Maintainer interface {
	Store

	// Maintain does the housekeeping that is due, and returns at once
	// when none is. It logs its own failures: they say nothing of the
	// run's.
	Maintain(ctx context.Context)
}
