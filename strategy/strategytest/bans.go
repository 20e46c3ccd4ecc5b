package strategytest

import (
	"errors"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// testBans runs the tests of strategy.Banner if the store implements it.
// A store without bans is fine: bans then hold on one node only.
func testBans(t *testing.T, h Harness) {
	b, ok := h.open(t).(strategy.Banner)
	if !ok {
		t.Log("the store holds no bans (it is not a strategy.Banner): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, strategy.Banner)
	}{
		{"SetGetLift", testBansSetGetLift},
		{"Version", testBansVersion},
		{"Expiry", testBansExpiry},
		{"LiftKeepsAVersion", testBansLiftKeepsAVersion},
		{"Epoch", testBansEpoch},
		{"HostileKeys", testBansHostileKeys},
		{"RejectsInput", testBansRejectsInput},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, b) })
	}
}

// getBans reads a namespace's bans and returns them by key, in whole
// milliseconds, with their version.
func getBans(t *testing.T, b strategy.Banner, ns string, known int64) (map[string]int64, int64) {
	t.Helper()
	bans, version, err := b.GetBans(testContext(t), ns, known, time.Now())
	if err != nil {
		t.Fatalf("getting the bans of %q: %v", ns, err)
	}
	got := make(map[string]int64, len(bans))
	for _, ban := range bans {
		if _, dup := got[ban.Key]; dup {
			t.Fatalf("key %q banned twice", ban.Key)
		}
		got[ban.Key] = ban.Until.UnixMilli()
	}
	return got, version
}

func setBans(t *testing.T, b strategy.Banner, ns string, bans ...strategy.Ban) {
	t.Helper()
	if err := b.SetBans(testContext(t), ns, bans); err != nil {
		t.Fatalf("setting %d bans of %q: %v", len(bans), ns, err)
	}
}

// testBansSetGetLift checks that bans read back with their ends, that a
// later end wins and an earlier one does not, that a lift removes a ban,
// that an ended ban changes nothing, and that namespaces are apart.
func testBansSetGetLift(t *testing.T, b strategy.Banner) {
	ns, other := unique("bans"), unique("bans-other")
	now := time.Now().Truncate(time.Millisecond)
	a, later, earlier := now.Add(time.Hour), now.Add(2*time.Hour), now.Add(30*time.Minute)
	setBans(t, b, ns, strategy.Ban{Key: "a", Until: a}, strategy.Ban{Key: "b", Until: a}, strategy.Ban{Key: "gone", Until: now.Add(-time.Second)})
	setBans(t, b, other, strategy.Ban{Key: "a", Until: earlier})
	got, _ := getBans(t, b, ns, -1)
	if len(got) != 2 || got["a"] != a.UnixMilli() || got["b"] != a.UnixMilli() {
		t.Fatalf("bans %v, want a and b until %d", got, a.UnixMilli())
	}
	setBans(t, b, ns, strategy.Ban{Key: "a", Until: later}, strategy.Ban{Key: "b", Until: earlier})
	if got, _ := getBans(t, b, ns, -1); got["a"] != later.UnixMilli() || got["b"] != a.UnixMilli() {
		t.Fatalf("after a later end for a and an earlier one for b: %v, want a until %d and b until %d", got, later.UnixMilli(), a.UnixMilli())
	}
	setBans(t, b, ns, strategy.Ban{Key: "a"}, strategy.Ban{Key: "never-banned"})
	if got, _ := getBans(t, b, ns, -1); len(got) != 1 || got["b"] == 0 {
		t.Fatalf("after lifting a: %v, want b only", got)
	}
	if got, _ := getBans(t, b, other, -1); len(got) != 1 || got["a"] != earlier.UnixMilli() {
		t.Fatalf("the other namespace: %v, want its own ban of a", got)
	}
}

// testBansVersion checks that a namespace without bans has version 0,
// that every change gives a new version and a read of the known version
// returns no bans, and that what does not change a ban keeps the version.
func testBansVersion(t *testing.T, b strategy.Banner) {
	ns := unique("bans-version")
	if got, v := getBans(t, b, ns, -1); len(got) != 0 || v != 0 {
		t.Fatalf("a namespace without bans: %v, version %d, want none and 0", got, v)
	}
	until := time.Now().Add(time.Hour)
	seen := map[int64]bool{0: true}
	step := func(what string, bans ...strategy.Ban) int64 {
		t.Helper()
		setBans(t, b, ns, bans...)
		_, v := getBans(t, b, ns, -1)
		if seen[v] {
			t.Fatalf("after %s: version %d, seen before", what, v)
		}
		seen[v] = true
		if got, again := getBans(t, b, ns, v); len(got) != 0 || again != v {
			t.Fatalf("reading known version %d: %v and version %d, want no bans and the same version", v, got, again)
		}
		return v
	}
	v := step("a ban", strategy.Ban{Key: "k", Until: until})
	step("a second ban", strategy.Ban{Key: "l", Until: until})
	step("a later end", strategy.Ban{Key: "k", Until: until.Add(time.Minute)})
	v = step("a lift", strategy.Ban{Key: "l"})
	setBans(t, b, ns, strategy.Ban{Key: "k", Until: until}, strategy.Ban{Key: "l"})
	if _, again := getBans(t, b, ns, -1); again != v {
		t.Fatalf("an earlier end and a lift of no ban changed the version from %d to %d", v, again)
	}
	setBans(t, b, ns, strategy.Ban{Key: "k"})
	if got, v := getBans(t, b, ns, -1); len(got) != 0 || seen[v] {
		t.Fatalf("after the last lift: %v, version %d, want none and a new version: a lifted ban keeps one until it would have ended", got, v)
	}
}

// testBansLiftKeepsAVersion checks that a namespace whose last ban was
// lifted keeps a version other than 0 until the lifted ban would have
// ended, and then falls back to 0: version 0 with a ban in force tells a
// node that the store lost its bans.
func testBansLiftKeepsAVersion(t *testing.T, b strategy.Banner) {
	ns := unique("bans-lift")
	setBans(t, b, ns, strategy.Ban{Key: "k", Until: time.Now().Add(400 * time.Millisecond)})
	setBans(t, b, ns, strategy.Ban{Key: "k"})
	if got, v := getBans(t, b, ns, -1); len(got) != 0 || v == 0 {
		t.Fatalf("right after the lift: %v, version %d, want no ban and a version other than 0", got, v)
	}
	poll.Until(t, expiryWait, "the lifted ban's end to pass and the version to fall back to 0", func() bool {
		got, v := getBans(t, b, ns, -1)
		return len(got) == 0 && v == 0
	})
}

// testBansEpoch checks that every change after the first adds 1 to the
// version, in its epoch: bans set, lengthened, lifted. A node that reads
// another epoch than the one it knows learns that the store started over.
func testBansEpoch(t *testing.T, b strategy.Banner) {
	ns := unique("bans-epoch")
	until := time.Now().Add(time.Hour)
	var versions []int64
	for _, ban := range []strategy.Ban{
		{Key: "a", Until: until}, {Key: "b", Until: until}, {Key: "a"},
		{Key: "b", Until: until.Add(time.Minute)}, {Key: "c", Until: until},
	} {
		setBans(t, b, ns, ban)
		_, v := getBans(t, b, ns, -1)
		versions = append(versions, v)
	}
	for i := 1; i < len(versions); i++ {
		if versions[i] != versions[i-1]+1 || strategy.BanEpoch(versions[i]) != strategy.BanEpoch(versions[0]) {
			t.Fatalf("versions %v: want each one more than the last, in one epoch", versions)
		}
	}
	if versions[0] == 0 {
		t.Fatal("a namespace with a ban has version 0")
	}
}

// testBansExpiry checks that a ban ends by itself: it is no longer read
// after its end, and a namespace whose bans all ended holds nothing (its
// version falls back to 0).
func testBansExpiry(t *testing.T, b strategy.Banner) {
	ns := unique("bans-expiry")
	setBans(t, b, ns, strategy.Ban{Key: "short", Until: time.Now().Add(300 * time.Millisecond)})
	if got, _ := getBans(t, b, ns, -1); len(got) != 1 {
		t.Fatalf("bans %v, want the short one", got)
	}
	poll.Until(t, expiryWait, "the short ban to end and its namespace to hold nothing", func() bool {
		got, v := getBans(t, b, ns, -1)
		return len(got) == 0 && v == 0
	})
}

// testBansHostileKeys bans every hostile pair until an end of its own and
// reads each back as it was set.
func testBansHostileKeys(t *testing.T, b strategy.Banner) {
	pairs := hostilePairs(unique("bans-hostile"))
	base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	want := make(map[pair]int64)
	for i, p := range pairs {
		until := base.Add(time.Duration(i) * time.Second)
		setBans(t, b, p.namespace, strategy.Ban{Key: p.key, Until: until})
		want[p] = until.UnixMilli()
	}
	byNamespace := make(map[string]int)
	for _, p := range pairs {
		byNamespace[p.namespace]++
	}
	for _, p := range pairs {
		got, _ := getBans(t, b, p.namespace, -1)
		if len(got) != byNamespace[p.namespace] || got[p.key] != want[p] {
			t.Fatalf("namespace %q key %q: read %d bans, the key's until %d, want %d bans and %d", p.namespace, p.key, len(got), got[p.key], byNamespace[p.namespace], want[p])
		}
	}
}

// testBansRejectsInput checks that an end too far away is refused with
// strategy.ErrRejected, before anything changes.
func testBansRejectsInput(t *testing.T, b strategy.Banner) {
	ns := unique("bans-input")
	err := b.SetBans(testContext(t), ns, []strategy.Ban{{Key: "k", Until: time.Now().Add(strategy.MaxBanLength + time.Hour)}})
	if !errors.Is(err, strategy.ErrRejected) {
		t.Fatalf("a ban past MaxBanLength: %v, want an error wrapping ErrRejected", err)
	}
	if got, _ := getBans(t, b, ns, -1); len(got) != 0 {
		t.Fatalf("a refused call set bans: %v", got)
	}
}
