package syncapp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// failureFleet starts n periodic nodes of namespace api on the store with
// the given on_store_failure, each having learned the fleet's size, and
// puts 2 hits of key on each, synced to every node.
func failureFleet(t *testing.T, s fleetStore, syncRate, policy string, n int, key string) []*Namespace {
	t.Helper()
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": %q, "window_sizes": ["1h"], "on_store_failure": %q, "strategy": %s}}}`,
		syncRate, policy, s.strategy)
	var nodes []*Namespace
	for range n {
		nodes = append(nodes, start(t, caddy.NewUsagePool(), cfg).ns("api"))
	}
	ctx := context.Background()
	for _, ns := range nodes {
		ns.Increment(ctx, key, time.Hour, 2)
	}
	poll.Until(t, 20*time.Second, "every node to count the fleet's 2 hits each and to know the fleet's size", func() bool {
		for _, ns := range nodes {
			ns.Increment(ctx, key, time.Hour, 0) // at sync_rate 0, reads the store
			if ns.SlidingWindow(key, time.Hour, nil).Current != float64(2*n) || policy == "share" && ns.FleetSize() != n {
				return false
			}
		}
		return true
	})
	return nodes
}

// admitAll hits key on every node until it rejects, against a limit of
// max per hour (a rejection taken back), and returns how many each
// admitted.
func admitAll(nodes []*Namespace, key string, max float64) []int {
	limits := []Limit{{Size: time.Hour, Max: max}}
	out := make([]window.Sample, 1)
	admitted := make([]int, len(nodes))
	for i, ns := range nodes {
		for range 1000 {
			if ns.Hit(context.Background(), key, limits, 1, false, true, out) >= 0 { // undo: a rejected hit counts nothing
				break
			}
			admitted[i]++
		}
	}
	return admitted
}

// TestShareOnFailureKeepsTheFleetWithinTheLimit takes the store of three
// nodes away after each counted 2 hits of a key: under share, each node
// admits a third of what is left of a limit of 30 (8, as 6 + 3 × 8 = 30),
// where allow admits the whole rest on each (24, so 78 in all), in either
// sync mode. Once the
// store is back, the nodes count as they are again, and the store holds
// every hit admitted, once.
func TestShareOnFailureKeepsTheFleetWithinTheLimit(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		for _, c := range []struct {
			syncRate, policy string
			each             int
		}{{"50ms", "share", 8}, {"50ms", "allow", 24}, {"0", "share", 8}} {
			t.Run(c.syncRate+"/"+c.policy, func(t *testing.T) {
				key := "k-" + c.syncRate + "-" + c.policy
				nodes := failureFleet(t, s, c.syncRate, c.policy, 3, key)
				s.down()
				awaitFailedRuns(t, 1, func() {}, nodes...)
				admitted := admitAll(nodes, key, 30)
				for i, n := range admitted {
					if n != c.each {
						t.Errorf("node %d admitted %d while the store was away, want %d (all: %v)", i, n, c.each, admitted)
					}
				}
				s.up()
				poll.Until(t, 30*time.Second, "every node to reach the store again", func() bool {
					for _, ns := range nodes {
						if ns.health.down() {
							return false
						}
					}
					return true
				})
				want := float64(6 + 3*c.each)
				counts := func() (got []float64) {
					for _, ns := range nodes {
						ns.Increment(context.Background(), key, time.Hour, 0)
						got = append(got, ns.SlidingWindow(key, time.Hour, nil).Current)
					}
					return append(got, s.total(t, key, time.Hour))
				}
				if !poll.For(30*time.Second, func() bool {
					for _, c := range counts() {
						if c != want {
							return false
						}
					}
					return true
				}) {
					t.Fatalf("the nodes and the store count %v, want %v each", counts(), want)
				}
			})
		}
	})
}

// TestDenyOnFailureRefusesUntilTheStoreIsBack: under deny, every node
// refuses requests from when it finds the store away until it reaches it
// again, with a wait of a second, and counts nothing meanwhile.
func TestDenyOnFailureRefusesUntilTheStoreIsBack(t *testing.T) {
	eachStore(t, func(t *testing.T, s fleetStore) {
		nodes := failureFleet(t, s, "50ms", "deny", 2, "k")
		for _, ns := range nodes {
			if refused, _ := ns.Refuses("k"); refused {
				t.Fatal("a node refuses while the store serves")
			}
		}
		s.down()
		awaitFailedRuns(t, 1, func() {}, nodes...)
		for i, ns := range nodes {
			if refused, wait := ns.Refuses("k"); !refused || wait != time.Second {
				t.Fatalf("node %d while the store is away: refused %v, wait %v; want refused, 1s", i, refused, wait)
			}
		}
		s.up()
		poll.Until(t, 30*time.Second, "every node to accept requests again", func() bool {
			for _, ns := range nodes {
				if refused, _ := ns.Refuses("k"); refused {
					return false
				}
			}
			return true
		})
	})
}

// TestShareOfConcurrency: under share, a node admits max/n requests of a
// key at once, rounded down, so that the fleet stays within max; a fleet
// of one, or of a size never learned, keeps max.
func TestShareOfConcurrency(t *testing.T) {
	for _, c := range []struct{ max, n, want int }{{10, 3, 3}, {9, 3, 3}, {1, 3, 0}, {5, 0, 5}, {5, 1, 5}} {
		if got := shareOf(c.max, c.n); got != c.want {
			t.Errorf("shareOf(%d, %d) = %d, want %d", c.max, c.n, got, c.want)
		}
	}
}

func TestParseFailurePolicy(t *testing.T) {
	for in, want := range map[string]FailurePolicy{"": FailAllow, "allow": FailAllow, " Share ": FailShare, "DENY": FailDeny} {
		if got, err := ParseFailurePolicy(in); err != nil || got != want {
			t.Errorf("ParseFailurePolicy(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseFailurePolicy("block"); err == nil || err.Error() != `on_store_failure: unknown policy "block": want allow, share or deny` {
		t.Errorf("ParseFailurePolicy(block): %v", err)
	}
}

// TestShareOnFailureConcurrency: a node of a fleet of three under share
// admits its share of max_concurrent (6 / 3 = 2 requests of a key at
// once) while its store is away, and the whole cap again once the store
// answers.
func TestShareOnFailureConcurrency(t *testing.T) {
	s := fleetStores(t)["redis"](t)
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "50ms", "window_sizes": ["1m"], "on_store_failure": "share", "strategy": %s}}}`, s.strategy)
	var nodes []*Namespace
	for range 3 {
		nodes = append(nodes, start(t, caddy.NewUsagePool(), cfg).ns("api"))
	}
	poll.Until(t, 10*time.Second, "every node to learn the fleet's size", func() bool {
		for _, ns := range nodes {
			if ns.FleetSize() != 3 {
				return false
			}
		}
		return true
	})
	ns := nodes[0]
	acquireAll := func() int {
		var releases []func()
		defer func() {
			for _, r := range releases {
				r()
			}
		}()
		for range 10 {
			release, ok := ns.Acquire(context.Background(), "k", 6)
			if !ok {
				break
			}
			releases = append(releases, release)
		}
		return len(releases)
	}
	s.down()
	awaitFailedRuns(t, 1, func() {}, ns)
	if n := acquireAll(); n != 2 {
		t.Fatalf("with the store away: %d requests of a key at once, want 2 (6 / 3)", n)
	}
	s.up()
	poll.Until(t, 30*time.Second, "the node to reach the store again", func() bool { return !ns.health.down() })
	if n := acquireAll(); n != 6 {
		t.Fatalf("with the store back: %d requests of a key at once, want 6", n)
	}
}

// TestStoreFailureReachesEveryNamespaceOnIt has one namespace find the
// store gone (its synchronous hits stall) while another, on the same
// store, is idle with on_store_failure deny and runs once an hour: the
// idle one refuses at once, with no call of its own, and admits again
// once the first finds the store back.
func TestStoreFailureReachesEveryNamespaceOnIt(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fmt.Sprintf(`{"namespaces": {
		"busy": {"sync_rate": "0", "window_sizes": ["1h"], "strategy": {"module": "redis", "addresses": [%[1]q]}},
		"idle": {"sync_rate": "1h", "on_store_failure": "deny", "window_sizes": ["1h"], "strategy": {"module": "redis", "addresses": [%[1]q]}}}}`, srv.Addr)
	n := start(t, caddy.NewUsagePool(), cfg)
	busy, idle := n.ns("busy"), n.ns("idle")
	warmUp(t, busy)
	if refused, _ := idle.Refuses("k"); refused {
		t.Fatal("the idle namespace refuses with the store up")
	}
	srv.Pause()
	defer srv.Resume()
	ctx := context.Background()
	out := make([]window.Sample, 1)
	for !busy.health.down() {
		busy.Hit(ctx, "k", []Limit{{Size: time.Hour, Max: 100}}, 1, false, false, out)
	}
	if refused, wait := idle.Refuses("k"); !refused || wait != denyRetryAfter {
		t.Fatalf("the idle namespace, once the busy one found the store stalled: refused %v, retry after %v; want refused, %v", refused, wait, denyRetryAfter)
	}
	srv.Resume()
	poll.Until(t, 10*time.Second, "the busy namespace to find the store back", func() bool { return !busy.health.down() })
	if refused, _ := idle.Refuses("k"); refused {
		t.Fatal("the idle namespace still refuses once the busy one found the store back")
	}
}

// TestIdleDenyNamespaceProbesTheStore pauses the store of a namespace with
// on_store_failure deny that receives no request: its runs, which have
// nothing to send, ask the store within the stall bound, so that it
// refuses from its first request after the failure.
func TestIdleDenyNamespaceProbesTheStore(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "100ms", "on_store_failure": "deny", "window_sizes": ["1h"],
		"strategy": {"module": "redis", "addresses": [%q]}}}}`, srv.Addr)
	ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
	poll.Until(t, 10*time.Second, "a run with nothing to send", ns.periodic.near.restingNow)
	srv.Pause()
	defer srv.Resume()
	paused := time.Now()
	poll.Until(t, 10*time.Second, "the idle namespace to refuse", func() bool {
		refused, _ := ns.Refuses("k")
		return refused
	})
	t.Logf("refused %v after the store's pause", time.Since(paused))
	srv.Resume()
	poll.Until(t, 10*time.Second, "the namespace to admit again", func() bool {
		refused, _ := ns.Refuses("k")
		return !refused
	})
}
