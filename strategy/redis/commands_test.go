package redis

import (
	"fmt"
	"maps"
	"math"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// The commands Redis runs for the calls of the store, as INFO commandstats
// counts them: the EVALSHA itself and every command its script runs. These
// numbers are the store's cost model (see the package documentation); a
// change that raises one must say why.

// sumCalls adds up the calls of every command.
func sumCalls(calls map[string]int) (n int) {
	for _, v := range calls {
		n += v
	}
	return n
}

// Synchronous hits on a standalone server, in steady state (the script
// loaded, the connection open, the key hit before in its window, more
// than two seconds after its previous window ended): what each kind of hit
// costs. The store's clock stands still, at the middle of a minute, so
// that every previous count the store remembers stays usable.
func TestCommandsPerSyncHit(t *testing.T) {
	c, r, now := startFrozen(t)
	ctx := testCtx(t)
	win := func(size time.Duration, max, weight float64) strategy.WindowHit {
		return strategy.WindowHit{Size: size, Start: window.Start(now, size), Value: 1, Max: max, Weight: weight}
	}
	hour := []strategy.WindowHit{win(time.Hour, 1e9, 0.5)}
	three := []strategy.WindowHit{win(time.Minute, 1e9, 0.5), win(time.Hour, 1e9, 0.5), win(24*time.Hour, 1e9, 0.5)}
	withSecond := []strategy.WindowHit{win(time.Second, 1e9, 0.5), win(time.Minute, 1e9, 0.5), win(time.Hour, 1e9, 0.5)}
	full := []strategy.WindowHit{win(time.Hour, 0, 0.5)} // rejects every hit that counts
	atLimit := []strategy.WindowHit{win(time.Hour, 10, 0)}
	if _, _, err := r.Hit(ctx, "cmds", "warm", newID(), hour, false); err != nil {
		t.Fatal(err)
	}
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "cmds", Diffs: []window.Diff{
		{Key: "at-limit", Size: time.Hour, Start: atLimit[0].Start, Value: 10},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil { // connect the stats client
		t.Fatal(err)
	}

	// Keys and IDs of the hits; i is -1 for the hit made before counting.
	var seq int
	same := func(int) string { return "k" }
	fresh := func(int) string { seq++; return fmt.Sprint("fresh-", seq) }
	limited := func(int) string { return "at-limit" }
	unique := func(int) string { return newID() }
	none := func(int) string { return "" }
	repeated := func(int) string { return "the-same-id" }
	// remembered has the store remember the previous count of a key new
	// to Redis, as when this node hit it before but the counter was not
	// made (the hit was rejected and undone, say).
	remembered := func(key string) {
		b := bucketOf("cmds", key)
		pk := counterKeyOf(r, "cmds", key, time.Hour, hour[0].Start-int64(time.Hour))
		nowMs := now / int64(time.Millisecond)
		r.prevs.put(b, pk, prevEntry{prev: "0", readAt: nowMs}, nowMs)
	}
	// unforeseen makes the store forget that the key is at its limit, as
	// when other nodes filled it since this node's last hit.
	unforeseen := func(string) {
		b := bucketOf("cmds", "at-limit")
		pk := counterKeyOf(r, "cmds", "at-limit", time.Hour, atLimit[0].Start-int64(time.Hour))
		e, ok := r.prevs.get(b, pk)
		if !ok {
			t.Fatal("the store remembers nothing of the key")
		}
		e.cur = 0
		r.prevs.put(b, pk, e, now/int64(time.Millisecond))
	}

	const hits = 100
	for _, tc := range []struct {
		name    string
		key     func(i int) string // a new key per hit makes every counter new
		id      func(i int) string
		windows []strategy.WindowHit
		undo    bool
		before  func(key string) // before each counted hit
		want    map[string]int
	}{
		// A hit is a batch of one (see HitBatch). Far from its limit:
		// EVALSHA; SET NX of the marker; INCRBY of the current counter,
		// which keeps its expiry and returns the count. The previous
		// count is the one the store remembers, sent with the hit: no
		// read.
		{"one window, with an ID", same, unique, hour, false, nil, map[string]int{"evalsha": 1, "set": 1, "incrby": 1}},
		{"one window, no ID", same, none, hour, false, nil, map[string]int{"evalsha": 1, "incrby": 1}},
		// A key the store knows nothing of (a new key, or the first hit of
		// a window, or the first in two seconds after a window starts)
		// reads its previous counter with one MGET first; the INCRBY that
		// makes the new counter is followed by its PEXPIREAT.
		{"one window, with an ID, new key", fresh, unique, hour, false, nil, map[string]int{"evalsha": 1, "mget": 1, "set": 1, "incrby": 1, "pexpireat": 1}},
		{"one window, with an ID, new counter, previous count remembered", fresh, unique, hour, false, remembered, map[string]int{"evalsha": 1, "set": 1, "incrby": 1, "pexpireat": 1}},
		// Each further window adds the INCRBY of its current counter.
		{"three windows, with an ID", same, unique, three, false, nil, map[string]int{"evalsha": 1, "set": 1, "incrby": 3}},
		// A sliding window of a second never has a previous count two
		// seconds old: the MGET reads it.
		{"three windows, one of a second, with an ID", same, unique, withSecond, false, nil, map[string]int{"evalsha": 1, "mget": 1, "set": 1, "incrby": 3}},
		// A hit whose ID was applied reads the current counter.
		{"an ID sent again", same, repeated, hour, false, nil, map[string]int{"evalsha": 1, "set": 1, "mget": 1}},
		// Over its limit: the INCRBY is taken back, the counters read and
		// the hit decided on them; with the penalty, the count is
		// written with SET KEEPTTL.
		{"rejected, with an ID", same, unique, full, false, nil, map[string]int{"evalsha": 1, "set": 2, "mget": 1, "incrby": 2}},
		// Rejected and undone: the INCRBY and its undo, and no write.
		{"rejected and undone, with an ID", same, unique, full, true, nil, map[string]int{"evalsha": 1, "set": 1, "mget": 1, "incrby": 2}},
		{"rejected and undone, no ID", same, none, full, true, nil, map[string]int{"evalsha": 1, "mget": 1, "incrby": 2}},
		{"rejected and undone, unforeseen, with an ID", limited, unique, atLimit, true, unforeseen, map[string]int{"evalsha": 1, "set": 1, "mget": 1, "incrby": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := r.Hit(ctx, "cmds", tc.key(-1), tc.id(-1), tc.windows, tc.undo); err != nil {
				t.Fatal(err)
			}
			resetStats(t, c)
			for i := range hits {
				key := tc.key(i)
				if tc.before != nil {
					tc.before(key)
				}
				if _, _, err := r.Hit(ctx, "cmds", key, tc.id(i), tc.windows, tc.undo); err != nil {
					t.Fatal(err)
				}
			}
			want := make(map[string]int)
			for name, n := range tc.want {
				want[name] = n * hits
			}
			calls := serverCalls(t, c)
			t.Logf("%.2f commands per hit: %v", float64(sumCalls(calls))/hits, calls)
			if !maps.Equal(calls, want) {
				t.Errorf("%d hits ran %v, want %v", hits, calls, want)
			}
		})
	}
}

// newKeysBatch returns the diffs of n keys hit once each in the current
// window of size: what a periodic node pushes when every request comes from
// a new client.
func newKeysBatch(prefix string, n int, size time.Duration, now int64) ([]window.Diff, []string) {
	diffs := make([]window.Diff, n)
	keys := make([]string, n)
	for i := range diffs {
		keys[i] = fmt.Sprint(prefix, i)
		diffs[i] = window.Diff{Key: keys[i], Size: size, Start: window.Start(now, size), Value: 1}
	}
	return diffs, keys
}

// Periodic mode on a standalone server, a new key per request: 1,000 keys
// hit once each, one push, then a fetch of those keys. A script run takes
// 256 counters of any buckets: each costs the EVALSHA, its marker's SET and
// one MGET, shared by its 256 counters, and each new counter one SET. A
// fetch reads 256 keys (512 counters: current and previous windows) per
// MGET.
func TestCommandsPerNewKeyPush(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	size := time.Minute
	now := steadyNow()
	warmUp(t, r, size, window.Start(now.UnixNano(), size))
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 1000
	diffs, keys := newKeysBatch("client-", n, size, now.UnixNano())
	batch := strategy.Batch{ID: newID(), Namespace: "new-keys", Diffs: diffs}

	resetStats(t, c)
	if err := r.PushDiffs(ctx, batch); err != nil {
		t.Fatal(err)
	}
	push := serverCalls(t, c)
	resetStats(t, c)
	if _, err := r.GetCounters(ctx, "new-keys", keys, []time.Duration{size}, now); err != nil {
		t.Fatal(err)
	}
	fetch := serverCalls(t, c)

	runs, reads := 4, 4 // ceil(1000/256) runs; ceil(2000/512) MGETs
	if want := map[string]int{"evalsha": runs, "mget": runs, "set": runs + n}; !maps.Equal(push, want) {
		t.Errorf("the push of %d new keys ran %v, want %v", n, push, want)
	}
	if want := map[string]int{"mget": reads}; !maps.Equal(fetch, want) {
		t.Errorf("the fetch of %d keys ran %v, want %v", n, fetch, want)
	}
	perKey := float64(sumCalls(push)+sumCalls(fetch)) / n
	// The sync app fetches a key at the two syncs after its first hit.
	twoFetches := float64(sumCalls(push)+2*sumCalls(fetch)) / n
	t.Logf("a new key costs %.3f commands: push %v and fetch %v; %.3f with the sync app's two fetches",
		perKey, push, fetch, twoFetches)
	if perKey > 2 || twoFetches > 2 {
		t.Errorf("a new key costs %.3f commands (%.3f with two fetches), want at most 2", perKey, twoFetches)
	}

	// The same keys again (a retry is skipped, so a new batch): each
	// counter exists, and costs one INCRBYFLOAT, which keeps its expiry.
	batch.ID = newID()
	resetStats(t, c)
	if err := r.PushDiffs(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"evalsha": runs, "mget": runs, "set": runs, "incrbyfloat": n}; !maps.Equal(serverCalls(t, c), want) {
		t.Errorf("the push of %d known keys ran %v, want %v", n, serverCalls(t, c), want)
	}
	// And a retry of that batch only finds its markers.
	resetStats(t, c)
	if err := r.PushDiffs(ctx, batch); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"evalsha": runs, "set": runs}; !maps.Equal(serverCalls(t, c), want) {
		t.Errorf("the retry ran %v, want %v", serverCalls(t, c), want)
	}

	// A run of one counter tries SET NX first: one command for a new
	// counter, two (the SET NX that fails, then INCRBYFLOAT) for one that
	// exists.
	one := strategy.Batch{ID: newID(), Namespace: "new-keys", Diffs: diffs[:1]}
	resetStats(t, c)
	if err := r.PushDiffs(ctx, one); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"evalsha": 1, "set": 2, "incrbyfloat": 1}; !maps.Equal(serverCalls(t, c), want) {
		t.Errorf("a push of one known counter ran %v, want %v", serverCalls(t, c), want)
	}
}

// The same new-key push on a Cluster of three masters: a script run and an
// MGET keep to one slot, so each bucket touched costs its own EVALSHA,
// marker and MGET. Counted on every master.
func TestCommandsPerNewKeyPushCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r := open(t, &Redis{Addresses: cl.Addrs, ReadTimeout: caddy.Duration(5 * time.Second)})
	var masters []*goredis.Client
	for _, s := range cl.Servers {
		masters = append(masters, s.Client(""))
	}
	ctx := testCtx(t)
	size := time.Minute
	now := steadyNow()
	// Load the script on every master.
	var warm []window.Diff
	for i := range 200 {
		warm = append(warm, window.Diff{Key: fmt.Sprint("warm-", i), Size: size, Start: window.Start(now.UnixNano(), size), Value: 1})
	}
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "warm-up", Diffs: warm}); err != nil {
		t.Fatal(err)
	}
	calls := func() map[string]int {
		total := make(map[string]int)
		for _, m := range masters {
			for name, n := range serverCalls(t, m) {
				if name != "cluster|nodes" && name != "cluster|slots" && name != "cluster|shards" {
					total[name] += n
				}
			}
		}
		return total
	}
	reset := func() {
		for _, m := range masters {
			resetStats(t, m)
		}
	}

	const n = 1000
	diffs, keys := newKeysBatch("client-", n, size, now.UnixNano())
	perBucket := make(map[int]int)
	for _, k := range keys {
		perBucket[bucketOf("new-keys", k)]++
	}
	shared := 0 // buckets of several keys: their runs read with MGET
	for _, c := range perBucket {
		if c > 1 {
			shared++
		}
	}
	reset()
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "new-keys", Diffs: diffs}); err != nil {
		t.Fatal(err)
	}
	push := calls()
	reset()
	if _, err := r.GetCounters(ctx, "new-keys", keys, []time.Duration{size}, now); err != nil {
		t.Fatal(err)
	}
	fetch := calls()
	b := len(perBucket)
	if want := map[string]int{"evalsha": b, "mget": shared, "set": b + n}; !maps.Equal(push, want) {
		t.Errorf("the push of %d new keys in %d buckets ran %v, want %v", n, b, push, want)
	}
	if want := map[string]int{"mget": b}; !maps.Equal(fetch, want) {
		t.Errorf("the fetch ran %v, want %v", fetch, want)
	}
	t.Logf("on a Cluster, %d new keys in %d buckets: %.3f commands per key, push %v and fetch %v; %.3f with two fetches",
		n, b, float64(sumCalls(push)+sumCalls(fetch))/n, push, fetch, float64(sumCalls(push)+2*sumCalls(fetch))/n)

	// A synchronous hit costs the same on a Cluster: its keys share a
	// slot. (A fixed window: its previous count is usable at once.)
	hit := []strategy.WindowHit{{Size: time.Hour, Start: window.Start(now.UnixNano(), time.Hour), Value: 1, Max: math.Inf(1)}}
	if _, _, err := r.Hit(ctx, "new-keys", "k", newID(), hit, false); err != nil {
		t.Fatal(err)
	}
	reset()
	for range 10 {
		if _, _, err := r.Hit(ctx, "new-keys", "k", newID(), hit, false); err != nil {
			t.Fatal(err)
		}
	}
	if want := map[string]int{"evalsha": 10, "set": 10, "incrby": 10}; !maps.Equal(calls(), want) {
		t.Errorf("10 hits on a Cluster ran %v, want %v", calls(), want)
	}
}
