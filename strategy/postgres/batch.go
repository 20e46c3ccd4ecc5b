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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// HitBatch applies several synchronous hits of a namespace, atomically and
// in order, each deciding as Hit would if they were sent one after the
// other (see strategy.BatchHitter for the contract), in one call of the
// table's batch hit function: one round trip (plus, once per pooled
// connection, one to prepare the call; the first batch of a store also
// creates the function if it is missing: see batchSchemaSQL). A counter
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

// batchCounter is one counter of a batch of hits.
type batchCounter struct {
	key             string
	sizeMs, startMs int64
	write           bool // some hit increments it
}

// hitBatch sends the good hits of a batch, those that count (good) and
// those that take slots, and fills their results.
func (s *Store) hitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, good, slots []int, results []strategy.HitResult) error {
	// The counters, each once, then sorted by key, size and start, as
	// pushes sort theirs, so that both lock shared rows in one order.
	var (
		counters []batchCounter
		index    = make(map[batchCounter]int)
		refs     []int // for each window, its current and previous counters
		last     = int64(math.MinInt64)
		nw       int
	)
	counter := func(c batchCounter) int {
		j, ok := index[c]
		if !ok {
			j = len(counters)
			index[c] = j
			counters = append(counters, c)
		}
		return j
	}
	for _, i := range good {
		for _, w := range hits[i].Windows {
			sizeMs, startMs := int64(w.Size/time.Millisecond), w.Start/int64(time.Millisecond)
			cur := counter(batchCounter{key: hits[i].Key, sizeMs: sizeMs, startMs: startMs})
			counters[cur].write = counters[cur].write || w.Value != 0
			refs = append(refs, cur, counter(batchCounter{key: hits[i].Key, sizeMs: sizeMs, startMs: startMs - sizeMs}))
			last = max(last, expiresAtMs(sizeMs, startMs))
			nw++
		}
	}
	order := make([]int, len(counters))
	for j := range order {
		order[j] = j
	}
	slices.SortFunc(order, func(a, b int) int {
		x, y := &counters[a], &counters[b]
		return cmp.Or(strings.Compare(x.key, y.key), cmp.Compare(x.sizeMs, y.sizeMs), cmp.Compare(x.startMs, y.startMs))
	})
	rank := make([]int32, len(counters)) // 1-based, as SQL arrays count
	var (
		ckeys   = make([][]byte, len(counters))
		csizes  = make([]int64, len(counters))
		cstarts = make([]int64, len(counters))
		cwrite  = make([]bool, len(counters))
	)
	for r, j := range order {
		c := &counters[j]
		rank[j] = int32(r + 1)
		ckeys[r], csizes[r], cstarts[r], cwrite[r] = stored(c.key, maxStoredKey), c.sizeMs, c.startMs, c.write
	}
	var (
		undo    = make([]bool, len(good))
		nwin    = make([]int32, len(good))
		cur     = make([]int32, 0, nw)
		prev    = make([]int32, 0, nw)
		values  = make([]float64, 0, nw)
		maxes   = make([]float64, 0, nw)
		weights = make([]float64, 0, nw)
	)
	for x, i := range good {
		undo[x], nwin[x] = hits[i].Undo, int32(len(hits[i].Windows))
		for _, w := range hits[i].Windows {
			cur, prev = append(cur, rank[refs[2*len(cur)]]), append(prev, rank[refs[2*len(prev)+1]])
			values, maxes, weights = append(values, w.Value), append(maxes, w.Max), append(weights, w.Weight)
		}
	}
	idArg, idExpires := s.hitID(id, last)
	rt := newBatchRates(hits, good)
	if len(rt.keys) > 0 {
		if err := s.ensurePart(ctx, s.rateSQL.schema, "the rates tables", &s.ratesReady); err != nil {
			return err
		}
	}

	if len(slots) > 0 {
		if err := s.ensurePart(ctx, s.sql.slotSchema, "the slots table", &s.slotsReady); err != nil {
			return err
		}
	}

	conn, err := s.acquireBatch(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var (
		rej        []int32
		curs, prvs []float64
		rateOK     []bool
		tats       []int64
		nowUs      *int64
	)
	args := []any{stored(namespace, maxStoredNamespace), idArg, idExpires,
		ckeys, csizes, cstarts, cwrite, undo, nwin, cur, prev, values, maxes, weights,
		rt.keys, rt.windows, rt.hitRate, rt.inc, rt.tol}
	scan := func(row pgx.Row) error { return row.Scan(&rej, &curs, &prvs, &rateOK, &tats, &nowUs) }
	if len(slots) == 0 {
		err = scan(conn.QueryRow(ctx, s.sql.hitBatch, args...))
	} else {
		// One pipeline, which PostgreSQL runs as one transaction: the
		// hits' call, then the slots'.
		b := &pgx.Batch{}
		if len(good) > 0 {
			b.Queue(s.sql.hitBatch, args...).QueryRow(scan)
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
	if len(rt.keys) > 0 && (len(rateOK) != len(good) || len(tats) != len(good) || nowUs == nil) {
		return fmt.Errorf("the batch hit function returned %d rate decisions, %d TATs and a time of %v, for %d hits", len(rateOK), len(tats), nowUs, len(good))
	}
	if len(rej) != len(good) || len(curs) != nw || len(prvs) != nw {
		return fmt.Errorf("the batch hit function returned %d decisions and %d and %d counts, for %d hits of %d windows", len(rej), len(curs), len(prvs), len(good), nw)
	}
	at := 0
	for x, i := range good {
		n := len(hits[i].Windows)
		if rej[x] < -1 || int(rej[x]) >= n {
			return fmt.Errorf("the batch hit function returned window %d for hits[%d], of %d windows", rej[x], i, n)
		}
		counts := make([]strategy.WindowCounts, n)
		for w := range counts {
			counts[w] = strategy.WindowCounts{Current: curs[at+w], Previous: prvs[at+w]}
		}
		at += n
		results[i] = strategy.HitResult{Counts: counts, Rejected: int(rej[x])}
		if rt.hitRate != nil && rt.hitRate[x] > 0 {
			results[i].Rate = strategy.RateReply{OK: rateOK[x], TAT: tats[x] * 1e3, Now: *nowUs * 1e3}
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
	type tat struct {
		key      string
		windowMs int64
	}
	var tats []tat
	for _, i := range good {
		if r := hits[i].Rate; r != nil {
			tats = append(tats, tat{hits[i].Key, r.Window.Milliseconds()})
		}
	}
	if len(tats) == 0 {
		return batchRates{}
	}
	slices.SortFunc(tats, func(a, b tat) int { return cmp.Or(strings.Compare(a.key, b.key), cmp.Compare(a.windowMs, b.windowMs)) })
	tats = slices.Compact(tats)
	br := batchRates{hitRate: make([]int32, len(good)), inc: make([]int64, len(good)), tol: make([]int64, len(good))}
	index := make(map[tat]int32, len(tats))
	for j, t := range tats {
		index[t] = int32(j + 1)
		br.keys = append(br.keys, stored(t.key, maxStoredKey))
		br.windows = append(br.windows, t.windowMs)
	}
	for x, i := range good {
		if r := hits[i].Rate; r != nil {
			br.hitRate[x] = index[tat{hits[i].Key, r.Window.Milliseconds()}]
			br.inc[x], br.tol[x] = r.Increment.Microseconds(), r.Tolerance.Microseconds()
		}
	}
	return br
}

// acquireBatch returns a connection as acquire does, with the batch hit
// function in place too.
func (s *Store) acquireBatch(ctx context.Context) (*pgxpool.Conn, error) {
	return s.acquirePart(ctx, s.sql.batchSchema, &s.batchReady, "the batch hit function")
}
