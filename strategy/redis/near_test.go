package redis

import (
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// nearBatch returns a batch of n new keys of namespace ns, hit once each in
// the current hour of now, with the given Near and limit: with near 1 and
// limit 1 every diff marks its key.
func nearBatch(ns, prefix string, n int, now time.Time, near, limit float64) strategy.Batch {
	diffs := make([]window.Diff, n)
	for i := range diffs {
		diffs[i] = window.Diff{Key: fmt.Sprint(prefix, i), Size: time.Hour, Start: window.Start(now.UnixNano(), time.Hour), Value: 1, Limit: limit}
	}
	return strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs, Near: near}
}

// extraCalls returns the commands of got beyond those of base.
func extraCalls(got, base map[string]int) map[string]int {
	extra := make(map[string]int)
	for name, n := range got {
		if d := n - base[name]; d != 0 {
			extra[name] = d
		}
	}
	return extra
}

// A batch with a Near sends what a batch without one does, argument for
// argument, when none of its diffs can mark (none has a limit): only a
// run that may mark carries the thresholds.
func TestPlanPushWithoutMarks(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		r := &Store{layout: newLayout("rl"), cluster: cluster}
		now := steadyNow()
		b := nearBatch("ns", "k", 600, now, 0, 0)
		plain, err := r.planPush(b, now.UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		b.Near = 0.5
		near, err := r.planPush(b, now.UnixNano())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(plain, near) {
			t.Errorf("cluster %v: a batch whose diffs have no limit plans %d runs with a Near, unlike the %d without", cluster, len(near), len(plain))
		}
	}
}

// The commands of near-limit marks on a standalone server, as INFO
// commandstats counts them: a push that marks nothing costs what a push
// without a Near does; one whose run marks costs the SET of the string
// that holds the newest marks and their version (and TIME when the feed
// is new), and the push that fills the string moves them to the stream
// (XADD, PEXPIREAT); a fetch at the known version, or behind by marks the
// string holds, costs what GetCounters does, since the MGET reads the
// string with the counters; one further behind, an XRANGE more.
func TestCommandsPerNearMark(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	now := steadyNow()
	warmUp(t, r, time.Hour, window.Start(now.UnixNano(), time.Hour))
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	push := func(b strategy.Batch) map[string]int {
		t.Helper()
		resetStats(t, c)
		if err := r.PushDiffs(ctx, b); err != nil {
			t.Fatal(err)
		}
		return serverCalls(t, c)
	}

	// Ten new keys in one run: the EVALSHA, the marker's SET, the MGET and
	// a SET NX per counter, with or without a Near that marks nothing.
	base := push(nearBatch("near-cmds", "plain-", 10, now, 0, 1))
	if want := map[string]int{"evalsha": 1, "set": 11, "mget": 1}; !maps.Equal(base, want) {
		t.Errorf("a push of 10 new keys ran %v, want %v", base, want)
	}
	if got := push(nearBatch("near-cmds", "far-", 10, now, 0.5, 100)); !maps.Equal(got, base) {
		t.Errorf("a push with a Near that marks nothing ran %v, want %v as without", got, base)
	}
	if got := push(nearBatch("near-cmds", "one-plain-", 1, now, 0, 1)); !maps.Equal(got, map[string]int{"evalsha": 1, "set": 2}) {
		t.Errorf("a push of one new key ran %v", got)
	}
	if got := push(nearBatch("near-cmds", "one-far-", 1, now, 0.5, 100)); !maps.Equal(got, map[string]int{"evalsha": 1, "set": 2}) {
		t.Errorf("a push of one new key with a Near that marks nothing ran %v, want what it costs without", got)
	}

	// The first mark makes the feed: its version starts at the server's
	// time (TIME).
	marked := func(prefix string, k int) strategy.Batch {
		b := nearBatch("near-cmds", prefix, 10, now, 1, 100)
		for i := range k {
			b.Diffs[i].Limit = 1
		}
		return b
	}
	if first := extraCalls(push(marked("first-", 1)), base); !maps.Equal(first, map[string]int{"time": 1, "set": 1}) {
		t.Errorf("the push that made the feed ran %v more than without marks, want TIME and a SET", first)
	}
	// Then a run that marks keys costs the string's SET, until the marks
	// fill it: that run moves them to the stream.
	made, flushed := 1, 0
	for run := 0; flushed == 0; run++ {
		k := 1 + run%3
		extra := extraCalls(push(marked(fmt.Sprint("marks-", run, "-"), k)), base)
		made += k
		switch {
		case maps.Equal(extra, map[string]int{"set": 1}):
		case maps.Equal(extra, map[string]int{"set": 1, "xadd": 1, "pexpireat": 1}):
			flushed = made
		default:
			t.Fatalf("a run marking %d keys ran %v more, want a SET (and an XADD and a PEXPIREAT once the string is full)", k, extra)
		}
	}
	// A mark here holds " <end> 2 <key of 9 or 10 bytes>": about 30 bytes.
	if flushed < maxInlineMarkBytes/40 || flushed > maxInlineMarkBytes/20 {
		t.Errorf("the marks went to the stream after %d, want the string to hold about %d bytes of them", flushed, maxInlineMarkBytes)
	}
	// A run of one counter has no MGET to read the string with: a GET.
	extra := extraCalls(push(nearBatch("near-cmds", "single-", 1, now, 1, 1)), map[string]int{"evalsha": 1, "set": 2})
	if want := map[string]int{"get": 1, "set": 1}; !maps.Equal(extra, want) {
		t.Errorf("a run of one counter marking it ran %v more, want %v", extra, want)
	}
	made++
	// A batch pushed again marks nothing.
	b := nearBatch("near-cmds", "again-", 10, now, 1, 1)
	push(b)
	made += 10
	if got := push(b); !maps.Equal(got, map[string]int{"evalsha": 1, "set": 1}) {
		t.Errorf("a batch pushed again ran %v, want its marker's SET only", got)
	}

	// Fetches: at the known version, or behind by marks the string holds,
	// what GetCounters costs; with no keys, one MGET; further behind, one
	// XRANGE more.
	fetch := func(known int64, keys []string) (map[string]int, int64, int) {
		t.Helper()
		resetStats(t, c)
		_, marks, v, err := r.GetCountersNear(ctx, "near-cmds", keys, []time.Duration{time.Hour}, now, known, nil)
		if err != nil {
			t.Fatal(err)
		}
		return serverCalls(t, c), v, len(marks)
	}
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("first-", i)
	}
	resetStats(t, c)
	if _, err := r.GetCounters(ctx, "near-cmds", keys, []time.Duration{time.Hour}, now); err != nil {
		t.Fatal(err)
	}
	counters := serverCalls(t, c)
	got, v, n := fetch(0, keys)
	if v == 0 || n != made {
		t.Fatalf("a reader at 0 read %d marks at version %d, want %d at a version", n, v, made)
	}
	if !maps.Equal(extraCalls(got, counters), map[string]int{"xrange": 1}) {
		t.Errorf("a reader at 0 ran %v, want GetCounters' %v and an XRANGE", got, counters)
	}
	if got, _, n := fetch(v, keys); !maps.Equal(got, counters) || n != 0 {
		t.Errorf("a fetch at the known version ran %v (%d marks), want GetCounters' %v", got, n, counters)
	}
	if got, _, _ := fetch(v, nil); !maps.Equal(got, map[string]int{"mget": 1}) {
		t.Errorf("a read of the marks alone at the known version ran %v, want one MGET", got)
	}
	if got, _, n := fetch(v-10, keys); !maps.Equal(got, counters) || n != 10 {
		t.Errorf("a fetch 10 marks behind ran %v (%d marks), want GetCounters' %v: the string holds them", got, n, counters)
	}
	// The stream's entry of that mark holds the marks before it too.
	if got, _, n := fetch(v-int64(made-flushed)-1, keys); !maps.Equal(extraCalls(got, counters), map[string]int{"xrange": 1}) || n < made-flushed+1 {
		t.Errorf("a fetch one mark behind the string ran %v (%d marks), want GetCounters' %v and an XRANGE, and at least %d marks", got, n, counters, made-flushed+1)
	}
}

// On a Cluster the feed is in a slot of its own: a push's runs reply their
// marks, and one more script run writes them (EVALSHA, GET, SET),
// only for a push that marks. A fetch at the known version costs at most
// one MGET more than GetCounters, in the same round trip.
func TestCommandsPerNearMarkCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	r := open(t, &Redis{Addresses: cl.Addrs, ReadTimeout: caddy.Duration(5 * time.Second)})
	var masters []*goredis.Client
	for _, s := range cl.Servers {
		masters = append(masters, s.Client(""))
	}
	ctx := testCtx(t)
	now := steadyNow()
	calls := func() map[string]int {
		total := make(map[string]int)
		for _, m := range masters {
			for name, n := range serverCalls(t, m) {
				if name != "cluster|nodes" && name != "cluster|slots" && name != "cluster|shards" && name != "command" {
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
	push := func(b strategy.Batch) map[string]int {
		t.Helper()
		reset()
		if err := r.PushDiffs(ctx, b); err != nil {
			t.Fatal(err)
		}
		return calls()
	}
	// Load the scripts on every master, and make the feed.
	push(nearBatch("warm-up", "k", 200, now, 0, 0))
	first := nearBatch("near-cmds", "first-", 200, now, 1, 1)
	first.Diffs[0].Size, first.Diffs[0].Start = 2*time.Hour, window.Start(now.UnixNano(), 2*time.Hour)
	push(first) // the feed's end: that of the marks of two-hour windows below

	for _, k := range []int{0, 1, 5} {
		// The same keys (so buckets) twice, each time in new windows.
		plain := nearBatch("near-cmds", fmt.Sprint("keys-", k, "-"), 50, now, 0, 1)
		base := push(plain)
		b := nearBatch("near-cmds", fmt.Sprint("keys-", k, "-"), 50, now, 1, 100)
		for i := range b.Diffs {
			b.Diffs[i].Size = 2 * time.Hour
			b.Diffs[i].Start = window.Start(now.UnixNano(), 2*time.Hour)
		}
		for i := range k {
			b.Diffs[i].Limit = 1
		}
		extra := extraCalls(push(b), base)
		want := map[string]int{"evalsha": 1, "get": 1, "set": 1}
		if k == 0 {
			want = map[string]int{}
		}
		t.Logf("a push of 50 keys marking %d on a Cluster: %v more commands", k, extra)
		if !maps.Equal(extra, want) {
			t.Errorf("a push marking %d keys ran %v more, want %v", k, extra, want)
		}
	}

	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprint("first-", i)
	}
	reset()
	if _, err := r.GetCounters(ctx, "near-cmds", keys, []time.Duration{time.Hour}, now); err != nil {
		t.Fatal(err)
	}
	counters := calls()
	_, _, v, err := r.GetCountersNear(ctx, "near-cmds", keys, []time.Duration{time.Hour}, now, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	reset()
	if _, marks, got, err := r.GetCountersNear(ctx, "near-cmds", keys, []time.Duration{time.Hour}, now, v, nil); err != nil || len(marks) != 0 || got != v {
		t.Fatalf("a fetch at the known version %d: %d marks at %d (%v)", v, len(marks), got, err)
	}
	extra := extraCalls(calls(), counters)
	if len(extra) > 1 || extra["mget"] > 1 {
		t.Errorf("a fetch at the known version ran %v more than GetCounters, want at most one MGET", extra)
	}
}

// The feed trims to maxNearMarks, and moves the string's marks to the
// stream past maxInlineMarkBytes: every constant the scripts name is
// filled in.
func TestFeedBound(t *testing.T) {
	if !strings.Contains(nearScript.src, "v - "+strconv.Itoa(maxNearMarks)+" + "+strconv.Itoa(marksPerEntry)) {
		t.Errorf("the feed is not trimmed to the newest %d marks", maxNearMarks)
	}
	if !strings.Contains(nearScript.src, "#held > "+strconv.Itoa(maxInlineMarkBytes)+" then") {
		t.Errorf("the version's string does not hold %d bytes of marks", maxInlineMarkBytes)
	}
	for _, sc := range []*script{pushScript, nearScript, batchScript, acquireSlotScript, renewSlotsScript, setBansScript, getBansScript, attendScript} {
		if strings.Contains(sc.src, "$") {
			t.Errorf("a script holds a constant not filled in: %.60q", sc.src[strings.Index(sc.src, "$"):])
		}
	}
}

// parseFeed reads the string of a feed's version, whose keys may hold
// spaces and any bytes, and refuses what feedSource never writes.
func TestParseFeed(t *testing.T) {
	f, err := parseFeed("105 2000 100 1500 3 a b 1600 0  1700 2 \x00\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []strategy.NearMark{{Key: "a b", Until: time.UnixMilli(1500)}, {Key: "", Until: time.UnixMilli(1600)}, {Key: "\x00\n", Until: time.UnixMilli(1700)}}
	if f.version != 105 || f.streamed != 100 || !reflect.DeepEqual(f.held, want) {
		t.Errorf("got %+v, want version 105, streamed 100, marks %v", f, want)
	}
	if f, err := parseFeed(""); err != nil || f.version != 0 {
		t.Errorf("an empty string: %+v, %v; want version 0", f, err)
	}
	if f, err := parseFeed("7 2000 0"); err != nil || f.version != 7 || len(f.held) != 0 {
		t.Errorf("a string without marks: %+v, %v", f, err)
	}
	for _, bad := range []string{"7 2000", "x 2000 0", "7 2000 8", "7 2000 0 1500 4 abc", "7 2000 0 1500 1 ab", "7 2000 0 1500", "7 2000 6 1 1 a 1 1 b"} {
		if _, err := parseFeed(bad); err == nil {
			t.Errorf("parseFeed(%q) took it", bad)
		}
	}
}
