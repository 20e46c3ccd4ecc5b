// Package strategytest is the conformance suite of rate-limit stores: the
// promises of strategy.Store and strategy.Hitter, checked against a real
// store. Every store the project ships runs it (memory, Redis standalone,
// Redis Cluster, PostgreSQL), and so can a third-party one:
//
//	func TestConformance(t *testing.T) {
//		strategytest.Run(t, strategytest.Harness{Open: openMyStore, Counters: countMine})
//	}
//
// Run checks, each in a subtest of its own: that pushed diffs add up and a
// fetch returns the current and previous windows of the keys asked,
// omitting what the store does not hold (PushFetch); that a batch pushed
// again under its ID counts once, in any order (RetriedBatch), also after
// a first attempt that failed part way (PartialFailure); that large batches
// land whole (ManyDiffs) and concurrent ones too (ConcurrentPushes); that no
// key or namespace, however odd, shares a counter with another
// (HostileKeys); Reset (Reset); that counters expire on their own (Expiry);
// that a fetch costs in proportion to the keys asked (FetchCost); that
// impossible windows are refused with strategy.ErrRejected
// (InvalidWindows); a Hitter's order, weight, undo, infinite limit, hit ID
// rule, atomicity and input checks (Hit, skipped with a log line for a
// store that is not a Hitter); a Slotter's concurrency slots (Slots,
// skipped likewise for a store that is not one): that of 50 concurrent
// acquisitions of max 5 exactly 5 succeed, that acquisitions and releases
// from many goroutines never hold more than max, that a release frees a
// place, that acquiring a held id renews it, that a lease that ends frees
// its place and a renewal keeps it (short leases, waited for by polling),
// that hostile keys and namespaces never share slots, that slots expire
// on their own (with Harness.Slots), input checks and closed stores; a
// Banner's bans (Bans, skipped likewise): that they read back with their
// ends, a later end winning, that lifts remove them, that every change and
// only a change gives a new version and a known version reads no bans,
// that bans end by themselves and leave nothing, hostile keys and input
// checks; a NearFeed's marks (Near, skipped likewise): that a push marks
// a key once, when a diff brings its window's count to Near × Limit, until
// the window's start plus five times its size, and nothing else does,
// a window whose number is not a multiple of four and whose window before
// came near marking nothing; that a
// reader at the version reads nothing new and one behind exactly what was
// marked since; that a retried batch marks once; that counts read with
// the marks are GetCounters'; that a flood of marks is bounded; that
// marks end and leave nothing; hostile keys and input checks; a
// RateBatcher's rates decided alone (see gcra.go, skipped likewise): burst
// then pace, concurrency, cost, expiry and input checks; and
// that calls on a closed store fail with strategy.ErrNotSent (Close).
//
// Benchmarks runs the stores' benchmarks (pushes, fetches, hits and slots) the
// same way, as sub-benchmarks of a benchmark of the store's package.
//
// The tests choose their windows from the real clock, with sizes of an hour
// or more wherever they check counts, and expect the store to expire
// counters by the real clock too. Counts are binary fractions, which every
// store adds exactly, so the checks are exact.
package strategytest

import (
	"testing"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Harness tells the suite how to reach the store under test.
type Harness struct {
	// Open returns a store to test, connected to a server the test owns.
	// It is required. Every call may return a store on the same server, or
	// in the same data set: the suite gives each test namespaces of its
	// own, named strategytest-<test>-<random hex>, so that runs never see
	// each other's counters. The suite closes the stores it opens.
	Open func(t *testing.T) strategy.Store

	// Counters returns how many counters the store holds for a namespace,
	// after dropping the expired ones (a store that purges on a timer
	// purges first). It is required: the expiry test needs it, to show
	// that the store never grows without bound.
	Counters func(t *testing.T, s strategy.Store, namespace string) int

	// Cost, if set, returns a running total of the work the store's
	// server did to read counters (for Redis, keyspace hits plus misses),
	// for the test that a fetch costs in proportion to the keys asked,
	// not to the namespace's size. The suite runs its tests one after the
	// other, so the total may cover the whole server, as long as nothing
	// but the suite uses it meanwhile. Without it that test checks what a
	// fetch returns only.
	Cost func(t *testing.T) int64

	// Slots, if set, returns how many concurrency slots the store holds
	// for a namespace, over all its keys, after dropping the expired ones
	// (a store that purges on a timer purges first), or how many per-key
	// records hold them: what matters is that it falls to zero once every
	// slot's lease has ended, showing that slots do not pile up. Without
	// it, for a strategy.Slotter, that test is skipped with a log line.
	Slots func(t *testing.T, s strategy.Store, namespace string) int

	// Rates, if set, returns how many keys' rate states (TATs) the store
	// holds for a namespace, after dropping those whose TAT has passed (a
	// store that purges on a timer purges first). Without it, for a
	// strategy.RateBatcher, that test is skipped with a log line.
	Rates func(t *testing.T, s strategy.Store, namespace string) int

	// FailPart, if set, makes the part of a strategy.Parted store with
	// more than one part that holds key in namespace fail (a Redis
	// Cluster's master of its slot stops), and returns a function that
	// brings it back and returns once it answers again. Without it, the
	// partial-failure test of Parts is skipped with a log line.
	FailPart func(t *testing.T, namespace, key string) (restore func())
}
