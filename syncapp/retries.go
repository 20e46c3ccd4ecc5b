package syncapp

import (
	"slices"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// maxRetries bounds the synchronous hits kept for a retry; past it the
// oldest are dropped (they still count locally).
const maxRetries = 10_000

// retryQueue holds the synchronous hits that failed after they may have
// been applied, each to be pushed as a batch of the hit's own ID, which
// the store skips if it applied the hit (the hit ID rule).
type retryQueue struct {
	mu    lockorder.Mutex[retryQueueLock]
	items []strategy.Batch
}

// add queues a batch, dropping the oldest past maxRetries.
func (q *retryQueue) add(b strategy.Batch) {
	if len(b.Diffs) == 0 && len(b.Rates) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) >= maxRetries {
		q.items = q.items[1:]
	}
	q.items = append(q.items, b)
}

// take empties the queue and returns what it held.
func (q *retryQueue) take() []strategy.Batch {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := q.items
	q.items = nil
	return r
}

// putBack returns batches whose push failed, ahead of newer ones.
func (q *retryQueue) putBack(r []strategy.Batch) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.items = append(r[:len(r):len(r)], q.items...)
	if n := len(q.items); n > maxRetries {
		q.items = q.items[n-maxRetries:]
	}
}

// queued returns the batches waiting for a retry. The caller must not
// change them.
func (q *retryQueue) queued() []strategy.Batch {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.items
}

// dropKey drops key's diffs and rates from the queued batches, and the
// batches left with none.
func (q *retryQueue) dropKey(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	kept := q.items[:0:0]
	for _, b := range q.items {
		b.Diffs = withoutKey(b.Diffs, key)
		b.Rates = slices.DeleteFunc(slices.Clone(b.Rates), func(r strategy.RateDiff) bool { return r.Key == key })
		if len(b.Diffs) > 0 || len(b.Rates) > 0 {
			kept = append(kept, b)
		}
	}
	q.items = kept
}

// len returns how many batches wait in the queue.
func (q *retryQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// diffs returns how many diffs wait in the queue, a rate's turn counting
// as one.
func (q *retryQueue) diffs() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return diffsIn(q.items)
}

// diffsIn returns how many diffs batches hold, a rate's turn counting as
// one.
func diffsIn(batches []strategy.Batch) int {
	n := 0
	for _, b := range batches {
		n += len(b.Diffs) + len(b.Rates)
	}
	return n
}
