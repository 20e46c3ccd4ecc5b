package redis

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

// The slots of a key are one sorted set in the key's bucket, scored by
// expiry in the server's microseconds, which lives as long as its latest
// slot.
func TestSlotLayout(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	const ns, key, lease = "api", "{x}:y", 30 * time.Second
	strategytest.AcquireOK(t, r, ns, key, "node-1", 2, lease, 1)

	set := fmt.Sprintf("rl:{%d}:slots:3:api:{x}:y", bucketOf(ns, key))
	tm, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	score, err := c.ZScore(ctx, set, "node-1").Result()
	if err != nil {
		t.Fatalf("ZSCORE of %s: %v", set, err)
	}
	exp := time.UnixMicro(int64(score))
	if left := exp.Sub(tm); left <= lease-5*time.Second || left > lease {
		t.Errorf("the slot expires %v after the server's now, want about %v", left, lease)
	}
	ttl, err := c.PTTL(ctx, set).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= lease-5*time.Second || ttl > lease+time.Millisecond {
		t.Errorf("the set lives %v, want about %v", ttl, lease)
	}
	// A longer lease makes the set live longer; a shorter one after it
	// does not shorten it.
	strategytest.AcquireOK(t, r, ns, key, "node-2", 2, 2*lease, 2)
	strategytest.AcquireOK(t, r, ns, key, "node-1", 2, time.Second, 2)
	if ttl, err := c.PTTL(ctx, set).Result(); err != nil || ttl <= lease {
		t.Errorf("after a lease of %v: the set lives %v (error %v), want more than %v", 2*lease, ttl, err, lease)
	}
	// Its keys are the slots, under their IDs.
	members, err := c.ZRange(ctx, set, 0, -1).Result()
	if err != nil || len(members) != 2 || members[0] != "node-1" || members[1] != "node-2" {
		t.Errorf("the set holds %q (error %v), want node-1 then node-2", members, err)
	}
}

// A slot expires by the server's clock: the node's clock (r.now, which
// dates counters and markers) plays no part.
func TestSlotsIgnoreTheNodeClock(t *testing.T) {
	_, r := startStandalone(t)
	strategytest.SlotsIgnoreTheNodeClock(t, r, func(now func() time.Time) { r.now = now })
}

// In steady state an acquisition is one EVALSHA, which runs 7 commands (5
// when the key is full); a release is one ZREM per key, pipelined; a
// renewal one EVALSHA per key; the slots of a batch of hits one EVALSHA
// and one TIME for all of them.
func TestSlotCommands(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	h := new(hookCounts)
	r.client.AddHook(h)
	const n, lease = 100, 30 * time.Second
	strategytest.AcquireOK(t, r, "cmds", "warm", "w", 1, lease, 1) // loads the script
	if err := r.RenewSlots(ctx, "cmds", []strategy.Slot{{Key: "warm", ID: "w"}}, lease); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil { // connect the stats client
		t.Fatal(err)
	}
	check := func(what string, wantProcess, wantPipelines, wantPiped int, want map[string]int, most map[string]int) {
		t.Helper()
		process, pipelines, piped := h.get()
		if process != wantProcess || pipelines != wantPipelines || piped != wantPiped {
			t.Errorf("%s: sent %d commands and %d pipelines of %d (%v), want %d, %d and %d",
				what, process, pipelines, piped, h.names, wantProcess, wantPipelines, wantPiped)
		}
		calls := serverCalls(t, c)
		got := maps.Clone(calls)
		for name, m := range most {
			if calls[name] > m {
				t.Errorf("%s: the server ran %s %d times, want at most %d", what, name, calls[name], m)
			}
			delete(got, name)
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: the server ran %v, want %v and at most %v", what, calls, want, most)
		}
		resetStats(t, c)
		h.reset()
	}
	resetStats(t, c)
	h.reset()

	var slots []strategy.Slot
	for i := range n {
		id := fmt.Sprint("req-", i)
		strategytest.AcquireOK(t, r, "cmds", "k", id, n, lease, i+1)
		slots = append(slots, strategy.Slot{Key: "k", ID: id})
	}
	// PEXPIRE runs unless the set's life is longer than the lease already:
	// after an acquisition in the same millisecond.
	check("acquisitions", n, 0, 0,
		map[string]int{"evalsha": n, "time": n, "zremrangebyscore": n, "zcard": n, "zadd": n, "pttl": n},
		map[string]int{"pexpire": n})

	for i := range n {
		if held, ok, err := r.AcquireSlot(ctx, "cmds", "k", fmt.Sprint("late-", i), n, lease); err != nil || ok || held != n {
			t.Fatalf("acquiring a slot of a full key: got held %d, ok %v and error %v", held, ok, err)
		}
	}
	check("refused acquisitions", n, 0, 0,
		map[string]int{"evalsha": n, "time": n, "zremrangebyscore": n, "zcard": n, "zscore": n}, nil)

	if err := r.RenewSlots(ctx, "cmds", slots[:10], lease); err != nil {
		t.Fatal(err)
	}
	check("a renewal of 10 slots of a key", 0, 1, 1,
		map[string]int{"evalsha": 1, "time": 1, "zscore": 10, "zadd": 10, "pttl": 1}, map[string]int{"pexpire": 1})

	// Slots of many keys: one pipeline, one command per key.
	var spread []strategy.Slot
	for i := range n {
		key := fmt.Sprint("key-", i)
		strategytest.AcquireOK(t, r, "cmds", key, "a", 2, lease, 1)
		strategytest.AcquireOK(t, r, "cmds", key, "b", 2, lease, 2)
		spread = append(spread, strategy.Slot{Key: key, ID: "a"}, strategy.Slot{Key: key, ID: "b"})
	}
	resetStats(t, c)
	h.reset()
	if err := r.RenewSlots(ctx, "cmds", spread, lease); err != nil {
		t.Fatal(err)
	}
	check("a renewal of 2 slots of each of 100 keys", 0, 1, n,
		map[string]int{"evalsha": n, "time": n, "zscore": 2 * n, "zadd": 2 * n, "pttl": n}, map[string]int{"pexpire": n})
	if err := r.ReleaseSlots(ctx, "cmds", append(spread, slots...)); err != nil {
		t.Fatal(err)
	}
	check("a release of 2 slots of each of 101 keys", 0, 1, n+1, map[string]int{"zrem": n + 1}, nil)
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 1 {
		t.Errorf("after every slot but one was released, Redis holds %d keys (error %v), want 1", n, err)
	}

	// The slots of a batch of hits: one run for all of them, one TIME.
	resetStats(t, c)
	h.reset()
	hits, results := make([]strategy.HitRequest, n), make([]strategy.HitResult, n)
	for i := range hits {
		hits[i] = strategy.HitRequest{Key: fmt.Sprint("batch-", i), Slot: &strategy.SlotRequest{ID: "a", Max: 1, Lease: lease}}
	}
	r.HitBatch(ctx, "cmds", "slots", hits, results)
	for i, res := range results {
		if res.Err != nil || res.Slot != (strategy.SlotReply{Held: 1, OK: true}) {
			t.Fatalf("hit %d of a batch taking slots: %+v, error %v; want its key's first slot", i, res.Slot, res.Err)
		}
	}
	check("a batch of hits taking a slot of each of 100 keys", 1, 0, 0,
		map[string]int{"evalsha": 1, "time": 1, "zremrangebyscore": n, "zcard": n, "zadd": n, "pttl": n}, map[string]int{"pexpire": n})
}

// A server that lost its scripts (restarted, or SCRIPT FLUSH) gets them
// again: an acquisition by EVAL, a renewal by SCRIPT LOAD.
func TestSlotScriptsReloaded(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	a := []strategy.Slot{{Key: "k", ID: "a"}}
	strategytest.AcquireOK(t, r, "ns", "k", "a", 2, time.Minute, 1)
	for range 2 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		strategytest.AcquireOK(t, r, "ns", "k", "a", 2, time.Minute, 1)
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.RenewSlots(ctx, "ns", a, time.Minute); err != nil {
			t.Fatalf("renewing after SCRIPT FLUSH: %v", err)
		}
	}
}

// An acquisition that surely never reached Redis says so (ErrNotSent); one
// that may have reached it does not.
func TestAcquireSlotNotSent(t *testing.T) {
	t.Run("killed server", func(t *testing.T) {
		srv := redistest.Start(t)
		r := open(t, &Redis{Addresses: []string{srv.Addr}, DialTimeout: caddy.Duration(500 * time.Millisecond)})
		strategytest.AcquireOK(t, r, "ns", "k", "a", 2, time.Minute, 1) // a pooled connection that the kill breaks
		srv.Kill()
		_, ok, err := r.AcquireSlot(testCtx(t), "ns", "k", "b", 2, time.Minute)
		var op *net.OpError
		if !errors.Is(err, strategy.ErrNotSent) || !errors.As(err, &op) || op.Op != "dial" || ok {
			t.Fatalf("AcquireSlot on a killed server: ok %v, err = %v, want ErrNotSent wrapping a dial error", ok, err)
		}
		// Releases and renewals may have been sent before their last
		// attempt: only a closed store says ErrNotSent.
		if err := r.ReleaseSlots(testCtx(t), "ns", []strategy.Slot{{Key: "k", ID: "a"}}); err == nil {
			t.Error("ReleaseSlots on a killed server succeeded")
		}
	})

	t.Run("paused server", func(t *testing.T) {
		srv := redistest.Start(t)
		r := open(t, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(5 * time.Second)})
		strategytest.AcquireOK(t, r, "ns", "k", "a", 2, time.Minute, 1)
		srv.Pause()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, ok, err := r.AcquireSlot(ctx, "ns", "k", "b", 2, time.Minute)
		cancel()
		srv.Resume()
		if err == nil || errors.Is(err, strategy.ErrNotSent) || ok {
			t.Fatalf("AcquireSlot on a paused server: ok %v, err = %v, want an error without ErrNotSent", ok, err)
		}
		// Rightly so: the server takes the slot once it runs again, and it
		// was sent once. Acquiring it again renews it.
		strategytest.AcquireOK(t, r, "ns", "k", "b", 2, time.Minute, 2)
		c := srv.Client("")
		set := r.layout.slotsKey(bucketOf("ns", "k"), nsPart("ns"), "k")
		if n, err := c.ZCard(testCtx(t), set).Result(); err != nil || n != 2 {
			t.Errorf("the key holds %d slots (error %v), want 2", n, err)
		}
	})
}

// On a Cluster, the slots of a key share the Cluster slot of its counters,
// and a release or a renewal of slots of keys on every node is one
// pipeline (go-redis sends one round trip per node, in parallel).
func TestSlotsCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r := open(t, &Redis{Addresses: cl.Addrs, ReadTimeout: caddy.Duration(5 * time.Second)})
	ctx := testCtx(t)
	h := new(hookCounts)
	r.client.AddHook(h)
	const ns, n = "api", 300
	var slots []strategy.Slot
	for i := range n {
		key := "client-{" + strconv.Itoa(i) + "}"
		strategytest.AcquireOK(t, r, ns, key, "a", 1, time.Minute, 1)
		slots = append(slots, strategy.Slot{Key: key, ID: "a"})
		if i < 20 {
			sizeMs := int64(time.Hour / time.Millisecond)
			counter, _ := r.layout.counterKey(nil, bucketOf(ns, key), sizeMs, 0, nsPart(ns), key)
			set := r.layout.slotsKey(bucketOf(ns, key), nsPart(ns), key)
			a, err1 := r.client.ClusterKeySlot(ctx, counter).Result()
			b, err2 := r.client.ClusterKeySlot(ctx, set).Result()
			if err1 != nil || err2 != nil || a != b {
				t.Fatalf("key %q: counters in Cluster slot %d and slots in %d (errors %v, %v), want one", key, a, b, err1, err2)
			}
		}
	}
	masters := 0
	for _, s := range cl.Servers {
		keys, err := s.Client("").DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if keys > 0 {
			masters++
		}
	}
	if masters != 3 {
		t.Fatalf("the slots of %d keys are on %d of 3 masters, want every one", n, masters)
	}
	// The first renewal loads its script on every master.
	if err := r.RenewSlots(ctx, ns, slots, time.Minute); err != nil {
		t.Fatal(err)
	}
	h.reset()
	if err := r.RenewSlots(ctx, ns, slots, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := r.ReleaseSlots(ctx, ns, slots); err != nil {
		t.Fatal(err)
	}
	if process, pipelines, piped := h.get(); process != 0 || pipelines != 2 || piped != 2*n {
		t.Errorf("a renewal and a release of %d keys sent %d commands and %d pipelines of %d, want 0, 2 and %d", n, process, pipelines, piped, 2*n)
	}
	for i := range n {
		strategytest.AcquireOK(t, r, ns, slots[i].Key, "b", 1, time.Minute, 1)
	}
}
