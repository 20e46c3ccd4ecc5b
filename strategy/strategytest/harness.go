// Package strategytest is the conformance suite of rate-limit stores: the
// promises of strategy.Store and strategy.Hitter, checked against a real
// store. Every store the project ships runs it (memory, Redis standalone,
// Redis Cluster, PostgreSQL), and so can a third-party one:
//
//	func TestConformance(t *testing.T) {
//		strategytest.Run(t, strategytest.Harness{Open: openMyStore})
//	}
package strategytest

import (
	"testing"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Harness tells the suite how to reach the store under test.
type Harness struct {
	// Open returns a store to test, connected to a server the test owns.
	// Every call may return a store on the same server: the suite gives
	// each test its own namespaces. The suite closes the stores it opens.
	Open func(t *testing.T) strategy.Store

	// Counters returns how many counters the store holds for a namespace,
	// after dropping the expired ones (a store that purges on a timer
	// purges first). The expiry test needs it.
	Counters func(t *testing.T, s strategy.Store, namespace string) int

	// Cost, if set, returns a running total of the work the store's
	// server did to read counters (for Redis, keyspace hits plus misses),
	// for the test that a fetch costs in proportion to the keys asked,
	// not to the namespace's size. Without it that test checks what a
	// fetch returns only.
	Cost func(t *testing.T) int64
}
