package strategytest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// testParts runs the tests of strategy.Parted if the store implements
// it: that every key has one part, the same from every store of the same
// settings; and with Harness.FailPart, that a call fails for the failed
// part only, names it, and does the rest.
func testParts(t *testing.T, h Harness) {
	s, ok := h.open(t).(strategy.Parted)
	if !ok {
		t.Log("the store fails as a whole (it is not a strategy.Parted): nothing to check")
		return
	}
	t.Run("PartOf", func(t *testing.T) { testPartOf(t, s, h.open(t).(strategy.Parted)) })
	t.Run("OnePartFails", func(t *testing.T) {
		switch {
		case s.Parts() < 2:
			t.Log("the store has one part: it fails as a whole")
		case h.FailPart == nil:
			t.Log("Harness.FailPart is nil: no part is made to fail")
		default:
			testOnePartFails(t, h, s)
		}
	})
}

// testPartOf checks that parts are in range, stable, the same from two
// stores, and spread over the parts of a store that has several.
func testPartOf(t *testing.T, s, other strategy.Parted) {
	n := s.Parts()
	if n < 1 {
		t.Fatalf("Parts() = %d, want at least 1", n)
	}
	used := make(map[int]bool)
	ns := unique("parts")
	check := func(ns, key string) {
		p := s.PartOf(ns, key)
		if p < 0 || p >= n {
			t.Fatalf("PartOf(%q, %q) = %d, out of [0, %d)", ns, key, p, n)
		}
		if q := s.PartOf(ns, key); q != p {
			t.Fatalf("PartOf(%q, %q) = %d, then %d", ns, key, p, q)
		}
		if q := other.PartOf(ns, key); q != p {
			t.Fatalf("PartOf(%q, %q) = %d, and %d from another store of the same settings", ns, key, p, q)
		}
		used[p] = true
	}
	for i := range 1000 {
		check(ns, fmt.Sprintf("client-%d", i))
	}
	for _, p := range hostilePairs(ns) {
		check(p.namespace, p.key)
	}
	if n > 1 && len(used) < min(n, 100) {
		t.Errorf("1,000 keys fall in %d of %d parts, want them spread", len(used), n)
	}
}

// testOnePartFails fails the part of one key: a push, a fetch, a batch
// of hits, a hit and a ping fail for the failed part's keys only, whose parts
// the errors name, and do the rest; once the part is back every part
// answers a ping, and the failed diffs pushed again under the batch's ID
// count once.
func testOnePartFails(t *testing.T, h Harness, s strategy.Parted) {
	ctx := testContext(t)
	ns := unique("parts")
	size := time.Hour
	now := time.Now()
	start := window.Start(now.UnixNano(), size)
	var keys []string
	for i := range 200 {
		keys = append(keys, fmt.Sprintf("client-%d", i))
	}
	var diffs []window.Diff
	for _, k := range keys {
		diffs = append(diffs, window.Diff{Key: k, Size: size, Start: start, Value: 2})
	}
	batch := strategy.Batch{ID: unique("batch"), Namespace: ns, Diffs: diffs}
	restore := h.FailPart(t, ns, keys[0])
	restored := false
	defer func() {
		if !restored {
			restore()
		}
	}()

	failed, ok := strategy.FailedParts(s.PushDiffs(ctx, batch))
	if !ok || !slices.Contains(failed, s.PartOf(ns, keys[0])) {
		t.Fatalf("push with the part of %q failed: failed parts %v (partial %v), want its part %d among them",
			keys[0], failed, ok, s.PartOf(ns, keys[0]))
	}
	down := func(k string) bool { _, found := slices.BinarySearch(failed, s.PartOf(ns, k)); return found }
	if !slices.ContainsFunc(keys, func(k string) bool { return !down(k) }) {
		t.Fatalf("every part of the keys failed (%v): want the other parts to answer", failed)
	}

	counts, err := s.GetCounters(ctx, ns, keys, []time.Duration{size}, now)
	if parts, ok := strategy.FailedParts(err); !ok || !slices.Equal(parts, failedOf(s, ns, keys, failed)) {
		t.Fatalf("fetch: failed parts %v (partial %v: %v), want the failed parts of the keys, %v", parts, ok, err, failedOf(s, ns, keys, failed))
	}
	got := make(map[string]float64)
	for _, c := range counts {
		if c.Start == start {
			got[c.Key] = c.Value
		}
	}
	for _, k := range keys {
		v, held := got[k]
		switch {
		case down(k) && held:
			t.Errorf("fetch: key %q of a failed part has a count, %v", k, v)
		case !down(k) && v != 2:
			t.Errorf("fetch: key %q of a part that answers holds %v, want 2", k, v)
		}
	}

	if hb, ok := s.(strategy.BatchHitter); ok {
		hits := make([]strategy.HitRequest, 20)
		results := make([]strategy.HitResult, len(hits))
		for i := range hits {
			hits[i] = strategy.HitRequest{Key: keys[i], Windows: []strategy.WindowHit{{Size: size, Start: start, Max: 1e9}}}
		}
		hb.HitBatch(ctx, ns, unique("hits"), hits, results)
		// A Hit of the key whose part failed fails as its part.
		_, _, err := hb.Hit(ctx, ns, keys[0], "", hits[0].Windows, false)
		if parts, partial := strategy.FailedParts(err); !partial || !slices.Equal(parts, []int{s.PartOf(ns, keys[0])}) {
			t.Errorf("Hit of %q of the failed part: %v, want a failure of its part %d", keys[0], err, s.PartOf(ns, keys[0]))
		}
		for i, res := range results {
			k := keys[i]
			parts, partial := strategy.FailedParts(res.Err)
			switch {
			case down(k) && (!partial || !slices.Equal(parts, []int{s.PartOf(ns, k)})):
				t.Errorf("hit of %q of a failed part: %v, want a failure of its part %d", k, res.Err, s.PartOf(ns, k))
			case !down(k) && (res.Err != nil || res.Counts[0].Current != 2):
				t.Errorf("hit of %q of a part that answers: %+v, %v; want its count, 2", k, res.Counts, res.Err)
			}
		}
	}

	if sl, ok := s.(strategy.Slotter); ok {
		// Releasing and renewing slots fail for the failed parts only.
		var slots []strategy.Slot
		for _, k := range keys[:20] {
			slots = append(slots, strategy.Slot{Key: k, ID: unique("slot")})
		}
		want := failedOf(s, ns, keys[:20], failed)
		if parts, partial := strategy.FailedParts(sl.ReleaseSlots(ctx, ns, slots)); !partial || !slices.Equal(parts, want) {
			t.Errorf("ReleaseSlots: failed parts %v (partial %v), want the failed parts of the keys, %v", parts, partial, want)
		}
		if parts, partial := strategy.FailedParts(sl.RenewSlots(ctx, ns, slots, time.Minute)); !partial || !slices.Equal(parts, want) {
			t.Errorf("RenewSlots: failed parts %v (partial %v), want the failed parts of the keys, %v", parts, partial, want)
		}
	}

	allParts := failedOf(s, ns, keys, func() []int {
		var all []int
		for _, k := range keys {
			all = append(all, s.PartOf(ns, k))
		}
		return all
	}())
	if parts, ok := strategy.FailedParts(s.PingParts(ctx, allParts)); !ok || !slices.Contains(parts, s.PartOf(ns, keys[0])) || len(parts) == len(allParts) {
		t.Errorf("PingParts of the keys' %d parts names %v (partial %v), want the failed part %d among them and not every part",
			len(allParts), parts, ok, s.PartOf(ns, keys[0]))
	}

	restore()
	restored = true
	poll.Until(t, 30*time.Second, "every part to answer a ping", func() bool {
		return s.PingParts(context.Background(), allParts) == nil
	})
	var again []window.Diff
	for _, d := range diffs {
		if down(d.Key) {
			again = append(again, d)
		}
	}
	retry := strategy.Batch{ID: batch.ID, Namespace: ns, Diffs: again}
	poll.Until(t, 30*time.Second, "the failed part to take the failed diffs", func() bool {
		return s.PushDiffs(context.Background(), retry) == nil
	})
	if err := s.PushDiffs(ctx, retry); err != nil {
		t.Fatal(err)
	}
	counts, err = s.GetCounters(ctx, ns, keys, []time.Duration{size}, now)
	if err != nil {
		t.Fatal(err)
	}
	clear(got)
	for _, c := range counts {
		if c.Start == start {
			got[c.Key] = c.Value
		}
	}
	for _, k := range keys {
		if got[k] != 2 {
			t.Errorf("after the retry, key %q holds %v, want 2 (a part that failed may have lost the batch, never counted it twice)", k, got[k])
		}
	}
}

// failedOf returns the parts of keys among failed, ascending.
func failedOf(s strategy.Parted, ns string, keys []string, failed []int) []int {
	var out []int
	for _, k := range keys {
		if p := s.PartOf(ns, k); slices.Contains(failed, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
