package postgres

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// HitBatch applies several synchronous hits of a namespace, atomically and
// in order, each deciding as Hit would if they were sent one after the
// other (see strategy.BatchHitter for the contract), in one call of the
// table's batch hit function: one round trip (plus, once per pooled
// connection, one to prepare the call; the first batch of a store also
// creates the function if it is missing: see newParts). A counter
// that several hits share costs one read and two writes for the whole
// batch (one upsert locks it, or makes it at 0, and one writes its final
// count): see hitsBodySQL. A batch of one hit is sent as Hit sends it.
//
// A non-empty id names the batch, and shares its record with a batch of
// diffs of the same ID and namespace, as a hit's ID does: the two are
// applied at most once between them, each whole or not at all, so the
// batch of diffs that carries the hits of a failed HitBatch is applied
// only if the HitBatch was not, whatever diffs it holds. A batch whose ID
// was applied before increments nothing and decides every hit on the
// counts as they are. The record lives as a hit's does, as long as the
// latest of the batch's counters within one and two minutes.
//
// A hit with a slot (see strategy.SlotBatcher) is a call of the slots
// table's acquire function, in the same pipeline, after the hits' call:
// PostgreSQL runs the pipeline as one transaction.
//
// Each hit is checked as Hit checks its input; a bad one gets an error that
// wraps strategy.ErrRejected in its result, and the others are sent
// without it. A failure fails every hit of the batch, with an error that
// wraps strategy.ErrNotSent when the call surely never reached the server.
func (s *Store) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	good := errs.CheckBatch(namespace, id, hits, results)
	if len(good) == 0 {
		return
	}
	counted, slots := strategy.SplitSlots(hits, good)
	if err := s.hitBatch(ctx, namespace, id, hits, counted, slots, results); err != nil {
		errs.FailBatch(results, namespace, good, err)
	}
}

// hitBatch sends the good hits of a batch, those that count (good) and
// those that take slots, and fills their results.
func (s *Store) hitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, good, slots []int, results []strategy.HitResult) error {
	a := newBatchArgs(hits, good)
	var parts []*part
	if len(good) > 0 {
		parts = append(parts, &s.batchPart)
	}
	if len(a.rates.keys) > 0 {
		parts = append(parts, &s.ratePart)
	}
	if len(slots) > 0 {
		parts = append(parts, &s.slotPart)
	}
	conn, err := s.acquire(ctx, parts...)
	if err != nil {
		return err
	}
	defer conn.Release()
	idArg, idExpires := s.hitID(id, a.last)
	args := []any{stored(namespace, maxStoredNamespace), idArg, idExpires,
		a.ckeys, a.csizes, a.cstarts, a.cwrite, a.undo, a.nwin, a.cur, a.prev, a.values, a.maxes, a.weights,
		a.rates.keys, a.rates.windows, a.rates.hitRate, a.rates.inc, a.rates.tol}
	var reply batchReply
	if len(slots) == 0 {
		err = reply.scan(conn.QueryRow(ctx, s.sql.hitBatch, args...))
	} else {
		// One pipeline, which PostgreSQL runs as one transaction: the
		// hits' call, then the slots'.
		b := &pgx.Batch{}
		if len(good) > 0 {
			b.Queue(s.sql.hitBatch, args...).QueryRow(reply.scan)
		}
		s.queueSlots(b, namespace, hits, slots, results)
		err = conn.SendBatch(ctx, b).Close()
	}
	if err != nil {
		return s.sent(err)
	}
	if len(good) == 0 {
		return nil
	}
	return reply.fill(a, hits, good, results)
}

// batchCounter is one counter of a batch of hits.
type batchCounter struct {
	key             string
	sizeMs, startMs int64
}

// batchArgs are the arguments of the batch hit function for the hits
// that count (see hitsBodySQL): the counters, each once, sorted by key,
// size and start, as pushes sort theirs, so that both lock shared rows
// in one order; the hits' windows, flattened, which refer to them by
// 1-based index; the rates; and the latest expiry of the counters.
type batchArgs struct {
	ckeys                  [][]byte
	csizes, cstarts        []int64
	cwrite, undo           []bool
	nwin, cur, prev        []int32
	values, maxes, weights []float64
	rates                  batchRates
	last                   int64
}

func newBatchArgs(hits []strategy.HitRequest, good []int) *batchArgs {
	// Arrays that are never nil: NULL would make the function fail.
	a := &batchArgs{undo: make([]bool, len(good)), nwin: make([]int32, len(good)), last: math.MinInt64,
		ckeys: [][]byte{}, csizes: []int64{}, cstarts: []int64{}, cur: []int32{}, prev: []int32{},
		values: []float64{}, maxes: []float64{}, weights: []float64{}}
	var refs []batchCounter // each window's current and previous counters
	for x, i := range good {
		a.undo[x], a.nwin[x] = hits[i].Undo, int32(len(hits[i].Windows))
		for _, w := range hits[i].Windows {
			sizeMs, startMs := int64(w.Size/time.Millisecond), w.Start/int64(time.Millisecond)
			refs = append(refs, batchCounter{hits[i].Key, sizeMs, startMs}, batchCounter{hits[i].Key, sizeMs, startMs - sizeMs})
			a.values, a.maxes, a.weights = append(a.values, w.Value), append(a.maxes, w.Max), append(a.weights, w.Weight)
			a.last = max(a.last, expiresAtMs(sizeMs, startMs))
		}
	}
	counters, index := sortedSet(refs)
	for _, c := range counters {
		a.ckeys, a.csizes, a.cstarts = append(a.ckeys, stored(c.key, maxStoredKey)), append(a.csizes, c.sizeMs), append(a.cstarts, c.startMs)
	}
	a.cwrite = make([]bool, len(counters))
	for w := range a.values {
		a.cur, a.prev = append(a.cur, index(refs[2*w])), append(a.prev, index(refs[2*w+1]))
		a.cwrite[a.cur[w]-1] = a.cwrite[a.cur[w]-1] || a.values[w] != 0
	}
	a.rates = newBatchRates(hits, good)
	return a
}

// batchReply is what the batch hit function answers.
type batchReply struct {
	rej        []int32
	curs, prvs []float64
	rateOK     []bool
	tats       []int64
	nowUs      *int64
}

func (r *batchReply) scan(row pgx.Row) error {
	return row.Scan(&r.rej, &r.curs, &r.prvs, &r.rateOK, &r.tats, &r.nowUs)
}

// fill sets the results of the good hits from the reply, once it checked
// that the reply matches the hits.
func (r *batchReply) fill(a *batchArgs, hits []strategy.HitRequest, good []int, results []strategy.HitResult) error {
	nw := len(a.values)
	if len(a.rates.keys) > 0 && (len(r.rateOK) != len(good) || len(r.tats) != len(good) || r.nowUs == nil) {
		return fmt.Errorf("the batch hit function returned %d rate decisions, %d TATs and a time of %v, for %d hits", len(r.rateOK), len(r.tats), r.nowUs, len(good))
	}
	if len(r.rej) != len(good) || len(r.curs) != nw || len(r.prvs) != nw {
		return fmt.Errorf("the batch hit function returned %d decisions and %d and %d counts, for %d hits of %d windows", len(r.rej), len(r.curs), len(r.prvs), len(good), nw)
	}
	at := 0
	for x, i := range good {
		n := len(hits[i].Windows)
		if r.rej[x] < -1 || int(r.rej[x]) >= n {
			return fmt.Errorf("the batch hit function returned window %d for hits[%d], of %d windows", r.rej[x], i, n)
		}
		counts := make([]strategy.WindowCounts, n)
		for w := range counts {
			counts[w] = strategy.WindowCounts{Current: r.curs[at+w], Previous: r.prvs[at+w]}
		}
		at += n
		results[i] = strategy.HitResult{Counts: counts, Rejected: int(r.rej[x])}
		if a.rates.hitRate != nil && a.rates.hitRate[x] > 0 {
			results[i].Rate = strategy.RateReply{OK: r.rateOK[x], TAT: r.tats[x] * 1e3, Now: *r.nowUs * 1e3}
		}
	}
	return nil
}

// queueSlots queues the acquisitions of the slots of the hits at the
// given indexes, which set their results' Slot. They take their keys'
// advisory locks in ascending order, as releases and renewals do, so
// that two batches never deadlock on them; the slots of one key keep the
// batch's order.
func (s *Store) queueSlots(b *pgx.Batch, namespace string, hits []strategy.HitRequest, slots []int, results []strategy.HitResult) {
	locks := make(map[int]int64, len(slots))
	for _, i := range slots {
		locks[i] = s.names.slotLock(namespace, hits[i].Key)
	}
	slices.SortStableFunc(slots, func(a, b int) int { return cmp.Compare(locks[a], locks[b]) })
	for _, i := range slots {
		b.Queue(s.sql.acquire, s.acquireArgs(namespace, hits[i].Key, *hits[i].Slot, locks[i])...).QueryRow(func(row pgx.Row) error {
			return scanSlot(row, &results[i].Slot)
		})
	}
}

// batchRates are the rates of a batch's hits, as the batch hit function
// takes them: the TATs, each once, sorted by key and window (the order the
// function locks them in), and for each good hit the 1-based index of its
// TAT (0 for none) with its increment and tolerance in microseconds. A
// batch without rates has none of them, which go as NULL.
type batchRates struct {
	keys     [][]byte
	windows  []int64
	hitRate  []int32
	inc, tol []int64
}

func newBatchRates(hits []strategy.HitRequest, good []int) batchRates {
	var tats []batchCounter // with the window's size, and no start
	for _, i := range good {
		if r := hits[i].Rate; r != nil {
			tats = append(tats, batchCounter{key: hits[i].Key, sizeMs: r.Window.Milliseconds()})
		}
	}
	if len(tats) == 0 {
		return batchRates{}
	}
	tats, index := sortedSet(tats)
	br := batchRates{hitRate: make([]int32, len(good)), inc: make([]int64, len(good)), tol: make([]int64, len(good))}
	for _, t := range tats {
		br.keys, br.windows = append(br.keys, stored(t.key, maxStoredKey)), append(br.windows, t.sizeMs)
	}
	for x, i := range good {
		if r := hits[i].Rate; r != nil {
			br.hitRate[x] = index(batchCounter{key: hits[i].Key, sizeMs: r.Window.Milliseconds()})
			br.inc[x], br.tol[x] = r.Increment.Microseconds(), r.Tolerance.Microseconds()
		}
	}
	return br
}

// sortedSet returns the counters cs, each once, sorted by key, size and
// start, and a function that returns the 1-based index (as SQL arrays
// count) of one of them in it.
func sortedSet(cs []batchCounter) ([]batchCounter, func(batchCounter) int32) {
	compare := func(x, y batchCounter) int {
		return cmp.Or(strings.Compare(x.key, y.key), cmp.Compare(x.sizeMs, y.sizeMs), cmp.Compare(x.startMs, y.startMs))
	}
	set := slices.Clone(cs)
	slices.SortFunc(set, compare)
	set = slices.Compact(set)
	return set, func(c batchCounter) int32 {
		j, _ := slices.BinarySearchFunc(set, c, compare)
		return int32(j + 1)
	}
}
