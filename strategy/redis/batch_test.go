package redis

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// hashSlot is Redis's CRC16: the check value of CRC-16/XMODEM, and the
// slot of a key that Redis documents.
func TestHashSlot(t *testing.T) {
	if got := hashSlot("123456789"); got != 0x31c3 {
		t.Errorf(`hashSlot("123456789") = %#x, want 0x31c3`, got)
	}
	if got := hashSlot("foo"); got != 12182 { // CLUSTER KEYSLOT foo
		t.Errorf(`hashSlot("foo") = %d, want 12182`, got)
	}
}

// batchOf returns n hits of the keys, in turn, each with the windows.
func batchOf(keys []string, n int, windows []strategy.WindowHit) []strategy.HitRequest {
	hits := make([]strategy.HitRequest, n)
	for i := range hits {
		hits[i] = strategy.HitRequest{Key: keys[i%len(keys)], Windows: windows}
	}
	return hits
}

// hitBatch applies a batch and fails the test if a hit failed.
func hitBatch(t *testing.T, r *Store, ns, id string, hits []strategy.HitRequest) []strategy.HitResult {
	t.Helper()
	results := make([]strategy.HitResult, len(hits))
	r.HitBatch(testCtx(t), ns, id, hits, results)
	for i, res := range results {
		if res.Err != nil {
			t.Fatalf("hits[%d] of %d: %v", i, len(hits), res.Err)
		}
	}
	return results
}

// A batch's markers on a standalone server: the batch's groups 0 to
// ceil(w/256)-1, w being the windows of its hits, whatever their buckets
// (on a Cluster, each bucket's: TestClusterBatch), living as a hit's
// marker does.
func TestBatchMarkers(t *testing.T) {
	c, r, now := startFrozen(t)
	ctx := testCtx(t)
	ws := []strategy.WindowHit{
		{Size: time.Minute, Start: window.Start(now, time.Minute), Value: 1, Max: math.Inf(1)},
		{Size: time.Hour, Start: window.Start(now, time.Hour), Value: 1, Max: math.Inf(1)},
	}
	// 130 hits of "a" (260 windows: two groups) and 2 of "b".
	hits := append(batchOf([]string{"a"}, 130, ws), batchOf([]string{"b"}, 2, ws)...)
	id := newID()
	hitBatch(t, r, "m", id, hits)
	want := []string{r.dedupeKey(bucketOf("m", "a"), 0, id), r.dedupeKey(bucketOf("m", "b"), 1, id)}
	got := keysOf(t, c, "*:push:*")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("markers %q, want %q", got, want)
	}
	for _, m := range got {
		ttl, err := c.PTTL(ctx, m).Result()
		if err != nil {
			t.Fatal(err)
		}
		// As a hit's: as long as the hour window's counter, within one and
		// two minutes.
		if ttl < time.Minute || ttl > 2*time.Minute {
			t.Errorf("marker %s lives %v, want one to two minutes", m, ttl)
		}
	}
	// A batch without an ID sets none.
	hitBatch(t, r, "m", "", hits)
	if got := keysOf(t, c, "*:push:*"); len(got) != len(want) {
		t.Errorf("after a batch without an ID, %d markers, want %d", len(got), len(want))
	}
}

// A batch whose hits span the slots of every master of a Cluster: one
// script run per slot, pipelined per node, deciding as the same hits one
// by one; and when a master is down, the hits of its slots fail, with an
// error that says they were not sent, and the others are applied.
func TestClusterBatch(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r := open(t, &Redis{Addresses: cl.Addrs, ReadTimeout: caddy.Duration(5 * time.Second), DialTimeout: caddy.Duration(time.Second)})
	ctx := testCtx(t)
	now := steadyNow().UnixNano()
	var masters []*goredis.Client
	for _, s := range cl.Servers {
		masters = append(masters, s.Client(""))
	}
	ws := []strategy.WindowHit{
		{Size: time.Minute, Start: window.Start(now, time.Minute), Value: 1, Max: 7},
		{Size: time.Hour, Start: window.Start(now, time.Hour), Value: 0.5, Max: math.Inf(1), Weight: 0.5},
	}
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprint("client-", i))
	}
	hits := batchOf(keys, 400, ws) // ten hits a key: the last two rejected
	slots := make(map[int]bool)
	perMaster := make(map[string]int) // slots per master's address
	for _, k := range keys {
		slot := int(bucketSlots[bucketOf("cb", k)])
		if slots[slot] {
			continue
		}
		slots[slot] = true
		key, _ := r.layout.counterKey(nil, bucketOf("cb", k), 1, 1, nsPart("cb"), k)
		got, err := masters[0].ClusterKeySlot(ctx, key).Result()
		if err != nil || int(got) != slot {
			t.Fatalf("CLUSTER KEYSLOT of key %q = %d, %v; want %d", k, got, err, slot)
		}
		node, err := r.client.(*goredis.ClusterClient).MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		perMaster[node.Options().Addr]++
	}
	if len(perMaster) != 3 {
		t.Fatalf("the keys' slots are on %d masters, want 3", len(perMaster))
	}

	// Load the script on every master.
	hitBatch(t, r, "warm", "", hits[:len(keys)])
	for _, m := range masters {
		resetStats(t, m)
	}
	got := hitBatch(t, r, "cb", newID(), hits)
	for _, m := range masters {
		calls := serverCalls(t, m)
		if want := perMaster[m.Options().Addr]; calls["evalsha"] != want {
			t.Errorf("master %s ran %d EVALSHAs, want one per slot: %d", m.Options().Addr, calls["evalsha"], want)
		}
	}
	for i, h := range hits {
		counts, rejected, err := r.Hit(ctx, "one-by-one", h.Key, newID(), h.Windows, h.Undo)
		if err != nil {
			t.Fatal(err)
		}
		if rejected != got[i].Rejected || !slices.Equal(counts, got[i].Counts) {
			t.Fatalf("hits[%d] (key %q): the batch gave %v and %d, one by one %v and %d",
				i, h.Key, got[i].Counts, got[i].Rejected, counts, rejected)
		}
	}

	// A master down: its slots' hits fail, unsent; the others count.
	dead := cl.Servers[0]
	dead.Kill()
	results := make([]strategy.HitResult, len(keys))
	hits = batchOf(keys, len(keys), ws[1:])
	r.HitBatch(ctx, "down", newID(), hits, results)
	var failed, applied int
	for i, res := range results {
		key, _ := r.layout.counterKey(nil, bucketOf("down", hits[i].Key), 1, 1, nsPart("down"), hits[i].Key)
		node, err := r.client.(*goredis.ClusterClient).MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		onDead := node.Options().Addr == dead.Addr
		switch {
		case onDead && res.Err == nil:
			t.Errorf("hits[%d], of the dead master, succeeded", i)
		case onDead && !errors.Is(res.Err, strategy.ErrNotSent):
			t.Errorf("hits[%d], of the dead master: got error %v, want one that wraps ErrNotSent", i, res.Err)
		case onDead:
			failed++
		case res.Err != nil:
			t.Errorf("hits[%d], of a live master: %v", i, res.Err)
		default:
			applied++
			if want := []strategy.WindowCounts{{Current: 0.5}}; !slices.Equal(res.Counts, want) {
				t.Errorf("hits[%d]: counts %v, want %v", i, res.Counts, want)
			}
		}
	}
	if failed == 0 || applied == 0 {
		t.Errorf("%d hits failed and %d were applied, want some of each", failed, applied)
	}
	t.Logf("with a master down, %d hits failed and %d were applied", failed, applied)
}

// The commands Redis runs for a batch of hits (see TestCommandsPerSyncHit),
// on a standalone server: a batch of n hits of one key with two windows
// costs the same whatever n, so that batches of 10 hits or more cost at
// most one command per hit.
func TestCommandsPerBatchHit(t *testing.T) {
	c, r, now := startFrozen(t)
	ctx := testCtx(t)
	ws := []strategy.WindowHit{
		{Size: time.Minute, Start: window.Start(now, time.Minute), Value: 1, Max: 1e9, Weight: 0.5},
		{Size: time.Hour, Start: window.Start(now, time.Hour), Value: 1, Max: 1e9, Weight: 0.5},
	}
	var keys100 []string
	for i := range 100 {
		keys100 = append(keys100, fmt.Sprint("client-", i))
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		keys []string
		n    int
		want map[string]int
	}{
		// A batch of one hit is a Hit: its previous counts remembered,
		// EVALSHA, the marker's SET NX and an INCRBYFLOAT per window.
		{"one key, 1 hit", []string{"k"}, 1, map[string]int{"evalsha": 1, "set": 1, "incrby": 2}},
		// Far from their limits, the hits are admitted at once: EVALSHA,
		// the marker's SET NX and one INCRBY of each current counter by
		// all its hits, which replies its count (the previous counts are
		// remembered).
		{"one key, 10 hits", []string{"k"}, 10, map[string]int{"evalsha": 1, "set": 1, "incrby": 2}},
		{"one key, 100 hits", []string{"k"}, 100, map[string]int{"evalsha": 1, "set": 1, "incrby": 2}},
		// 1,000 hits, 2,000 windows: eight markers, checked with one
		// EXISTS.
		{"one key, 1000 hits", []string{"k"}, 1000, map[string]int{"evalsha": 1, "exists": 1, "set": 8, "incrby": 2}},
		// The batch's markers, whatever the buckets, and an INCRBY per
		// counter.
		{"100 keys, 100 hits", keys100, 100, map[string]int{"evalsha": 1, "set": 1, "incrby": 200}},
		{"100 keys, 1000 hits", keys100, 1000, map[string]int{"evalsha": 1, "exists": 1, "set": 8, "incrby": 200}},
		// Near its limit, a batch decides its hits one by one: the
		// INCRBY of its first counter finds the limit crossed and is
		// taken back, one MGET reads the current counters and a SET ...
		// KEEPTTL writes each.
		{"one key, 10 hits at the limit", []string{"at-limit"}, 10, map[string]int{"evalsha": 1, "set": 3, "incrby": 2, "mget": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hits := batchOf(tc.keys, tc.n, ws)
			if strings.HasSuffix(tc.name, "at the limit") {
				for i := range hits {
					hits[i].Windows = slices.Clone(hits[i].Windows)
					hits[i].Windows[0].Max = float64(tc.n) + 5 // reached by the second batch
				}
			}
			// The counters exist, and the store remembers their previous
			// counts.
			hitBatch(t, r, "cmds", newID(), hits)
			resetStats(t, c)
			hitBatch(t, r, "cmds", newID(), hits)
			calls := serverCalls(t, c)
			perHit := float64(sumCalls(calls)) / float64(tc.n)
			t.Logf("%d commands, %.3f per hit: %v", sumCalls(calls), perHit, calls)
			if !maps.Equal(calls, tc.want) {
				t.Errorf("a batch of %d hits of %d keys ran %v, want %v", tc.n, len(tc.keys), calls, tc.want)
			}
			if len(tc.keys) == 1 && tc.n >= 10 && perHit > 1 {
				t.Errorf("%.3f commands per hit, want at most 1", perHit)
			}
		})
	}
}

// keyspaceReads returns the keys the server has looked up to read them
// (keyspace_hits plus keyspace_misses) since the last CONFIG RESETSTAT.
func keyspaceReads(t *testing.T, c *goredis.Client) int64 {
	t.Helper()
	info, err := c.InfoMap(testCtx(t), "stats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, field := range []string{"keyspace_hits", "keyspace_misses"} {
		var v int64
		if _, err := fmt.Sscan(info["Stats"][field], &v); err != nil {
			t.Fatalf("INFO stats %s: %v", field, err)
		}
		n += v
	}
	return n
}

// A batch sends the previous counts the store remembers, as a hit does,
// and remembers those it reads, for the batches and hits after it: in
// steady state a batch reads only its current counters, and a hit after
// it reads nothing.
func TestBatchSendsRememberedCounts(t *testing.T) {
	c, r, now := startFrozen(t)
	ctx := testCtx(t)
	ws := []strategy.WindowHit{
		{Size: time.Minute, Start: window.Start(now, time.Minute), Value: 1, Max: 1e9, Weight: 0.5},
		{Size: time.Hour, Start: window.Start(now, time.Hour), Value: 1, Max: 1e9, Weight: 0.5},
	}
	var prevs []window.Diff
	for _, w := range ws {
		prevs = append(prevs, window.Diff{Key: "k", Size: w.Size, Start: w.Start - int64(w.Size), Value: 4})
	}
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "rc", Diffs: prevs}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Hit(ctx, "rc", "warm", "", ws, false); err != nil { // loads the hit script
		t.Fatal(err)
	}
	hits := batchOf([]string{"k"}, 10, ws)
	hitBatch(t, r, "rc", newID(), hits) // reads the previous counts
	resetStats(t, c)
	got := hitBatch(t, r, "rc", newID(), hits)
	// Far from its limits, the batch reads nothing: it adds its hits to
	// its current counters with INCRBY, which replies their counts.
	if n := keyspaceReads(t, c); n != 0 {
		t.Errorf("a batch of one key's two windows, its previous counts remembered, read %d keys, want 0", n)
	}
	if want := []strategy.WindowCounts{{Current: 20, Previous: 4}, {Current: 20, Previous: 4}}; !slices.Equal(got[9].Counts, want) {
		t.Errorf("the last hit's counts %v, want %v", got[9].Counts, want)
	}
	resetStats(t, c)
	counts, _, err := r.Hit(ctx, "rc", "k", newID(), ws, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []strategy.WindowCounts{{Current: 21, Previous: 4}, {Current: 21, Previous: 4}}; !slices.Equal(counts, want) {
		t.Errorf("a hit after the batches: counts %v, want %v", counts, want)
	}
	if want := map[string]int{"evalsha": 1, "set": 1, "incrby": 2}; !maps.Equal(serverCalls(t, c), want) {
		t.Errorf("a hit after the batches ran %v, want %v: the previous counts the batch read", serverCalls(t, c), want)
	}
}

// The previous counts a batch sends are packed in six bytes when they are
// whole and small enough, and sent in decimal otherwise; either way the
// script decides on them: with weight 0.5 and a limit of half the
// previous count plus 7, after two hits the batch admits five of ten.
func TestBatchSendsCountsPackedOrDecimal(t *testing.T) {
	c, r, now := startFrozen(t)
	ctx := testCtx(t)
	for _, prev := range []float64{0, 4, 2.5, maxPackedCount - 1, maxPackedCount, 3e14} {
		if got := packableCount(prev); got != (prev == math.Trunc(prev) && prev < maxPackedCount) {
			t.Errorf("packableCount(%v) = %v", prev, got)
		}
		ns := fmt.Sprint("packed-", prev)
		w := strategy.WindowHit{Size: time.Minute, Start: window.Start(now, time.Minute), Value: 1, Max: 1e18, Weight: 0.5}
		prevs := []window.Diff{{Key: "k", Size: w.Size, Start: w.Start - int64(w.Size), Value: prev}}
		if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: ns, Diffs: prevs}); err != nil {
			t.Fatal(err)
		}
		hitBatch(t, r, ns, newID(), batchOf([]string{"k"}, 2, []strategy.WindowHit{w})) // reads the previous count
		w.Max = prev*0.5 + 7
		resetStats(t, c)
		got := hitBatch(t, r, ns, newID(), batchOf([]string{"k"}, 10, []strategy.WindowHit{w}))
		// Deciding hit by hit, the script reads the current counter only.
		if n := keyspaceReads(t, c); n != 1 {
			t.Errorf("previous count %v: the batch read %d keys, want 1: its previous count sent", prev, n)
		}
		for i, res := range got {
			want := -1
			if i >= 5 {
				want = 0
			}
			if res.Rejected != want {
				t.Errorf("previous count %v: hits[%d] rejected by window %d, want %d", prev, i, res.Rejected, want)
			}
			if res.Counts[0].Previous != prev {
				t.Errorf("previous count %v: hits[%d] reports %v", prev, i, res.Counts[0].Previous)
			}
		}
	}
}

// A batch too large for the script's 16-bit fields is refused, each hit
// with an error that wraps strategy.ErrRejected (no retry could send it),
// and nothing reaches Redis; one hit fewer is applied.
func TestBatchTooLargeForOneRun(t *testing.T) {
	c, r, now := startFrozen(t)
	ws := []strategy.WindowHit{{Size: time.Minute, Start: window.Start(now, time.Minute), Value: 1, Max: 1e9}}
	hits := batchOf([]string{"k"}, maxPacked+1, ws)
	results := make([]strategy.HitResult, len(hits))
	resetStats(t, c)
	r.HitBatch(testCtx(t), "huge", newID(), hits, results)
	for _, i := range []int{0, len(hits) - 1} {
		if err := results[i].Err; !errors.Is(err, strategy.ErrRejected) || !strings.Contains(err.Error(), "too large") {
			t.Fatalf("hits[%d]: %v, want a refusal that wraps strategy.ErrRejected", i, err)
		}
	}
	if calls := serverCalls(t, c); sumCalls(calls) != 0 {
		t.Errorf("the refused batch ran %v", calls)
	}
	got := hitBatch(t, r, "huge", newID(), hits[1:])
	if last := got[len(got)-1].Counts[0].Current; last != maxPacked {
		t.Errorf("a batch of %d hits counted %v", maxPacked, last)
	}
}

// BenchmarkBatchRun measures what Caddy spends on a script run besides
// the round trip: a run of 12 hits over 32 keys with limits of 1s and 1m,
// as the speed harness's synchronous 32-key route sends them, built,
// made a command and answered from a reply as the script gives it when
// it admits every hit at once.
func BenchmarkBatchRun(b *testing.B) {
	s := &Store{layout: newLayout("rl"), prevs: newPrevCache(), now: time.Now}
	now := time.Now()
	nowMs := now.UnixMilli()
	var windows []strategy.WindowHit
	for _, w := range []time.Duration{time.Second, time.Minute} {
		windows = append(windows, strategy.WindowHit{Size: w, Start: window.Start(now.UnixNano(), w), Value: 1, Max: 1e9, Weight: 0.5})
	}
	keys := make([]string, 32)
	for k := range keys {
		keys[k] = fmt.Sprint("k", k)
	}
	const size = 12
	hits, results := make([]strategy.HitRequest, size), make([]strategy.HitResult, size)
	var reply []any
	next := 0
	b.ReportAllocs()
	for b.Loop() {
		for i := range hits {
			hits[i] = strategy.HitRequest{Key: keys[next%len(keys)], Windows: windows}
			next++
		}
		r := newBatchRun(size)
		for i := range hits {
			r.add(s.layout, i, bucketOf("bench", hits[i].Key), nsPart("bench"), &hits[i])
		}
		if _, err := r.command(s, "batch-id", nowMs); err != nil {
			b.Fatal(err)
		}
		reply = append(reply[:0], int64(1))
		for j := range r.counters {
			if r.counters[j].sent == "" {
				reply = append(reply, nil)
			}
		}
		for j := range r.counters {
			if c := &r.counters[j]; c.sent == "" {
				if c.current {
					reply[c.script] = int64(1000 + j)
				} else {
					reply[c.script] = "250"
				}
			}
		}
		if err := r.answer(s, results, reply, nowMs); err != nil {
			b.Fatal(err)
		}
		r.free()
	}
}
