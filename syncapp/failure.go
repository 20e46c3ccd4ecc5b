package syncapp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// FailurePolicy is what a namespace's nodes do while they cannot reach
// its store (on_store_failure).
type FailurePolicy string

const (
	// FailAllow enforces every limit on the node's own counts: a client
	// spread over N nodes may get up to N times its limit meanwhile.
	FailAllow FailurePolicy = "allow"
	// FailShare enforces on each node its share of every limit: the
	// limit divided by the number of nodes the fleet had when the store
	// was last reached, so that the fleet stays within the limit.
	FailShare FailurePolicy = "share"
	// FailDeny rejects every request of the namespace.
	FailDeny FailurePolicy = "deny"
)

// ParseFailurePolicy parses on_store_failure's value; empty is allow.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch p := FailurePolicy(strings.ToLower(strings.TrimSpace(s))); p {
	case "":
		return FailAllow, nil
	case FailAllow, FailShare, FailDeny:
		return p, nil
	}
	return "", fmt.Errorf("on_store_failure: unknown policy %q: want allow, share or deny", s)
}

// validateFailurePolicy checks a namespace's on_store_failure against its
// mode: only a namespace with a store can lose it. That share has a
// store that counts the fleet's nodes is checked as the store opens.
func validateFailurePolicy(raw string, mode Mode) (FailurePolicy, error) {
	p, err := ParseFailurePolicy(raw)
	if err != nil {
		return "", err
	}
	if raw != "" && mode == Local {
		return "", fmt.Errorf("on_store_failure: a local namespace has no store to lose; set sync_rate and a strategy, or remove on_store_failure %s", raw)
	}
	return p, nil
}

// denyRetryAfter is the Retry-After of a request that deny rejected: the
// longest a node waits between two probes of a failing store.
const denyRetryAfter = maxBackoff

// Attendance of the fleet's roster (share): a node attends at most every
// attendEvery (or sync_rate, if longer), and stays a member for
// attendTTLRuns of those and a margin, so that a node that misses a run
// or two still counts and one that stopped leaves within seconds.
const (
	attendEvery   = time.Second
	attendTTLRuns = 3
	attendMargin  = 2 * time.Second
)

// fleetMembers is what a node knows of its namespace's fleet size, which
// it learns by attending the store's roster (strategy.Roster): part of
// the namespace's fleetState, so it outlives reloads.
type fleetMembers struct {
	id       string       // this node's member ID: random, for the life of the fleet state
	count    atomic.Int64 // the fleet's size when last learned, 0 before
	attended atomic.Int64 // when this node last attended, in Unix nanoseconds
}

func newFleetMembers() *fleetMembers {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails
	return &fleetMembers{id: hex.EncodeToString(b[:])}
}

// attend records this node in the roster when it has not for every (or
// longer), and learns the fleet's size. It reports whether it asked the
// store.
func (f *fleetMembers) attend(ctx context.Context, roster strategy.Roster, namespace string, every time.Duration) (asked bool, err error) {
	now := time.Now().UnixNano()
	if now-f.attended.Load() < int64(every) {
		return false, nil
	}
	n, err := roster.Attend(ctx, namespace, f.id, attendTTLRuns*every+attendMargin)
	if err != nil {
		return true, err
	}
	f.count.Store(int64(n))
	f.attended.Store(now)
	return true, nil
}

// size returns the fleet's size when last learned, or 0.
func (f *fleetMembers) size() int { return int(f.count.Load()) }

// shareOnFailure is a config's share policy as its namespace's health
// applies it: the zone namespace whose decisions weigh this node's
// unsynced counts by the fleet's size while the store is away.
type shareOnFailure struct {
	counters *window.Namespace
	members  *fleetMembers
}

// shareOf returns the share of a concurrency limit one node of a fleet of
// n keeps to: max/n rounded down, so that the fleet stays within max.
func shareOf(max, n int) int {
	if n <= 1 {
		return max
	}
	return max / n
}

// shareOnFailure returns the share policy of the namespace for its
// health to apply, or nil when its on_store_failure is not share.
func (n *Namespace) shareOnFailure() *shareOnFailure {
	if n.onFailure != FailShare || n.store == nil {
		return nil
	}
	return &shareOnFailure{counters: n.counters, members: n.members}
}

// OnStoreFailure returns what the namespace does while it cannot reach
// its store.
func (n *Namespace) OnStoreFailure() FailurePolicy { return n.onFailure }

// Refuses reports whether the namespace rejects key's requests now,
// without counting them: its on_store_failure is deny and the node
// cannot reach the store, or on a store made of parts (a Redis Cluster)
// the part that holds key. The wait is how long a client should wait
// before it tries again (Retry-After).
func (n *Namespace) Refuses(key string) (refused bool, wait time.Duration) {
	if n.onFailure != FailDeny || !n.health.downFor(key) {
		return false, 0
	}
	return true, denyRetryAfter
}

// FleetSize returns the number of nodes of the namespace's fleet when the
// node last learned it (on_store_failure share), or 0.
func (n *Namespace) FleetSize() int { return n.members.size() }

// localConcurrency returns how many requests of a key this node admits at
// once when it decides alone: max, or under share while the store is away
// its share of max.
func (n *Namespace) localConcurrency(key string, max int) int {
	if n.onFailure == FailShare && n.health.downFor(key) {
		return shareOf(max, n.members.size())
	}
	return max
}
