package strategytest

import (
	"errors"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// testRoster runs the tests of strategy.Roster if the store implements
// it. A store without one is fine: a namespace on it cannot share its
// limits among its nodes while the store is away (on_store_failure share).
func testRoster(t *testing.T, h Harness) {
	r, ok := h.open(t).(strategy.Roster)
	if !ok {
		t.Log("the store counts no fleet (it is not a strategy.Roster): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, strategy.Roster)
	}{
		{"Members", testRosterMembers},
		{"Expiry", testRosterExpiry},
		{"HostileNames", testRosterHostileNames},
		{"RejectsInput", testRosterRejectsInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, r) })
	}
}

func attend(t *testing.T, r strategy.Roster, ns, node string, ttl time.Duration) int {
	t.Helper()
	n, err := r.Attend(testContext(t), ns, node, ttl)
	if err != nil {
		t.Fatalf("node %q attending the fleet of %q: %v", node, ns, err)
	}
	return n
}

// testRosterMembers checks that each node counts once however often it
// attends, and that namespaces count their fleets apart.
func testRosterMembers(t *testing.T, r strategy.Roster) {
	ns, other := unique("roster"), unique("roster-other")
	for i, node := range []string{"a", "b", "a", "c", "b"} {
		want := []int{1, 2, 2, 3, 3}[i]
		if got := attend(t, r, ns, node, time.Hour); got != want {
			t.Fatalf("attendance %d (node %q): %d members, want %d", i+1, node, got, want)
		}
	}
	if got := attend(t, r, other, "a", time.Hour); got != 1 {
		t.Fatalf("another namespace: %d members, want 1", got)
	}
}

// testRosterExpiry checks that a node that stops attending leaves the
// count once its time to live is over, and that attending again moves a
// node's expiry.
func testRosterExpiry(t *testing.T, r strategy.Roster) {
	ns := unique("roster-expiry")
	attend(t, r, ns, "stays", time.Hour)
	attend(t, r, ns, "renews", 300*time.Millisecond)
	if got := attend(t, r, ns, "leaves", 300*time.Millisecond); got != 3 {
		t.Fatalf("%d members, want 3", got)
	}
	attend(t, r, ns, "renews", time.Hour)
	poll.Until(t, expiryWait, "the node that stopped attending to leave the count", func() bool {
		return attend(t, r, ns, "stays", time.Hour) == 2
	})
}

// testRosterHostileNames checks that namespaces and node IDs are data: a
// node named like another's key or with separators is a member of its
// own.
func testRosterHostileNames(t *testing.T, r strategy.Roster) {
	ns := unique("roster-hostile") + "{}:\x00\xff"
	nodes := []string{"n", "n:", "{n}", "n\x00", "\xff\xfe", "*", "%", "' OR 1=1 --"}
	for i, node := range nodes {
		if got := attend(t, r, ns, node, time.Hour); got != i+1 {
			t.Fatalf("node %q: %d members, want %d", node, got, i+1)
		}
	}
}

// testRosterRejectsInput checks that an empty node ID and a time to live
// out of bounds are refused, with ErrRejected.
func testRosterRejectsInput(t *testing.T, r strategy.Roster) {
	ns := unique("roster-input")
	for _, c := range []struct {
		node string
		ttl  time.Duration
	}{{"", time.Second}, {"a", 0}, {"a", -time.Second}, {"a", strategy.MaxAttendTTL + time.Millisecond}} {
		if _, err := r.Attend(testContext(t), ns, c.node, c.ttl); !errors.Is(err, strategy.ErrRejected) {
			t.Fatalf("Attend(%q, %v): %v, want ErrRejected", c.node, c.ttl, err)
		}
	}
}
