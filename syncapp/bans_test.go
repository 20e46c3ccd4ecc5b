package syncapp

import (
	"context"
	"fmt"
	"go.uber.org/zap"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// TestBansLocal bans keys on one node: a ban holds until its end, a later
// end wins over an earlier one, a reset lifts it, and the bans a node
// holds never outnumber its zone's keys.
func TestBansLocal(t *testing.T) {
	ns := start(t, caddy.NewUsagePool(), `{"zones": {"small": {"max_keys": 100}}, "namespaces": {"api": {"zone": "small"}}}`).ns("api")
	if ns.BansAcrossNodes() {
		t.Fatal("a local namespace shares its bans")
	}
	ctx := context.Background()
	if got := ns.BannedUntil("k"); !got.IsZero() {
		t.Fatalf("a key never banned is banned until %v", got)
	}
	now := time.Now()
	ns.Ban(ctx, "k", now.Add(time.Hour))
	ns.Ban(ctx, "k", now.Add(time.Minute))
	if got := ns.BannedUntil("k"); !got.Equal(now.Add(time.Hour)) {
		t.Fatalf("banned until %v, want the later end %v", got, now.Add(time.Hour))
	}
	ns.Ban(ctx, "short", now.Add(200*time.Millisecond))
	poll.Until(t, 5*time.Second, "the short ban to end", func() bool { return ns.BannedUntil("short").IsZero() })
	// The look-up that found the ban ended dropped it.
	if n := ns.bans.held.Load(); n != 1 {
		t.Fatalf("%d bans held after the short one ended and its key came back, want 1", n)
	}

	// A ban whose key never comes back is not in force once it ended, and
	// the first ban a sweep interval later drops it.
	bans := ns.bans
	end := time.Now().Add(100 * time.Millisecond)
	ns.Ban(ctx, "gone", end)
	if n := bans.inForce(time.Now().UnixNano()); n != 2 {
		t.Fatalf("%d bans in force, want 2", n)
	}
	if n := bans.inForce(end.UnixNano()); n != 1 {
		t.Fatalf("%d bans in force when one ended, want 1", n)
	}
	// The sweep below drops the ban by the wall clock: it must have ended.
	poll.Until(t, 5*time.Second, "the ban to end", func() bool { return bans.inForce(time.Now().UnixNano()) == 1 })
	if n := bans.held.Load(); n != 2 {
		t.Fatalf("%d bans held before a sweep, want 2", n)
	}
	bans.mu.Lock()
	bans.swept -= int64(banSweepInterval)
	bans.mu.Unlock()
	ns.Ban(ctx, "later", time.Now().Add(time.Hour))
	if n := bans.held.Load(); n != 2 {
		t.Fatalf("%d bans held after a sweep, want 2 (k and later)", n)
	}
	if !ns.BannedUntil("gone").IsZero() {
		t.Fatal("the swept ban still holds")
	}
	if err := ns.Reset(ctx, "later"); err != nil {
		t.Fatal(err)
	}
	if err := ns.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if got := ns.BannedUntil("k"); !got.IsZero() {
		t.Fatalf("after a reset, banned until %v", got)
	}

	for i := range 1000 {
		ns.Ban(ctx, fmt.Sprint("flood-", i), now.Add(time.Hour))
	}
	if n := ns.bans.held.Load(); n > 100 {
		t.Fatalf("%d bans held, more than the zone's 100 keys", n)
	}
	if ns.BannedUntil("flood-999").IsZero() {
		t.Fatal("the latest ban was dropped to make room")
	}
}

// TestFleetBans bans a key on one of two nodes sharing a store, periodic
// and synchronous: the other learns of it with its next sync run and
// rejects it from memory, and a reset on the first lifts it on both.
func TestFleetBans(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		for _, rate := range []string{"100ms", "0"} {
			t.Run("sync_rate "+rate, func(t *testing.T) {
				var nodes []*Namespace
				for range 2 {
					ns := start(t, caddy.NewUsagePool(), s.config(rate, "1h")).ns("api")
					if !ns.BansAcrossNodes() {
						t.Fatal("the store cannot hold bans")
					}
					ns.UseBans()
					nodes = append(nodes, ns)
				}
				a, b := nodes[0], nodes[1]
				ctx := context.Background()
				until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
				a.Ban(ctx, "k", until)
				if !a.BannedUntil("k").Equal(until) {
					t.Fatalf("the node that banned: until %v, want %v", a.BannedUntil("k"), until)
				}
				poll.Until(t, 5*time.Second, "the other node to learn of the ban", func() bool {
					return b.BannedUntil("k").Equal(until)
				})
				if !b.BannedUntil("other").IsZero() {
					t.Fatal("a key never banned is banned on the other node")
				}
				if err := a.Reset(ctx, "k"); err != nil {
					t.Fatal(err)
				}
				if !a.BannedUntil("k").IsZero() {
					t.Fatal("the reset did not lift the ban on its node")
				}
				poll.Until(t, 5*time.Second, "the other node to drop the lifted ban", func() bool {
					return b.BannedUntil("k").IsZero()
				})
			})
		}
	})
}

// TestBanReadsFollowTheConfig: sync runs read the store's bans only while
// a handler of the running config bans; a reload to a config without one
// stops the reads, and the bans held survive it.
func TestBanReadsFollowTheConfig(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "1h", "window_sizes": ["1m"], "strategy": {"module": "redis", "addresses": [%q]}}}}`, srv.Addr)
	pool := caddy.NewUsagePool()
	first := start(t, pool, cfg)
	ns := first.ns("api")
	ctx := context.Background()
	if asked, err := ns.runner.syncBans(ctx); err != nil || asked {
		t.Fatalf("before any handler bans: asked the store %v (%v), want no round trip", asked, err)
	}
	ns.UseBans()
	until := time.Now().Add(time.Hour)
	ns.Ban(ctx, "k", until)
	if asked, err := ns.runner.syncBans(ctx); err != nil || !asked {
		t.Fatalf("with a handler that bans: asked the store %v (%v), want a round trip", asked, err)
	}

	// A reload to a config whose handlers do not ban.
	next := start(t, pool, cfg)
	first.stop()
	ns = next.ns("api")
	if asked, err := ns.runner.syncBans(ctx); err != nil || asked {
		t.Fatalf("after a reload without bans: asked the store %v (%v), want no round trip", asked, err)
	}
	if ns.BannedUntil("k").IsZero() {
		t.Fatal("the ban did not survive the reload")
	}
	next.stop()
}

// BenchmarkBannedUntil measures the look-up that every request of a
// handler with ban makes, with no ban held and with 10,000.
func BenchmarkBannedUntil(b *testing.B) {
	ns := start(b, caddy.NewUsagePool(), `{}`).ns(DefaultName)
	b.Run("none", func(b *testing.B) {
		for b.Loop() {
			ns.BannedUntil("client")
		}
	})
	for i := range 10_000 {
		ns.Ban(context.Background(), fmt.Sprint("banned-", i), time.Now().Add(time.Hour))
	}
	b.Run("10000", func(b *testing.B) {
		for b.Loop() {
			ns.BannedUntil("client")
		}
	})
}

// TestBansOutliveAStoreThatLostThem bans a key on one of two nodes, then
// restarts their Redis empty, while the first node bans another key
// that it could not push yet: within a sync run or two every node
// rejects both keys, and the store holds both bans, the lost one
// written back by the nodes that knew it (the first node's push of the
// new ban must not make the fleet take the store's bans for whole).
func TestBansOutliveAStoreThatLostThem(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "100ms", "window_sizes": ["1m"], "strategy": {"module": "redis", "addresses": [%q]}}}}`, srv.Addr)
	var nodes []*Namespace
	for range 2 {
		ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
		ns.UseBans()
		nodes = append(nodes, ns)
	}
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	nodes[0].Ban(context.Background(), "k", until)
	poll.Until(t, 5*time.Second, "the other node to learn of the ban", func() bool {
		return nodes[1].BannedUntil("k").Equal(until)
	})
	srv.Kill()
	nodes[0].Ban(context.Background(), "during", until)
	srv.Restart()
	store := fleetStore{strategy: fmt.Sprintf(`{"module": "redis", "addresses": [%q]}`, srv.Addr)}.open(t).(strategy.Banner)
	poll.Until(t, 10*time.Second, "the store to hold both bans", func() bool {
		bans, _, err := store.GetBans(context.Background(), "api", -1, time.Now())
		return err == nil && len(bans) == 2
	})
	poll.Until(t, 10*time.Second, "every node to hold both bans", func() bool {
		for _, ns := range nodes {
			if !ns.BannedUntil("k").Equal(until) || !ns.BannedUntil("during").Equal(until) {
				return false
			}
		}
		return true
	})
	for i, ns := range nodes {
		if !ns.BannedUntil("k").Equal(until) {
			t.Fatalf("node %d: k banned until %v, want %v", i, ns.BannedUntil("k"), until)
		}
	}
}

// TestBansOutliveAWriteBackThatLacksThem has the store lose its bans
// while only node A knows of one: node B, which knows of another, finds
// the store empty first and writes its own back, which gives the store a
// version other than 0. A still finds that the store lost its ban (the
// version is of a new epoch) and writes it back, rather than take B's
// bans for the whole.
func TestBansOutliveAWriteBackThatLacksThem(t *testing.T) {
	srv := redistest.Start(t)
	store := fleetStore{strategy: fmt.Sprintf(`{"module": "redis", "addresses": [%q]}`, srv.Addr)}.open(t).(strategy.Banner)
	ctx := context.Background()
	a, b := newBanTable("api", zap.NewNop()), newBanTable("api", zap.NewNop())
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	b.ban("b-only", until.UnixNano(), true, 100)
	for _, n := range []*banTable{b, a} { // a reads b's ban, b does not read a's
		if err := n.sync(ctx, store); err != nil {
			t.Fatal(err)
		}
	}
	a.ban("a-only", until.UnixNano(), true, 100)
	if err := a.sync(ctx, store); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	srv.Restart()
	poll.Until(t, 10*time.Second, "node b to write its ban back", func() bool { return b.sync(ctx, store) == nil })
	if err := a.sync(ctx, store); err != nil {
		t.Fatal(err)
	}
	bans, _, err := store.GetBans(ctx, "api", -1, time.Now())
	if err != nil || len(bans) != 2 {
		t.Fatalf("the store holds %v (%v), want both bans", bans, err)
	}
	if !a.bannedUntil("a-only").Equal(until) || !a.bannedUntil("b-only").Equal(until) {
		t.Fatalf("node a holds a-only until %v and b-only until %v, want both until %v",
			a.bannedUntil("a-only"), a.bannedUntil("b-only"), until)
	}
}
