package redis

import (
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// In steady state, a synchronous hit of three windows, with an ID as the
// sync app sends it, is one command in one round trip.
func TestHitIsOneRoundTrip(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	h := new(hookCounts)
	r.client.AddHook(h)
	now := steadyNow().UnixNano()
	var windows []strategy.WindowHit
	for _, size := range []time.Duration{time.Second, time.Minute, time.Hour} {
		windows = append(windows, strategy.WindowHit{Size: size, Start: window.Start(now, size), Value: 1, Max: 1e9, Weight: 0.5})
	}

	// The first hit on a server may need the script sent (EVALSHA, then
	// EVAL) and a connection opened.
	h.reset()
	if _, _, err := r.Hit(ctx, "rt", "warm", newID(), windows, false); err != nil {
		t.Fatal(err)
	}
	first, _, _ := h.get()
	t.Logf("first hit on a new server: %d commands (%v)", first, h.names)

	if err := c.Ping(ctx).Err(); err != nil { // connect the stats client
		t.Fatal(err)
	}
	resetStats(t, c)
	h.reset()
	const hits = 200
	for i := range hits {
		if _, _, err := r.Hit(ctx, "rt", fmt.Sprint("key-", i%7), newID(), windows, false); err != nil {
			t.Fatal(err)
		}
	}
	process, pipelines, _ := h.get()
	if process != hits || pipelines != 0 || h.names["evalsha"] != hits {
		t.Errorf("%d hits sent %d commands (%v) and %d pipelines; want %d EVALSHA, nothing else",
			hits, process, h.names, pipelines, hits)
	}
	// Each EVALSHA runs, inside the server, the SET NX of the hit's
	// marker, one MGET of the previous counter of the window of a second
	// (which never has a previous count to send) and one INCRBY of each
	// window's current counter, with a PEXPIREAT for a counter that a
	// new window (of a second, say) starts.
	calls := serverCalls(t, c)
	n := len(windows) * hits
	if calls["evalsha"] != hits || calls["mget"] != hits || calls["set"] != hits || calls["incrby"] != n ||
		calls["pexpireat"] > n || len(calls) != 4+min(calls["pexpireat"], 1) {
		t.Errorf("%d hits ran %v on the server, want %d EVALSHA, %d MGET, %d SET of markers, %d INCRBY and at most as many PEXPIREAT",
			hits, calls, hits, hits, hits, n)
	}
}

// count hits in a zone as the sync loop does, take the diffs, and push them
// once: the commands sent follow the keys, not the hits.
func TestPushCommandsFollowKeysNotHits(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	h := new(hookCounts)
	r.client.AddHook(h)
	size := time.Minute
	now := steadyNow()
	warmUp(t, r, size, window.Start(now.UnixNano(), size))
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	pushed := make(map[string]int) // commands by case
	for _, tc := range []struct{ keys, hitsPerKey int }{
		{10, 1}, {10, 1000}, {100, 1}, {100, 100}, {1000, 1}, {1000, 10},
	} {
		name := fmt.Sprintf("%d keys, %d hits each", tc.keys, tc.hitsPerKey)
		t.Run(name, func(t *testing.T) {
			// A clock fixed in the current minute, so that no case's hits
			// straddle two windows.
			zone, err := window.NewZone(100000, func() int64 { return now.UnixNano() })
			if err != nil {
				t.Fatal(err)
			}
			// The same namespace and keys for the same number of keys; an
			// empty store for each case.
			nsName := fmt.Sprintf("cmds-%d", tc.keys)
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			ns, err := zone.Namespace(nsName)
			if err != nil {
				t.Fatal(err)
			}
			ns.SetTracked(true)
			var keys []string
			for k := range tc.keys {
				key := fmt.Sprint("client-", k)
				keys = append(keys, key)
				for range tc.hitsPerKey {
					ns.Increment(key, size, 1)
				}
			}
			diffs, seen := ns.Take()

			resetStats(t, c)
			h.reset()
			if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: nsName, Diffs: diffs}); err != nil {
				t.Fatal(err)
			}
			// A standalone server takes up to 256 counters, of any
			// buckets, per script run.
			runs := (len(diffs) + maxScriptKeys - 1) / maxScriptKeys
			process, pipelines, piped := h.get()
			if process != 0 || pipelines != 1 || piped != runs {
				t.Errorf("push sent %d commands in %d pipelines (and %d alone), want one EVALSHA per 256 diffs (%d) in one pipeline",
					piped, pipelines, process, runs)
			}
			// Inside the server, each EVALSHA runs one SET of its marker
			// and one MGET of its counters, and every counter, new in an
			// empty store, is one SET ... PXAT ... NX.
			want := map[string]int{"evalsha": runs, "mget": runs, "set": runs + len(diffs)}
			calls := serverCalls(t, c)
			if !maps.Equal(calls, want) {
				t.Errorf("the server ran %v, want %v", calls, want)
			}
			pushed[name] = 0
			for _, n := range calls {
				pushed[name] += n
			}

			// The fetch of the keys seen is one MGET per 512 counters (the
			// current and previous windows of 256 keys).
			reads := (2*len(seen) + maxMGetKeys - 1) / maxMGetKeys
			resetStats(t, c)
			h.reset()
			counts, err := r.GetCounters(ctx, nsName, seen, []time.Duration{size}, now)
			if err != nil {
				t.Fatal(err)
			}
			if _, pipelines, piped := h.get(); pipelines != 1 || piped != reads {
				t.Errorf("fetch sent %d commands in %d pipelines, want one MGET per 512 counters (%d) in one pipeline",
					piped, pipelines, reads)
			}
			if calls := serverCalls(t, c); !maps.Equal(calls, map[string]int{"mget": reads}) {
				t.Errorf("the server ran %v, want %d MGET", calls, reads)
			}
			got := countsByWindow(t, counts)
			start := window.Start(now.UnixNano(), size)
			for _, key := range keys {
				if v := got[winKey{key, size, start}]; v != float64(tc.hitsPerKey) {
					// A window boundary between the hits and now moves
					// them to the previous window; both are fetched.
					if p := got[winKey{key, size, start - int64(size)}]; v+p != float64(tc.hitsPerKey) {
						t.Errorf("%s counts %v + %v, want %d", key, v, p, tc.hitsPerKey)
					}
				}
			}
		})
	}
	for _, pair := range [][2]string{
		{"10 keys, 1 hits each", "10 keys, 1000 hits each"},
		{"100 keys, 1 hits each", "100 keys, 100 hits each"},
		{"1000 keys, 1 hits each", "1000 keys, 10 hits each"},
	} {
		if pushed[pair[0]] != pushed[pair[1]] {
			t.Errorf("%s: %d commands; %s: %d; want the same", pair[0], pushed[pair[0]], pair[1], pushed[pair[1]])
		}
	}
	if !(pushed["10 keys, 1 hits each"] < pushed["100 keys, 1 hits each"] && pushed["100 keys, 1 hits each"] < pushed["1000 keys, 1 hits each"]) {
		t.Errorf("commands do not grow with the keys: %v", pushed)
	}
	t.Logf("commands the server ran per push: %v", pushed)
}

// Redis commands per 1,000 hits, periodic vs synchronous, as the server
// counts them (the commands that scripts run included) and as the client
// sends them.
func TestCommandsPerThousandHits(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	h := new(hookCounts)
	r.client.AddHook(h)
	size := time.Minute
	start := window.Start(steadyNow().UnixNano(), size)
	warmUp(t, r, size, start)
	if _, _, err := hitOne(ctx, r, "warm-up", "k", size, start, 1); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil { // connect the stats client
		t.Fatal(err)
	}

	// Periodic: 1,000 hits over 100 keys, then one sync (push and fetch),
	// all in the window that starts at start.
	zone, err := window.NewZone(1000, func() int64 { return start })
	if err != nil {
		t.Fatal(err)
	}
	ns, err := zone.Namespace("periodic")
	if err != nil {
		t.Fatal(err)
	}
	ns.SetTracked(true)
	for i := range 1000 {
		ns.Increment(fmt.Sprint("client-", i%100), size, 1)
	}
	diffs, keys := ns.Take()
	resetStats(t, c)
	h.reset()
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "periodic", Diffs: diffs}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.GetCounters(ctx, "periodic", keys, []time.Duration{size}, time.Unix(0, start)); err != nil {
		t.Fatal(err)
	}
	periodic := serverCalls(t, c)
	_, _, periodicSent := h.get()

	// Synchronous: 1,000 hits, each applied to the store.
	resetStats(t, c)
	h.reset()
	for i := range 1000 {
		if _, _, err := hitOne(ctx, r, "sync", fmt.Sprint("client-", i%100), size, start, 1); err != nil {
			t.Fatal(err)
		}
	}
	sync := serverCalls(t, c)
	syncSent, _, _ := h.get()

	all := func(calls map[string]int) (n int) {
		for _, v := range calls {
			n += v
		}
		return n
	}
	t.Logf("Redis commands per 1,000 hits over 100 keys: periodic (one push and one fetch): %d sent, %d run with those in scripts %v; "+
		"synchronous: %d sent, %d run %v", periodicSent, all(periodic), periodic, syncSent, all(sync), sync)
	// One EVALSHA per hit. The first hit of a key reads its previous
	// counter with an MGET, and its INCRBY makes the current one, which
	// gets its expiry with PEXPIREAT; the hits after it send the previous
	// count that the store remembers (a fixed window's is usable at once)
	// and only run INCRBY. No hit ID, so no marker.
	if want := map[string]int{"evalsha": 1000, "mget": 100, "pexpireat": 100, "incrby": 1000}; syncSent != 1000 || !maps.Equal(sync, want) {
		t.Errorf("1,000 synchronous hits sent %d commands and ran %v, want 1,000 EVALSHA running %v", syncSent, sync, want)
	}
	// The push is one EVALSHA: its marker, one MGET and one SET for each
	// new counter. The fetch is one MGET.
	if want := map[string]int{"evalsha": 1, "mget": 2, "set": 101}; periodicSent != 2 || !maps.Equal(periodic, want) {
		t.Errorf("a periodic sync of 1,000 hits over 100 keys sent %d commands and ran %v, want 2 sent, running %v", periodicSent, periodic, want)
	}
}
