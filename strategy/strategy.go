// Package strategy defines how a namespace's counters reach a central store,
// so that several Caddy nodes enforce one shared limit.
//
// A Strategy is a store's configuration: a Caddy module in the
// rate_limit.strategies namespace (redis and postgres live in the
// subpackages of those names). Loading it checks the settings and connects
// to nothing. The rate_limit app then opens a Store from it, pooled by the
// strategy's StoreKey, so that every namespace and every config (the old
// and the new one during a reload) that names the same settings shares one
// client and one connection pool.
//
// The Store interface is the Go form of the strategy functions of Kong's
// rate-limiting library (push_diffs, get_counters), plus Reset; the
// synchronous mode (sync_rate 0) needs the optional Hitter capability,
// which applies one hit and answers in a single round trip (BatchHitter
// applies several in one), max_concurrent across a fleet the optional
// Slotter capability, which holds concurrency slots as leases that expire
// by the store's clock, and a rate (GCRA) at sync_rate 0 the optional
// RateBatcher capability, a store whose batches of hits decide rates by
// the store's clock with the limits beside them. A SlotBatcher takes
// slots in its batches of hits, so that a request's slot rides the same
// round trip as the hits beside it. Pinger lets the app ask a failing
// store whether it is back.
package strategy

import (
	"context"
	"errors"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// Namespace is the Caddy module namespace of strategies.
const Namespace = "rate_limit.strategies"

// Strategy is the configuration of a store, loaded as a Caddy module. It
// must not connect to anything or start goroutines while it is loaded or
// validated: `caddy validate` provisions modules without starting them.
type Strategy interface {
	// StoreKey identifies the store these settings open: two strategies
	// of the same module with the same key share one Store. It holds every
	// setting that changes what the store connects to or how (addresses,
	// credentials, timeouts, pool sizes), after placeholders are replaced.
	// The key is never logged, so it may contain secrets.
	StoreKey() string

	// OpenStore returns a new store for these settings. It must not block
	// or connect: the store connects when first used, so that a store
	// opened by a config that is only validated never reaches its server.
	OpenStore() (Store, error)

	// ValidateWindow returns an error, naming the size, when the store
	// cannot keep counters of windows of this size (such as windows that
	// are not whole milliseconds). It is called when a config loads.
	ValidateWindow(size time.Duration) error
}

// Store is a central store of window counters. Implementations must be
// safe for concurrent use. Every counter is identified by (namespace, key,
// window size, window start); keys are arbitrary bytes and reach the store
// only as data. Counters expire on their own once no node can read them
// (after twice their window size), so a store never grows without bound.
type Store interface {
	// PushDiffs adds every diff of the batch to the store's counters, in
	// one round trip per batch, at a cost in proportion to the number of
	// diffs. A push that fails may have been applied in part, in full or
	// not at all; pushing the same batch again (same ID) must never apply
	// a diff twice, so that a caller can retry a failed push without
	// counting anything twice.
	PushDiffs(ctx context.Context, batch Batch) error

	// GetCounters returns the store's counts of the window holding now and
	// of the one before it, for every window size of every given key. It
	// costs in proportion to len(keys)*len(sizes), never to the size of
	// the namespace in the store. Counters the store does not hold are
	// omitted, so that a store that lost its data does not erase what the
	// caller knows; a counter that was reset is reported as zero.
	GetCounters(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time) ([]window.Count, error)

	// Reset sets key's counters of the window holding now and of the one
	// before it, for every given size, to zero, and reports them as zero
	// (not missing) to later fetches until they expire, so that every node
	// that fetches the key takes the reset. Diffs pushed after it add to
	// zero.
	Reset(ctx context.Context, namespace, key string, sizes []time.Duration, now time.Time) error

	// Close releases the store's connections. Calls made after it fail
	// with an error that wraps ErrNotSent.
	Close() error
}

// Hitter is a Store that can apply synchronous hits: the capability that
// sync_rate 0 needs. The rate_limit app refuses, when a config loads, a
// synchronous namespace whose store lacks it.
type Hitter interface {
	Store

	// Hit applies one hit to several windows of a key, in one round trip
	// to the store, deciding the way the rate limiter does (Kong's order):
	// in the order given (ascending window size), each window's current
	// count is incremented by its Value and its rate, current +
	// previous*Weight, compared with its Max; once a window's rate exceeds
	// its Max, the windows after it are only read, not incremented. With
	// undo, the increments of a rejected hit are taken back before the call
	// returns (disable_penalty). A store may take a previous count that has
	// settled (its window ended seconds ago) from a recent read instead of
	// reading it again, as the Redis store does, as long as a write that
	// reaches that window late is seen within a second.
	//
	// id, unless empty, names the hit, and the hit ID rule holds: a Hit
	// and a Batch with the same ID are applied at most once between them,
	// for as long as the store remembers the ID: at least MinHitIDLife
	// after the hit (the stores here keep it as long as the hit's counters
	// live, within MinHitIDLife and MaxHitIDLife, so that one record per
	// synchronous hit stays bounded). A caller whose hit
	// failed after it may have been applied pushes the hit's diffs later as
	// a Batch with that ID, which the store applies only if the hit was
	// not. A Hit whose ID was already applied changes nothing and answers
	// with the counts as they are.
	//
	// It returns each window's counts after the hit, in the order given,
	// and the index of the window that rejected the hit, or -1. An error
	// wraps ErrNotSent when the request surely never reached the store, so
	// the caller may count the hit elsewhere without counting it twice, and
	// ErrRejected when the input can never be accepted.
	Hit(ctx context.Context, namespace, key, id string, windows []WindowHit, undo bool) (counts []WindowCounts, rejected int, err error)
}

// BatchHitter is a Hitter that applies several synchronous hits of one
// namespace in one round trip: the capability that a coalescer of
// synchronous hits needs, which sends the hits that arrive while a round
// trip is in flight together in the next one.
type BatchHitter interface {
	Hitter

	// HitBatch applies hits in the order given, each deciding exactly as
	// Hit would if the hits were sent one after the other (Kong's order,
	// undo, the weights and limits of its windows), and fills results[i]
	// for hits[i]; len(results) must be len(hits). Hits of one key see
	// the increments of the hits of that key before them in the batch.
	//
	// id, unless empty, names the batch, and the hit ID rule of Hit holds
	// for the batch as a whole: a HitBatch and a PushDiffs Batch with the
	// same ID are applied at most once between them, per key. So a caller
	// whose batch failed after it may have been applied pushes the
	// increments of the failed hits (at most one diff per window of each,
	// as Hit's caller does, and none of any other hit) as one Batch with
	// that ID, which the store applies only where the HitBatch was not,
	// and retries that Batch, under the ID, until it succeeds. A HitBatch
	// whose ID was already applied (sent twice, or its Batch pushed
	// first) changes nothing and answers every hit with the counts as they
	// are, deciding on them as Hit does then.
	//
	// Each hit is checked as Hit checks its input (CheckHit): a bad hit
	// gets an error that wraps ErrRejected in its own result, is not
	// applied, and does not fail the others. A failure of the store sets
	// Err of the hits it concerns, with the error conventions of Hit
	// (ErrNotSent when their request surely never reached the store): on
	// a Redis Cluster, those of one slot's round trip; elsewhere, all of
	// them. The hits whose Err is nil were applied and decided.
	HitBatch(ctx context.Context, namespace, id string, hits []HitRequest, results []HitResult)
}

// HitAsBatch is Hit for a BatchHitter: the hit as a batch of one, so that
// the store decides every hit with one piece of code. Its errors are
// worded as HitBatch words those of hits[0].
func HitAsBatch(ctx context.Context, b BatchHitter, namespace, key, id string, windows []WindowHit, undo bool) ([]WindowCounts, int, error) {
	var res [1]HitResult
	b.HitBatch(ctx, namespace, id, []HitRequest{{Key: key, Windows: windows, Undo: undo}}, res[:])
	return res[0].Counts, res[0].Rejected, res[0].Err
}

// RateAsBatch decides one request of key under a rate, alone, as a
// batch of one named id, in a RateBatcher's HitBatch.
func RateAsBatch(ctx context.Context, b BatchHitter, namespace, key, id string, r RateRequest) (RateReply, error) {
	var res [1]HitResult
	b.HitBatch(ctx, namespace, id, []HitRequest{{Key: key, Rate: &r}}, res[:])
	return res[0].Rate, res[0].Err
}

// HitRequest is one hit of a HitBatch: the key, windows and undo of a Hit.
type HitRequest struct {
	// Key is the client key.
	Key string
	// Windows are the windows of the hit, as Hit takes them.
	Windows []WindowHit
	// Undo takes the increments of a rejected hit back (disable_penalty).
	Undo bool
	// Rate, when not nil, is a rate (GCRA) that decides the hit before
	// its windows, by the store's clock, as RateBatcher describes. Only a
	// RateBatcher's HitBatch takes it; a hit with a Rate may have no
	// windows.
	Rate *RateRequest
	// Slot, when not nil, is a concurrency slot of Key that the hit takes
	// instead of counting, as SlotBatcher describes: a hit with a Slot has
	// neither windows nor a rate. Only a SlotBatcher's HitBatch takes it.
	Slot *SlotRequest
}

// HitResult is the answer to one hit of a HitBatch.
type HitResult struct {
	// Counts are each window's counts after the hit, as Hit returns them.
	Counts []WindowCounts
	// Rejected is the index of the window that rejected the hit, or -1,
	// as Hit returns it.
	Rejected int
	// Rate is the answer of the hit's rate, for a hit with one: OK says
	// whether the rate admitted the hit (a window may still have rejected
	// it, and then the rate's turn was given back), TAT is the key's TAT
	// after the hit, and Now the store's clock when it decided.
	Rate RateReply
	// Slot is the answer of the hit's slot, for a hit with one.
	Slot SlotReply
	// Err, when not nil, says that the hit was refused or failed: Counts
	// and Rejected then mean nothing.
	Err error
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
	// Rates are turns of rates to take (see RateBatcher): only a
	// RateBatcher's PushDiffs takes a batch with any.
	Rates []RateDiff
	// Near, when above 0, is the share of a diff's Limit at which a
	// NearFeed marks the diff's key near (see NearFeed); other stores
	// ignore it.
	Near float64
}

// ErrRejected is wrapped by the errors a store returns for input it can
// never accept, such as a window size it cannot express. Retrying such a
// push cannot succeed, so callers drop it instead.
var ErrRejected = errors.New("rejected by the strategy")

// ErrNotSent is wrapped by the errors of requests that surely never reached
// the store (it could not be dialed, or the store is closed). Any other
// failure may have been applied.
var ErrNotSent = errors.New("request not sent to the store")

// OpenStore returns the store that open returns, as a Store: the
// OpenStore of a Strategy whose own Open returns its concrete store type.
// It never returns a nil *S inside a non-nil Store: an error comes with a
// nil Store.
func OpenStore[S Store](open func() (S, error)) (Store, error) {
	s, err := open()
	if err != nil {
		return nil, err
	}
	return s, nil
}
