// Package memory is the in-memory storage strategy of the rate limiter: the
// Caddy module rate_limit.strategies.memory, and the reference
// implementation of strategy.Store, strategy.Hitter, strategy.BatchHitter
// and strategy.Slotter.
//
// Its counters live in the Caddy process, in a data set named by the
// strategy's name: every store opened from a memory strategy of the same
// name shares them, so several simulated nodes (several namespaces, zones
// or apps) in one process share counts as nodes of a cluster share one
// Redis. Nothing is shared across processes. It is meant for tests, and
// for trying the sync machinery out on one machine.
//
// It keeps every promise of a store to the letter, the way the Redis store
// keeps them: a batch ID is applied at most once; fetches return the
// current and previous windows of the keys asked, omit the counters the
// data set does not hold and report reset counters as zero; counters expire
// at their window's start plus twice its size (Redis adds a second of
// margin), ID markers live as long as Redis keeps them (a batch's as long
// as its counters, a hit's one to two minutes), and both are dropped by
// later writes, so memory stays bounded without a goroutine; a synchronous
// hit follows Kong's order, with undo and the hit ID rule, and a batch of
// them (HitBatch) is applied in order under the lock, with one marker for
// the batch's ID, as a Batch's, so that the batch and the Batch of its
// diffs count once between them. Concurrency
// slots (max_concurrent) are held per (namespace, key), as a map of slot
// IDs to expiries by the store's clock, and dropped by the same sweep as
// counters once their lease ends. Window sizes must be whole milliseconds,
// as in Redis, and leases count in whole milliseconds, so that tests behave
// alike on both. Every operation is atomic, under one lock per data set.
package memory
