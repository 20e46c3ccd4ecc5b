package strategy

import "context"

// BatchHitter is a Hitter that applies several synchronous hits of one
// namespace in one round trip: the rate_limit app sends the hits that
// arrive while a round trip is in flight together in the next one.
type BatchHitter interface {
	Hitter

	// HitBatch applies hits in the order given, each deciding exactly as
	// Hit would if the hits were sent one after the other, and fills
	// results[i] for hits[i] (len(results) == len(hits)). id names the
	// batch: the hit ID rule of Hit holds for the batch as a whole (a
	// HitBatch and a PushDiffs Batch with the same ID are applied at most
	// once between them, per key), so that a caller whose batch failed
	// after it may have been applied pushes the increments of the failed
	// hits as one Batch with that ID. A failure sets Err of the hits it
	// concerns (on a Redis Cluster, those of one slot's round trip;
	// elsewhere, all of them), with the error conventions of Hit
	// (ErrNotSent, ErrRejected).
	HitBatch(ctx context.Context, namespace, id string, hits []HitRequest, results []HitResult)
}

// HitRequest is one hit of a HitBatch.
type HitRequest struct {
	// Key is the key hit.
	Key string
	// Windows are the windows of the hit, as Hit takes them.
	Windows []WindowHit
	// Undo takes a rejected hit's increments back, as Hit's undo.
	Undo bool
}

// HitResult is the answer to one hit of a HitBatch.
type HitResult struct {
	// Counts are each window's counts after the hit, as Hit returns them.
	Counts []WindowCounts
	// Rejected is the index of the window that rejected the hit, or -1.
	Rejected int
	// Err is why the hit was not answered, with the conventions of Hit's
	// error.
	Err error
}

// Pinger is a Store that can tell, in one round trip that changes
// nothing, whether it serves: the rate_limit app asks it while the store
// is failing and a sync run had nothing else to ask, so that it learns
// soon that the store is back.
type Pinger interface {
	Store

	// Ping returns nil when the store serves every part of its data (on a
	// Redis Cluster, every master answers), and otherwise an error with
	// the conventions of Store's errors.
	Ping(ctx context.Context) error
}
