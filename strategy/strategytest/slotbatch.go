package strategytest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// testSlotBatch runs the tests of strategy.SlotBatcher if the store
// implements it: concurrency slots taken within batches of hits.
func testSlotBatch(t *testing.T, h Harness) {
	sb, ok := h.open(t).(strategy.SlotBatcher)
	if !ok {
		t.Log("the store takes no slots in batches (it is not a strategy.SlotBatcher): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, strategy.SlotBatcher)
	}{
		{"InOrder", testSlotBatchInOrder},
		{"SentTwice", testSlotBatchSentTwice},
		{"ManyKeys", testSlotBatchManyKeys},
		{"BadInput", testSlotBatchBadInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, sb) })
	}
}

// slotBatchCase is a batchCase whose store takes slots in batches, with a
// slotCase on the same namespace to take and release slots one at a time.
type slotBatchCase struct {
	*batchCase
	sc *slotCase
}

func newSlotBatchCase(t *testing.T, s strategy.SlotBatcher) *slotBatchCase {
	c := &slotBatchCase{batchCase: newBatchCase(t, s), sc: newSlotCase(t, s)}
	c.sc.ns = c.ns
	return c
}

// slotHit is a hit that takes slot id of key, of at most max.
func slotHit(key, id string, max int) strategy.HitRequest {
	return strategy.HitRequest{Key: key, Slot: &strategy.SlotRequest{ID: id, Max: max, Lease: time.Minute}}
}

// checkSlots checks each slot hit's answer against want (held, ok), in
// order; the hits without a slot are skipped.
func checkSlots(t *testing.T, hits []strategy.HitRequest, results []strategy.HitResult, want ...strategy.SlotReply) {
	t.Helper()
	n := 0
	for i, h := range hits {
		if h.Slot == nil {
			continue
		}
		if n == len(want) {
			t.Fatalf("more slot hits than the test expects: hits[%d]", i)
		}
		if got := results[i].Slot; got != want[n] {
			t.Fatalf("hits[%d] (slot %q of key %q, max %d): got held %d, ok %v; want held %d, ok %v",
				i, h.Slot.ID, h.Key, h.Slot.Max, got.Held, got.OK, want[n].Held, want[n].OK)
		}
		n++
	}
}

// testSlotBatchInOrder checks that a batch's slots are taken in its order,
// each as AcquireSlot would, beside hits that count: the third slot of a
// key of at most two is refused, a slot held is renewed whatever the
// number held, and the hits count as they would alone.
func testSlotBatchInOrder(t *testing.T, s strategy.SlotBatcher) {
	c := newSlotBatchCase(t, s)
	ws := []strategy.WindowHit{c.w(hour, 1, 10, 0)}
	c.sc.acquire("a", "a0", 2, time.Minute, 1, true)
	hits := []strategy.HitRequest{
		slotHit("a", "a1", 2),
		{Key: "b", Windows: ws},
		slotHit("a", "a2", 2),
		slotHit("a", "a0", 2), // held: renewed
		slotHit("b", "b1", 1),
		{Key: "b", Windows: ws},
	}
	results := c.batch(c.ns, newID(), hits)
	checkSlots(t, hits, results,
		strategy.SlotReply{Held: 2, OK: true},
		strategy.SlotReply{Held: 2, OK: false},
		strategy.SlotReply{Held: 2, OK: true},
		strategy.SlotReply{Held: 1, OK: true})
	for _, i := range []int{1, 5} {
		if results[i].Rejected != -1 || len(results[i].Counts) != 1 {
			t.Fatalf("hits[%d], a hit beside slots: rejected %d, counts %v", i, results[i].Rejected, results[i].Counts)
		}
	}
	if got := results[5].Counts[0].Current; got != 2 {
		t.Fatalf("the second hit of b counts %v, want 2", got)
	}
	// The batch's slots are the store's as AcquireSlot's are.
	c.sc.acquire("b", "b2", 1, time.Minute, 1, false)
	c.sc.release(strategy.Slot{Key: "a", ID: "a1"})
	c.sc.acquire("a", "a2", 2, time.Minute, 2, true)
}

// testSlotBatchSentTwice checks that a batch sent again under its ID, as
// after a lost reply, takes no second place: its slots are renewed, and
// its hits are applied once.
func testSlotBatchSentTwice(t *testing.T, s strategy.SlotBatcher) {
	c := newSlotBatchCase(t, s)
	ws := []strategy.WindowHit{c.w(hour, 1, 10, 0)}
	hits := []strategy.HitRequest{slotHit("k", "k1", 2), {Key: "k", Windows: ws}, slotHit("k", "k2", 2)}
	id := newID()
	first := c.batch(c.ns, id, hits)
	again := c.batch(c.ns, id, hits)
	want := []strategy.SlotReply{{Held: 1, OK: true}, {Held: 2, OK: true}}
	checkSlots(t, hits, first, want...)
	want[0].Held = 2 // k2 is held by then
	checkSlots(t, hits, again, want...)
	c.sc.acquire("k", "k3", 2, time.Minute, 2, false)
	c.expect("after the batch sent twice", "k", []time.Duration{hour}, counts{{"k", hour, cur(c.at, hour)}: 1})
}

// testSlotBatchManyKeys checks a batch of slots of 40 keys, which a Redis
// Cluster spreads over its nodes, with hits of the same keys.
func testSlotBatchManyKeys(t *testing.T, s strategy.SlotBatcher) {
	c := newSlotBatchCase(t, s)
	ws := []strategy.WindowHit{c.w(hour, 1, 10, 0)}
	var hits []strategy.HitRequest
	var want []strategy.SlotReply
	for k := range 40 {
		key := fmt.Sprint("key-", k)
		hits = append(hits, slotHit(key, "s1", 1), strategy.HitRequest{Key: key, Windows: ws}, slotHit(key, "s2", 1))
		want = append(want, strategy.SlotReply{Held: 1, OK: true}, strategy.SlotReply{Held: 1, OK: false})
	}
	results := c.batch(c.ns, newID(), hits)
	checkSlots(t, hits, results, want...)
	for k := range 40 {
		if r := results[3*k+1]; r.Rejected != -1 || r.Counts[0].Current != 1 {
			t.Fatalf("the hit of key-%d: rejected %d, counts %v", k, r.Rejected, r.Counts)
		}
		c.sc.acquire(fmt.Sprint("key-", k), "s1", 1, time.Minute, 1, true)
	}
}

// testSlotBatchBadInput checks that a slot hit that AcquireSlot would
// refuse, or that also counts windows or has a rate, is refused alone.
func testSlotBatchBadInput(t *testing.T, s strategy.SlotBatcher) {
	c := newSlotBatchCase(t, s)
	ws := []strategy.WindowHit{c.w(hour, 1, 10, 0)}
	rate := strategy.RateRequestOf(time.Second, 1, 1, 1)
	withWindows, withRate := slotHit("bad", "w", 1), slotHit("bad", "r", 1)
	withWindows.Windows, withRate.Rate = ws, &rate
	hits := []strategy.HitRequest{
		slotHit("k", "", 1),
		slotHit("k", "max0", 0),
		{Key: "k", Slot: &strategy.SlotRequest{ID: "lease0", Max: 1}},
		withWindows,
		withRate,
		slotHit("k", "good", 1),
	}
	results := make([]strategy.HitResult, len(hits))
	s.HitBatch(c.ctx, c.ns, newID(), hits, results)
	for i, r := range results[:len(hits)-1] {
		if !errors.Is(r.Err, strategy.ErrRejected) {
			t.Errorf("hits[%d] (%+v): got error %v, want one that wraps ErrRejected", i, *hits[i].Slot, r.Err)
		}
	}
	if r := results[len(hits)-1]; r.Err != nil || r.Slot != (strategy.SlotReply{Held: 1, OK: true}) {
		t.Fatalf("the good slot hit: %+v", r)
	}
	c.sc.acquire("bad", "other", 1, time.Minute, 1, true)
}
