package postgres

import (
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// Bounds of the bytes stored in the tables' primary keys: a B-tree entry
// must fit in a third of a page (about 2,700 bytes). Longer namespaces,
// keys and IDs are stored as their first bytes followed by their SHA-256,
// one byte longer than the bound (see stored).
const (
	maxStoredNamespace = 256
	maxStoredKey       = 1024
	maxStoredID        = 256
)

// ErrInvalidWindow is wrapped by the errors of operations given a window
// the store does not take: a size that is not a positive whole number of
// milliseconds, or a start that is not a multiple of the size. It is
// strategy.ErrInvalidWindow, which wraps strategy.ErrRejected, as such a
// request can never succeed.
var ErrInvalidWindow = strategy.ErrInvalidWindow

// PushDiffs adds the diffs of a batch to their counters, at most once per
// batch ID and namespace: a batch whose ID was applied before (pushed
// before, or a synchronous hit of that ID) applies nothing and succeeds.
// It is one statement, so one round trip (plus, once per pooled
// connection, one to prepare it), applied all at once or not at all,
// whatever the number of diffs. Diffs with a zero or non-finite value add
// nothing and are dropped, and diffs of windows that have expired (start
// + 2*size <= now) are skipped; a batch of which nothing is left sends
// nothing and records no ID. A batch without an ID, with a window that is
// not valid or with a Near that strategy.CheckNear refuses, is refused
// whole, before anything is sent, with an error that wraps
// strategy.ErrRejected.
//
// A batch whose Near is above 0 also marks, in the same statement, the
// keys whose diffs bring their counters near their limits (see
// strategy.NearFeed and markSQL); a push none of whose diffs could mark
// (Near is 0, or no diff adds to a window with a Limit) is the statement
// it would be without the feed.
//
// An error wraps strategy.ErrNotSent when the batch surely never reached
// the server. Any other error may come after PostgreSQL applied it:
// pushing it again with the same ID applies it only if it was not.
func (s *Store) PushDiffs(ctx context.Context, b strategy.Batch) (err error) {
	defer errs.PushDiffs(&err, b)
	if b.ID == "" {
		return errs.Rejected("the batch has no ID")
	}
	for i := range b.Diffs {
		if err := strategy.CheckWindow(b.Diffs[i].Size, b.Diffs[i].Start); err != nil {
			return fmt.Errorf("diffs[%d]: %w", i, err)
		}
	}
	if err := strategy.CheckRateDiffs(b.Rates); err != nil {
		return err
	}
	if err := strategy.CheckNear(b.Near); err != nil {
		return err
	}
	now := s.now()
	p := newPushArgs(b, now.UnixNano())
	if len(p.values) == 0 && len(b.Rates) == 0 {
		return nil
	}
	// The ID's record lives as long as the counters, and at least
	// strategy.MinBatchIDLife; a record outlives its expiry until the next
	// purge.
	idExpires := max(p.last, now.Add(strategy.MinBatchIDLife).UnixMilli())
	args := []any{stored(b.Namespace, maxStoredNamespace), stored(b.ID, maxStoredID), idExpires, p.keys, p.sizes, p.starts, p.values}
	query, marking := s.sql.push, s.sql.nearPush
	var parts []*part
	if len(b.Rates) > 0 {
		rkeys, rwins, rincs := rateDiffArgs(b.Rates)
		query, marking, args, parts = s.sql.pushRates, s.sql.nearPushRates, append(args, rkeys, rwins, rincs), []*part{&s.ratePart}
	}
	if m := p.near; m != nil && len(m.counters) > 0 {
		on, err := s.nearOn(ctx)
		if err != nil {
			return err
		}
		if on { // otherwise the role may not make the feed: a push as before
			query, args = marking, append(args, m.counters, m.keys, m.after, m.values, m.at, m.until)
		}
	}
	conn, err := s.acquire(ctx, parts...)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, query, args...)
	return s.sent(err)
}

// pushArgs are the diffs of a batch as pushSQL takes them, one counter
// each, with the candidates to mark when the batch's Near is above 0,
// and the latest expiry of the counters.
type pushArgs struct {
	keys          [][]byte
	sizes, starts []int64
	values        []float64
	near          *nearArgs
	last          int64
}

// newPushArgs returns the diffs of b that are kept at now (Unix
// nanoseconds), sorted by counter, so that the diffs of one counter are
// neighbours, to be summed (an upsert may not touch a row twice), and
// the rows are locked in a set order (see pushSQL); the diffs of a
// counter stay in the batch's order, in which they mark.
func newPushArgs(b strategy.Batch, now int64) *pushArgs {
	order := make([]int32, 0, len(b.Diffs))
	for i := range b.Diffs {
		if keep(&b.Diffs[i], now) {
			order = append(order, int32(i))
		}
	}
	slices.SortFunc(order, func(i, j int32) int {
		x, y := &b.Diffs[i], &b.Diffs[j]
		return cmp.Or(strings.Compare(x.Key, y.Key), cmp.Compare(x.Size, y.Size), cmp.Compare(x.Start, y.Start), cmp.Compare(i, j))
	})
	p := &pushArgs{last: math.MinInt64, sizes: make([]int64, 0, len(order)), starts: make([]int64, 0, len(order)), values: make([]float64, 0, len(order))}
	if b.Near > 0 {
		p.near = new(nearArgs)
	}
	var prev *window.Diff
	firsts := make([]int32, 0, len(order)) // the first diff of each counter
	for _, i := range order {
		d := &b.Diffs[i]
		if prev == nil || d.Key != prev.Key || d.Size != prev.Size || d.Start != prev.Start {
			prev, firsts = d, append(firsts, i)
			sizeMs, startMs := int64(d.Size/time.Millisecond), d.Start/int64(time.Millisecond)
			p.sizes, p.starts, p.values = append(p.sizes, sizeMs), append(p.starts, startMs), append(p.values, 0)
			p.last = max(p.last, expiresAtMs(sizeMs, startMs))
		}
		p.values[len(p.values)-1] += d.Value
		if p.near != nil {
			p.near.add(b.Near, d, len(p.values), p.values[len(p.values)-1])
		}
	}
	p.keys = storedKeys(len(firsts), func(i int) string { return b.Diffs[firsts[i]].Key })
	if p.near != nil {
		p.near.settle(p.values)
	}
	return p
}

// storedKeys returns n keys as the tables hold them (see appendStored),
// in one buffer: one allocation, not one per key. None is nil, so that an
// empty key is not sent as NULL.
func storedKeys(n int, key func(i int) string) [][]byte {
	size := 0
	for i := range n {
		size += min(len(key(i)), maxStoredKey+1)
	}
	buf := make([]byte, 0, size)
	keys := make([][]byte, n)
	for i := range keys {
		at := len(buf)
		buf = appendStored(buf, key(i), maxStoredKey)
		keys[i] = buf[at:len(buf):len(buf)]
	}
	return keys
}

// rateDiffArgs returns the rates of a batch as ratedSQL takes them:
// each TAT once, sorted by key and window, with the sum of its turns'
// increments in microseconds (forced turns add up: see ratedSQL).
func rateDiffArgs(rates []strategy.RateDiff) (keys [][]byte, windows, incs []int64) {
	sorted := slices.Clone(rates)
	slices.SortFunc(sorted, func(x, y strategy.RateDiff) int {
		return cmp.Or(strings.Compare(x.Key, y.Key), cmp.Compare(x.Window, y.Window))
	})
	for i, r := range sorted {
		if i > 0 && r.Key == sorted[i-1].Key && r.Window == sorted[i-1].Window {
			incs[len(incs)-1] += r.Increment.Microseconds()
			continue
		}
		keys = append(keys, stored(r.Key, maxStoredKey))
		windows = append(windows, r.Window.Milliseconds())
		incs = append(incs, r.Increment.Microseconds())
	}
	return keys, windows, incs
}

// windowsAt returns the windows that hold now and the ones before them,
// of every size, in the order of sizes (current, previous, current, ...):
// their sizes and starts in milliseconds, as the tables hold them.
func windowsAt(sizes []time.Duration, now time.Time) (sizesMs, startsMs []int64) {
	at := now.UnixNano()
	sizesMs = make([]int64, 0, 2*len(sizes))
	startsMs = make([]int64, 0, 2*len(sizes))
	for _, size := range sizes {
		cur := window.Start(at, size)
		sizeMs := int64(size / time.Millisecond)
		sizesMs = append(sizesMs, sizeMs, sizeMs)
		startsMs = append(startsMs, cur/int64(time.Millisecond), (cur-int64(size))/int64(time.Millisecond))
	}
	return sizesMs, startsMs
}

// keep reports whether a diff of a valid window is pushed at now (Unix
// nanoseconds): it adds something, to a window that has not expired.
func keep(d *window.Diff, now int64) bool {
	return d.Value != 0 && !math.IsNaN(d.Value) && !math.IsInf(d.Value, 0) && d.Start+2*int64(d.Size) > now
}

// GetCounters returns the counts of the current and previous windows, at
// now, of every size of every key, leaving out the counters the table does
// not hold (never written, or purged). A counter that was reset is held,
// with the value zero. It is one query, one round trip, that looks up
// 2*len(keys)*len(sizes) rows by primary key, whatever the size of the
// table. A size that is not valid is refused with an error that wraps
// strategy.ErrRejected. An error wraps strategy.ErrNotSent when the query
// surely never reached the server; a read changes nothing anyway.
func (s *Store) GetCounters(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time) (_ []window.Count, err error) {
	defer errs.GetCounters(&err, namespace, len(keys))
	if err := strategy.CheckSizes(sizes); err != nil {
		return nil, err
	}
	if len(keys) == 0 || len(sizes) == 0 {
		return nil, nil
	}
	f := newFetchArgs(keys, sizes, now)

	conn, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	counts, err := f.scan(conn.Query(ctx, s.sql.fetch, stored(namespace, maxStoredNamespace), f.keys, f.sizes, f.starts))
	return counts, s.sent(err)
}

// fetchArgs are the arguments of fetchSQL but the namespace: the keys as
// the table holds them, and the windows asked (see windowsAt); and what
// was asked, to read the reply.
type fetchArgs struct {
	keys          [][]byte
	sizes, starts []int64
	asked         []string
	askedSizes    []time.Duration
}

// newFetchArgs returns the arguments of a fetch of keys' windows of sizes
// at now.
func newFetchArgs(keys []string, sizes []time.Duration, now time.Time) *fetchArgs {
	f := &fetchArgs{keys: storedKeys(len(keys), func(i int) string { return keys[i] }), asked: keys, askedSizes: sizes}
	f.sizes, f.starts = windowsAt(sizes, now)
	return f
}

// scan reads the reply of a fetch made with f as counts, and closes its
// rows. Its errors are the query's own, for sent to classify.
func (f *fetchArgs) scan(rows pgx.Rows, err error) ([]window.Count, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var (
		counts             []window.Count
		i, sizeMs, startMs int64
		v                  float64
	)
	for rows.Next() {
		if err := rows.Scan(&i, &sizeMs, &startMs, &v); err != nil {
			return nil, err
		}
		if i < 1 || int(i) > len(f.asked) {
			return nil, fmt.Errorf("the fetch query returned the key index %d, out of range", i)
		}
		// Which window asked for is it? Few are asked: a loop will do.
		j := 0
		for j < len(f.sizes) && (f.sizes[j] != sizeMs || f.starts[j] != startMs) {
			j++
		}
		if j < len(f.sizes) { // else a size of one window with the start of another
			counts = append(counts, window.Count{Key: f.asked[i-1], Size: f.askedSizes[j/2], Start: startMs * int64(time.Millisecond), Value: v})
		}
	}
	return counts, rows.Err()
}

// Reset sets key's counters of the window holding now and of the one
// before it, of every given size, to zero: they are then held, and fetched
// as zero, until they expire, and diffs pushed later add to zero. It is
// one statement, one round trip. A size that is not valid is refused,
// before anything is reset, with an error that wraps strategy.ErrRejected.
func (s *Store) Reset(ctx context.Context, namespace, key string, sizes []time.Duration, now time.Time) (err error) {
	defer errs.Reset(&err, namespace)
	if err := strategy.CheckSizes(sizes); err != nil {
		return err
	}
	// Each size once: an upsert may not touch a row twice.
	sizes = slices.Compact(slices.Sorted(slices.Values(sizes)))
	if len(sizes) == 0 {
		return nil
	}
	winSizes, winStarts := windowsAt(sizes, now)

	conn, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, s.sql.reset,
		stored(namespace, maxStoredNamespace), stored(key, maxStoredKey), winSizes, winStarts)
	return s.sent(err)
}

// Hit applies one synchronous hit as a batch of one (see HitBatch, and
// strategy.Hitter for the contract and the hit ID rule).
func (s *Store) Hit(ctx context.Context, namespace, key, id string, windows []strategy.WindowHit, undo bool) ([]strategy.WindowCounts, int, error) {
	return strategy.HitAsBatch(ctx, s, namespace, key, id, windows, undo)
}

// hitID returns the ID argument of the batch function, stored, or nil (NULL)
// for no ID, and when its record expires: as long as the latest of the
// counters, which expires at last (Unix milliseconds), but at least
// strategy.MinHitIDLife and at most strategy.MaxHitIDLife from now.
func (s *Store) hitID(id string, last int64) ([]byte, int64) {
	if id == "" {
		return nil, 0
	}
	nowMs := s.now().UnixMilli()
	return stored(id, maxStoredID), nowMs + min(max(last-nowMs, strategy.MinHitIDLife.Milliseconds()), strategy.MaxHitIDLife.Milliseconds())
}

// expiresAtMs returns when a counter of a window expires, in Unix
// milliseconds: once it can no longer be the previous window, plus a
// margin. pushSQL and the batch function compute the same in SQL.
func expiresAtMs(sizeMs, startMs int64) int64 {
	return startMs + 2*sizeMs + expiryMarginMs
}

// stored returns s as the tables hold it, in a slice of its own that is
// never nil (nil would be NULL): see appendStored.
func stored(s string, bound int) []byte {
	return appendStored(make([]byte, 0, min(len(s), bound+1)), s, bound)
}

// appendStored appends s as the tables hold it: s itself, up to bound
// bytes; a longer s as its first bound+1-32 bytes followed by its SHA-256,
// bound+1 bytes in all. So a long value never equals a short one, and two
// long values share one only if SHA-256 collides.
func appendStored(buf []byte, s string, bound int) []byte {
	if len(s) <= bound {
		return append(buf, s...)
	}
	buf = append(buf, s[:bound+1-sha256.Size]...)
	sum := sha256.Sum256([]byte(s))
	return append(buf, sum[:]...)
}
