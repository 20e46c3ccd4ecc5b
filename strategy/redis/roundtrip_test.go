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
	// Each EVALSHA runs one SET of the hit's marker and, for each window,
	// INCRBYFLOAT and PEXPIREAT on the current counter and GET on the
	// previous one, inside the server.
	n := len(windows) * hits
	want := map[string]int{"evalsha": hits, "set": hits, "incrbyfloat": n, "pexpireat": n, "get": n}
	if calls := serverCalls(t, c); !maps.Equal(calls, want) {
		t.Errorf("%d hits ran %v on the server, want %v", hits, calls, want)
	}
}

// count hits in a zone as the sync loop does, take the diffs, and push them
// once: the commands sent follow the keys (their buckets), not the hits.
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
			// The same namespace and keys for the same number of keys, so
			// the same buckets; an empty store for each case.
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
			touched := make(map[int]bool)
			for k := range tc.keys {
				key := fmt.Sprint("client-", k)
				keys = append(keys, key)
				touched[bucketOf(nsName, key)] = true
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
			process, pipelines, piped := h.get()
			if process != 0 || pipelines != 1 || piped != len(touched) {
				t.Errorf("push sent %d commands in %d pipelines (and %d alone), want one EVALSHA per bucket touched (%d) in one pipeline",
					piped, pipelines, process, len(touched))
			}
			// Inside the server, each EVALSHA runs one SET of its marker,
			// and an INCRBYFLOAT and a PEXPIREAT per diff.
			want := map[string]int{"evalsha": len(touched), "set": len(touched), "incrbyfloat": len(diffs), "pexpireat": len(diffs)}
			if calls := serverCalls(t, c); !maps.Equal(calls, want) {
				t.Errorf("the server ran %v, want %v", calls, want)
			}
			pushed[name] = piped

			// The fetch of the keys seen is one MGET per bucket, too.
			resetStats(t, c)
			h.reset()
			counts, err := r.GetCounters(ctx, nsName, seen, []time.Duration{size}, now)
			if err != nil {
				t.Fatal(err)
			}
			if _, pipelines, piped := h.get(); pipelines != 1 || piped != len(touched) {
				t.Errorf("fetch sent %d commands in %d pipelines, want one MGET per bucket touched (%d) in one pipeline",
					piped, pipelines, len(touched))
			}
			if calls := serverCalls(t, c); !maps.Equal(calls, map[string]int{"mget": len(touched)}) {
				t.Errorf("the server ran %v, want %d MGET", calls, len(touched))
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
	t.Logf("commands per push: %v", pushed)
}

// Redis commands per 1,000 hits, periodic vs synchronous, as the server
// counts them.
func TestCommandsPerThousandHits(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	size := time.Minute
	start := window.Start(steadyNow().UnixNano(), size)
	warmUp(t, r, size, start)
	if _, _, err := hitOne(ctx, r, "warm-up", "k", size, start, 1); err != nil {
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
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "periodic", Diffs: diffs}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.GetCounters(ctx, "periodic", keys, []time.Duration{size}, time.Unix(0, start)); err != nil {
		t.Fatal(err)
	}
	periodic := serverCalls(t, c)

	// Synchronous: 1,000 hits, each applied to the store.
	resetStats(t, c)
	for i := range 1000 {
		if _, _, err := hitOne(ctx, r, "sync", fmt.Sprint("client-", i%100), size, start, 1); err != nil {
			t.Fatal(err)
		}
	}
	sync := serverCalls(t, c)

	sent := func(calls map[string]int) int { return calls["evalsha"] + calls["eval"] + calls["mget"] }
	all := func(calls map[string]int) (n int) {
		for _, v := range calls {
			n += v
		}
		return n
	}
	t.Logf("Redis commands per 1,000 hits over 100 keys: periodic (one push and one fetch): %d sent, %d run with those in scripts %v; "+
		"synchronous: %d sent, %d run %v", sent(periodic), all(periodic), periodic, sent(sync), all(sync), sync)
	if sent(sync) != 1000 || sync["evalsha"] != 1000 {
		t.Errorf("1,000 synchronous hits sent %v, want 1,000 EVALSHA", sync)
	}
	if n := sent(periodic); n > 200 || periodic["evalsha"] == 0 || periodic["mget"] == 0 {
		t.Errorf("a periodic sync of 1,000 hits over 100 keys sent %d commands (%v), want at most 2 per key", n, periodic)
	}
}
