package redis

import (
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

func TestKeyLayout(t *testing.T) {
	l := newLayout("rl")
	for i, tc := range []struct {
		ns, key       string
		sizeMs, start int64
		want          string
	}{
		{"api", "203.0.113.7", 60000, 1700000040000, "rl:{%d}:60000:1700000040000:3:api:203.0.113.7"},
		{"", "", 1, 0, "rl:{%d}:1:0:0::"},
		{"a:b", "{x}", 1000, -1000, "rl:{%d}:1000:-1000:3:a:b:{x}"},
	} {
		b := bucketOf(tc.ns, tc.key)
		got, _ := l.counterKey(nil, b, tc.sizeMs, tc.start, nsPart(tc.ns), tc.key)
		if want := fmt.Sprintf(tc.want, b); got != want {
			t.Errorf("Test %d: key = %q, want %q", i, got, want)
		}
	}
	if got, want := l.dedupeKey(7, 2, "b:1"), "rl:{7}:push:2:b:1"; got != want {
		t.Errorf("dedupe key = %q, want %q", got, want)
	}
	b := bucketOf("a:b", "")
	feed, version := l.nearKeys("a:b")
	if want := fmt.Sprintf("rl:{%d}:near:3:a:b:", b); feed != want {
		t.Errorf("near feed key = %q, want %q", feed, want)
	}
	if want := fmt.Sprintf("rl:{%d}:nearv:3:a:b:", b); version != want {
		t.Errorf("near version key = %q, want %q", version, want)
	}
}

// The bucket hash is part of the storage format: every node, in every
// process and release, must compute the same buckets. These values pin it.
func TestBucketIsStable(t *testing.T) {
	for _, tc := range []struct {
		ns, key string
		want    int
	}{
		{"", "", 808},
		{"api", "203.0.113.7", 743},
		{"default", "alice", 974},
		{"a:b", "c", 77},
		{"a", "b:c", 319},
	} {
		if got := bucketOf(tc.ns, tc.key); got != tc.want {
			t.Errorf("bucketOf(%q, %q) = %d, want %d", tc.ns, tc.key, got, tc.want)
		}
	}
}

// bucketOf must be FNV-1a 64 as hash/fnv computes it, folded.
func TestBucketIsFNV1a(t *testing.T) {
	for _, ns := range []string{"", "api", "a:b", strings.Repeat("n", 300)} {
		for _, key := range hostileKeys() {
			h := fnv.New64a()
			fmt.Fprintf(h, "%d:%s%s", len(ns), ns, key)
			sum := h.Sum64()
			if got, want := bucketOf(ns, key), int((sum^sum>>32)%buckets); got != want {
				t.Errorf("bucketOf(%q, %.20q) = %d, want %d", ns, key, got, want)
			}
		}
	}
}

func TestBucketsSpread(t *testing.T) {
	const n = 100000
	var hist [buckets]int
	for i := range n {
		hist[bucketOf("api", fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255))]++
	}
	lo, hi := n, 0
	for _, c := range hist {
		lo, hi = min(lo, c), max(hi, c)
	}
	// About 98 per bucket; a uniform hash stays well within these bounds.
	if lo < 40 || hi > 170 {
		t.Errorf("buckets hold between %d and %d keys of %d, want an even spread", lo, hi, n)
	}
}

// hostileKeys are client keys that try to break the layout.
func hostileKeys() []string {
	return []string{
		"plain",
		"a:b:c", ":", "::", ":leading", "trailing:",
		"{", "}", "{}", "{x}", "{tag}suffix", "prefix{tag}", "}{", "{{x}}",
		"*", "?", "[", "[a-z]", "\\", "*?[]^",
		"with space", " ", "line\nbreak", "\r\n", "tab\t",
		"nul\x00byte", "\x00", "\xff\xfe invalid utf-8", "日本語",
		"rl:{1}:1000:0:3:api:x", // looks like a whole key
		"push:0:batch",
		"3:api:x",
		"",
		strings.Repeat("k", 10*1024),
		strings.Repeat("{", 10*1024),
	}
}

func TestHostileKeys(t *testing.T) {
	srv, r := startStandalone(t)
	ctx := testCtx(t)
	c := srv.Client("")
	now := steadyNow()
	size := time.Hour
	start := window.Start(now.UnixNano(), size)
	keys := hostileKeys()
	var diffs []window.Diff
	for i, k := range keys {
		diffs = append(diffs, window.Diff{Key: k, Size: size, Start: start, Value: float64(i + 1)})
	}
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "api", Diffs: diffs}); err != nil {
		t.Fatal(err)
	}
	counts, err := r.GetCounters(ctx, "api", keys, []time.Duration{size}, now)
	if err != nil {
		t.Fatal(err)
	}
	got := countsByWindow(t, counts)
	for i, k := range keys {
		name := fmt.Sprintf("key %d (%.20q)", i, k)
		if v := got[winKey{k, size, start}]; v != float64(i+1) {
			t.Errorf("%s: GetCounters = %v, want %d", name, v, i+1)
		}
		if v, err := r.GetWindow(ctx, "api", k, size, start); err != nil || v != float64(i+1) {
			t.Errorf("%s: GetWindow = %v, %v; want %d", name, v, err, i+1)
		}
		if cur, _, err := hitOne(ctx, r, "api", k, size, start, 1000); err != nil || cur != float64(i+1001) {
			t.Errorf("%s: Hit = %v, %v; want %d", name, cur, err, i+1001)
		}
	}
	// One key per counter: nothing merged, nothing spilled.
	if n := len(keysOf(t, c, "rl:{*}:3600000:*")); n != len(keys) {
		t.Errorf("the store holds %d counters, want %d", n, len(keys))
	}
}

func TestNoCollisions(t *testing.T) {
	_, r := startStandalone(t)
	ctx := testCtx(t)
	now := steadyNow()
	size := time.Minute
	start := window.Start(now.UnixNano(), size)
	// Pairs that naive "namespace:key" concatenation would merge.
	pairs := [][2][2]string{
		{{"a:b", "c"}, {"a", "b:c"}},
		{{"a", ":b"}, {"a:", "b"}},
		{{"1:a", "b"}, {"1", "a:b"}},
		{{"", "3:api:x"}, {"api", "x"}},
		{{"api", "x"}, {"api:x", ""}},
	}
	for i, p := range pairs {
		t.Run(fmt.Sprintf("pair %d", i), func(t *testing.T) {
			a, b := p[0], p[1]
			start := start + int64(i)*int64(size) // a window of its own
			for j, nk := range [][2]string{a, b} {
				err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: nk[0], Diffs: []window.Diff{
					{Key: nk[1], Size: size, Start: start, Value: float64(j + 1)},
				}})
				if err != nil {
					t.Fatal(err)
				}
			}
			for j, nk := range [][2]string{a, b} {
				if v, err := r.GetWindow(ctx, nk[0], nk[1], size, start); err != nil || v != float64(j+1) {
					t.Errorf("namespace %q key %q = %v, %v; want %d", nk[0], nk[1], v, err, j+1)
				}
			}
		})
	}
	// Window sizes and starts cannot be confused either.
	err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "w", Diffs: []window.Diff{
		{Key: "k", Size: time.Second, Start: start, Value: 1},
		{Key: "k", Size: time.Minute, Start: start, Value: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := r.GetWindow(ctx, "w", "k", time.Minute, start); v != 2 {
		t.Errorf("1m window = %v, want 2", v)
	}
}

// A retry must split a batch into the same script runs, whatever the order
// of its diffs, so that each dedupe marker covers the same diffs: on a
// Cluster, one run per bucket (several for a bucket of more than 256
// diffs); on a standalone server, runs of 256 diffs of any buckets, cut
// inside buckets too.
func TestPushPlanIgnoresOrder(t *testing.T) {
	size := time.Minute
	now := steadyNow().UnixNano()
	start := window.Start(now, size)
	var diffs []window.Diff
	for i := 0; len(diffs) < 3*maxScriptKeys+10; i++ { // one bucket, four runs on a Cluster
		if k := fmt.Sprint("k", i); bucketOf("ns", k) == 5 {
			diffs = append(diffs, window.Diff{Key: k, Size: size, Start: start, Value: float64(i%3 + 1)})
		}
	}
	for i := range 2000 { // and many other buckets
		diffs = append(diffs, window.Diff{Key: fmt.Sprint("other-", i), Size: size, Start: start - int64(size), Value: 0.5})
	}
	// Diffs that add nothing are dropped before the cut.
	diffs = append(diffs, window.Diff{Key: "zero", Size: size, Start: start, Value: 0})
	touched := make(map[int]bool)
	for _, d := range diffs[:len(diffs)-1] {
		touched[bucketOf("ns", d.Key)] = true
	}
	shuffled := slices.Clone(diffs)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })

	for _, tc := range []struct {
		name    string
		cluster bool
		runs    int
		markers []string
	}{
		{"cluster", true, len(touched) + 3, []string{"rl:{5}:push:0:b1", "rl:{5}:push:3:b1"}},
		// 2,778 diffs: ten full runs and one of 218, the batch's groups
		// 0 to 10, marked in bucket 0 whatever their buckets.
		{"standalone", false, 11, []string{"rl:{0}:push:0:b1", "rl:{0}:push:1:b1", "rl:{0}:push:10:b1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Store{layout: newLayout("rl"), cluster: tc.cluster}
			plan := func(diffs []window.Diff) map[string]string {
				calls, err := r.planPush(strategy.Batch{ID: "b1", Namespace: "ns", Diffs: diffs}, now)
				if err != nil {
					t.Fatal(err)
				}
				runs := make(map[string]string)
				for _, c := range calls {
					keys, args := runKeys(c)
					var parts []string
					for i, k := range keys[1:] {
						parts = append(parts, fmt.Sprint(k, "+", args[2*i+1], "@", args[2*i+2]))
					}
					slices.Sort(parts)
					runs[keys[0]] = fmt.Sprint(args[0], parts)
					if len(keys)-1 > maxScriptKeys {
						t.Errorf("a run writes %d counters, more than %d", len(keys)-1, maxScriptKeys)
					}
					if tc.cluster {
						for _, k := range keys[1:] {
							if tag := k[:strings.Index(k, "}")]; !strings.HasPrefix(keys[0], tag+"}") {
								t.Errorf("a Cluster run mixes buckets: %.30q and marker %q", k, keys[0])
							}
						}
					}
				}
				return runs
			}
			want := plan(diffs)
			if n := len(want); n != tc.runs {
				t.Fatalf("the plan has %d runs, want %d", n, tc.runs)
			}
			for _, m := range tc.markers {
				if _, ok := want[m]; !ok {
					t.Errorf("no run with marker %s", m)
				}
			}
			if got := plan(shuffled); !maps.Equal(got, want) {
				t.Error("shuffling the diffs changed what the markers cover")
			}
		})
	}
}

// On a standalone server, a batch of one key's diffs (what a caller pushes
// for a synchronous hit that failed) is one run whose marker is the one the
// hit sets, as on a Cluster.
func TestPushPlanOfOneKeyIsTheHitsMarker(t *testing.T) {
	now := steadyNow().UnixNano()
	var diffs []window.Diff
	for _, size := range []time.Duration{time.Second, time.Minute, time.Hour} {
		diffs = append(diffs, window.Diff{Key: "k", Size: size, Start: window.Start(now, size), Value: 1})
	}
	for _, cluster := range []bool{false, true} {
		r := &Store{layout: newLayout("rl"), cluster: cluster}
		calls, err := r.planPush(strategy.Batch{ID: "hit-1", Namespace: "ns", Diffs: diffs}, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) != 1 {
			t.Fatalf("cluster %v: the plan has %d runs, want one", cluster, len(calls))
		}
		if want, keys := r.dedupeKey(bucketOf("ns", "k"), 0, "hit-1"), calls[0].cmd[3:3+calls[0].cmd[2].(int)]; keys[0] != want || len(keys) != 4 {
			t.Errorf("cluster %v: the plan is %v, want one run of 3 counters marked %s", cluster, calls, want)
		}
	}
}

// runKeys returns the keys and the arguments of a script run's command.
func runKeys(r scriptRun) ([]string, []any) {
	n := r.cmd[2].(int)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = r.cmd[3+i].(string)
	}
	return keys, r.cmd[3+n:]
}
