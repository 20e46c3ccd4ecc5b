package redis

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

func TestPushThenFetch(t *testing.T) {
	_, r := startStandalone(t)
	ctx := testCtx(t)
	now := steadyNow()
	const ns = "api"
	minute, hour := time.Minute, time.Hour
	curM := window.Start(now.UnixNano(), minute)
	curH := window.Start(now.UnixNano(), hour)

	diffs := []window.Diff{
		{Key: "alice", Size: minute, Start: curM, Value: 3},
		{Key: "alice", Size: minute, Start: curM - int64(minute), Value: 7},
		{Key: "alice", Size: hour, Start: curH, Value: 10},
		{Key: "bob", Size: minute, Start: curM, Value: 1},
		{Key: "bob", Size: minute, Start: curM, Value: 2}, // same counter twice: both count
		{Key: "carol", Size: hour, Start: curH - int64(hour), Value: 4},
	}
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs}); err != nil {
		t.Fatal(err)
	}

	counts, err := r.GetCounters(ctx, ns, []string{"alice", "bob", "carol", "dave"}, []time.Duration{minute, hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	got := countsByWindow(t, counts)
	want := map[winKey]float64{
		{"alice", minute, curM}:                 3,
		{"alice", minute, curM - int64(minute)}: 7,
		{"alice", hour, curH}:                   10,
		{"bob", minute, curM}:                   3,
		{"carol", hour, curH - int64(hour)}:     4,
	}
	if len(got) != len(want) {
		t.Errorf("got %d counts, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("count of %+v = %v, want %v", k, got[k], v)
		}
	}

	for _, tc := range []struct {
		name  string
		key   string
		size  time.Duration
		start int64
		want  float64
	}{
		{"current", "alice", minute, curM, 3},
		{"previous", "alice", minute, curM - int64(minute), 7},
		{"other size", "alice", hour, curH, 10},
		{"missing key", "dave", minute, curM, 0},
		{"missing window", "alice", minute, curM + int64(minute), 0},
		{"other namespace", "alice", minute, curM, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := ns
			if tc.name == "other namespace" {
				n = "web"
			}
			v, err := r.GetWindow(ctx, n, tc.key, tc.size, tc.start)
			if err != nil {
				t.Fatal(err)
			}
			if v != tc.want {
				t.Errorf("GetWindow = %v, want %v", v, tc.want)
			}
		})
	}

	t.Run("empty", func(t *testing.T) {
		counts, err := r.GetCounters(ctx, ns, nil, []time.Duration{minute}, now)
		if err != nil || len(counts) != 0 {
			t.Errorf("GetCounters of no keys = %v, %v", counts, err)
		}
		if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: ns}); err != nil {
			t.Errorf("pushing an empty batch: %v", err)
		}
	})
}

func TestFractionalValues(t *testing.T) {
	_, r := startStandalone(t)
	ctx := testCtx(t)
	now := steadyNow()
	size := time.Hour
	start := window.Start(now.UnixNano(), size)
	values := []float64{0.5, 10.25, 0.1, 1e-3, 123456.789, -2.5, 1.0 / 3, 1e15 + 0.5, 7}
	var diffs []window.Diff
	var keys []string
	for i, v := range values {
		key := fmt.Sprintf("k%d", i)
		keys = append(keys, key)
		diffs = append(diffs, window.Diff{Key: key, Size: size, Start: start, Value: v})
	}
	// Sums of fractions that binary floats hold exactly.
	diffs = append(diffs,
		window.Diff{Key: "sum", Size: size, Start: start, Value: 0.5},
		window.Diff{Key: "sum", Size: size, Start: start, Value: 10.25},
		window.Diff{Key: "sum", Size: size, Start: start, Value: 0.125},
	)
	keys = append(keys, "sum")
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "f", Diffs: diffs}); err != nil {
		t.Fatal(err)
	}
	counts, err := r.GetCounters(ctx, "f", keys, []time.Duration{size}, now)
	if err != nil {
		t.Fatal(err)
	}
	got := countsByWindow(t, counts)
	for i, v := range values {
		if g := got[winKey{keys[i], size, start}]; g != v {
			t.Errorf("value %v came back as %v", v, g)
		}
	}
	if g := got[winKey{"sum", size, start}]; g != 10.875 {
		t.Errorf("0.5 + 10.25 + 0.125 came back as %v", g)
	}
	if cur, _, err := hitOne(ctx, r, "f", "sum", size, start, 0.25); err != nil || cur != 11.125 {
		t.Errorf("Hit(0.25) = %v, %v; want 11.125", cur, err)
	}
}

func TestDroppedAndInvalidDiffs(t *testing.T) {
	srv, r := startStandalone(t)
	ctx := testCtx(t)
	c := srv.Client("")
	now := steadyNow()
	r.now = func() time.Time { return now } // pushes skip windows ended at now
	size := time.Minute
	start := window.Start(now.UnixNano(), size)

	t.Run("zero, NaN and infinite values are dropped", func(t *testing.T) {
		err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "d", Diffs: []window.Diff{
			{Key: "zero", Size: size, Start: start, Value: 0},
			{Key: "nan", Size: size, Start: start, Value: math.NaN()},
			{Key: "inf", Size: size, Start: start, Value: math.Inf(1)},
			{Key: "kept", Size: size, Start: start, Value: 1},
		}})
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"zero", "nan", "inf"} {
			if n := len(keysOf(t, c, "*:"+k)); n != 0 {
				t.Errorf("diff %q reached the store", k)
			}
		}
		if n := len(keysOf(t, c, "*:kept")); n != 1 {
			t.Errorf("diff 'kept' did not reach the store")
		}
	})

	t.Run("expired windows are skipped", func(t *testing.T) {
		old := start - 2*int64(size) // ended its life as a previous window
		err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "d", Diffs: []window.Diff{
			{Key: "old", Size: size, Start: old, Value: 1},
			{Key: "prev", Size: size, Start: start - int64(size), Value: 1},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(keysOf(t, c, "*:old")); n != 0 {
			t.Errorf("an expired window reached the store")
		}
		if n := len(keysOf(t, c, "*:prev")); n != 1 {
			t.Errorf("the previous window did not reach the store")
		}
	})

	for _, tc := range []struct {
		name  string
		size  time.Duration
		start int64
		want  string
	}{
		{"sub-millisecond size", 1500 * time.Microsecond, 0, "1.5ms"},
		{"zero size", 0, 0, "0s"},
		{"negative size", -time.Second, 0, "-1s"},
		{"misaligned start", time.Second, start + 1, "not a multiple"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "bad", Diffs: []window.Diff{
				{Key: "k", Size: tc.size, Start: tc.start, Value: 1},
			}})
			checkInvalid(t, "PushDiffs", err, tc.want)
			_, err = r.GetWindow(ctx, "bad", "k", tc.size, tc.start)
			checkInvalid(t, "GetWindow", err, tc.want)
			_, _, err = r.Hit(ctx, "bad", "k", "", []strategy.WindowHit{{Size: tc.size, Start: tc.start, Value: 1, Max: math.Inf(1)}}, false)
			checkInvalid(t, "Hit", err, tc.want)
			if tc.start == 0 {
				_, err = r.GetCounters(ctx, "bad", []string{"k"}, []time.Duration{tc.size}, now)
				checkInvalid(t, "GetCounters", err, tc.want)
			}
		})
	}
	if n := len(keysOf(t, c, "*:3:bad:*")); n != 0 {
		t.Errorf("invalid windows wrote %d keys", n)
	}

	t.Run("a batch needs an ID", func(t *testing.T) {
		err := r.PushDiffs(ctx, strategy.Batch{Namespace: "d", Diffs: []window.Diff{{Key: "k", Size: size, Start: start, Value: 1}}})
		if err == nil || !strings.Contains(err.Error(), "no ID") || !strings.Contains(err.Error(), `"d"`) {
			t.Errorf("err = %v, want one about the missing ID naming the namespace", err)
		}
	})

}

func checkInvalid(t *testing.T, op string, err error, want string) {
	t.Helper()
	if !errors.Is(err, ErrInvalidWindow) {
		t.Errorf("%s: err = %v, want ErrInvalidWindow", op, err)
		return
	}
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), `"bad"`) {
		t.Errorf("%s: err = %q, want it to name %q and the namespace", op, err, want)
	}
}

func TestConcurrentPushesFromSeveralNodes(t *testing.T) {
	srv := redistest.Start(t)
	ctx := testCtx(t)
	const (
		nodes     = 4
		workers   = 4 // goroutines per node
		batches   = 10
		keys      = 50
		namespace = "shared"
	)
	now := steadyNow()
	size := time.Hour
	start := window.Start(now.UnixNano(), size)
	var rs []*Store
	for range nodes {
		rs = append(rs, open(t, &Redis{Addresses: []string{srv.Addr}}))
	}
	var wg sync.WaitGroup
	errs := make(chan error, nodes*workers)
	for n, r := range rs {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := range batches {
					var diffs []window.Diff
					for k := range keys {
						// Node n adds n+1 to every key, and 0.25 more to key 0.
						diffs = append(diffs, window.Diff{Key: fmt.Sprintf("key-%d", k), Size: size, Start: start, Value: float64(n + 1)})
					}
					diffs = append(diffs, window.Diff{Key: "key-0", Size: size, Start: start, Value: 0.25})
					id := fmt.Sprintf("node%d-worker%d-batch%d", n, w, b)
					if err := r.PushDiffs(ctx, strategy.Batch{ID: id, Namespace: namespace, Diffs: diffs}); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []string
	for k := range keys {
		all = append(all, fmt.Sprintf("key-%d", k))
	}
	counts, err := rs[0].GetCounters(ctx, namespace, all, []time.Duration{size}, now)
	if err != nil {
		t.Fatal(err)
	}
	got := countsByWindow(t, counts)
	perKey := float64(workers * batches * (1 + 2 + 3 + 4))
	for k, key := range all {
		want := perKey
		if k == 0 {
			want += nodes * workers * batches * 0.25
		}
		if v := got[winKey{key, size, start}]; v != want {
			t.Errorf("%s = %v, want %v", key, v, want)
		}
	}
}

func TestExpiry(t *testing.T) {
	srv, r := startStandalone(t)
	ctx := testCtx(t)
	c := srv.Client("")

	t.Run("every counter expires at start + 2*size + 1s", func(t *testing.T) {
		now := steadyNow()
		var diffs []window.Diff
		for _, size := range []time.Duration{time.Second, time.Minute, time.Hour} {
			start := window.Start(now.UnixNano(), size)
			diffs = append(diffs,
				window.Diff{Key: "exp", Size: size, Start: start, Value: 1},
				window.Diff{Key: "exp", Size: size, Start: start - int64(size), Value: 1})
		}
		// And keys in other buckets, of the longest window, which a
		// standalone server takes in the same script run.
		hour := window.Start(now.UnixNano(), time.Hour)
		for i := range 20 {
			diffs = append(diffs, window.Diff{Key: fmt.Sprint("exp-", i), Size: time.Hour, Start: hour, Value: 1})
		}
		id := newID()
		if err := r.PushDiffs(ctx, strategy.Batch{ID: id, Namespace: "e", Diffs: diffs}); err != nil {
			t.Fatal(err)
		}
		var latest int64
		for _, d := range diffs {
			key, _ := r.layout.counterKey(nil, bucketOf("e", d.Key), d.Size.Milliseconds(), d.Start/1e6, nsPart("e"), d.Key)
			want := (d.Start+2*int64(d.Size))/1e6 + 1000
			latest = max(latest, want)
			got, err := c.Do(ctx, "PEXPIRETIME", key).Int64()
			if err != nil {
				t.Fatal(err)
			}
			// The second window may already be gone on a slow machine (-2).
			if got != want && !(d.Size == time.Second && got == -2) {
				t.Errorf("PEXPIRETIME of %s = %d, want %d", key, got, want)
			}
		}
		// Every dedupe marker lives at least as long as the counters it
		// covers: here, all of them cover an hour window.
		markers := keysOf(t, c, "rl:{*}:push:*:"+id)
		if len(markers) != 1 {
			t.Fatalf("found %d markers, want one: a standalone server takes up to 256 counters in one script run", len(markers))
		}
		for _, m := range markers {
			got, err := c.Do(ctx, "PEXPIRETIME", m).Int64()
			if err != nil {
				t.Fatal(err)
			}
			if got < latest {
				t.Errorf("marker %s expires at %d, before its counters (%d)", m, got, latest)
			}
		}
	})

	t.Run("a hit sets the expiry", func(t *testing.T) {
		size := time.Minute
		start := window.Start(steadyNow().UnixNano(), size)
		if _, _, err := hitOne(ctx, r, "e", "hit", size, start, 1); err != nil {
			t.Fatal(err)
		}
		key, _ := r.layout.counterKey(nil, bucketOf("e", "hit"), 60000, start/1e6, nsPart("e"), "hit")
		got, err := c.Do(ctx, "PEXPIRETIME", key).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if want := start/1e6 + 120000 + 1000; got != want {
			t.Errorf("PEXPIRETIME = %d, want %d", got, want)
		}
	})

	t.Run("a sub-second window disappears", func(t *testing.T) {
		size := 200 * time.Millisecond
		// The next window: a push skips windows that ended, and this one
		// must not end before the push however slow the machine.
		start := window.Start(time.Now().UnixNano(), size) + int64(size)
		if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "e", Diffs: []window.Diff{
			{Key: "short", Size: size, Start: start, Value: 1},
		}}); err != nil {
			t.Fatal(err)
		}
		if n := len(keysOf(t, c, "*:e:short")); n != 1 {
			t.Fatalf("the counter was not written (%d keys)", n)
		}
		// It lives until start + 400ms + 1s: about 1.6s from now at most.
		poll.Until(t, 20*time.Second, "the counter of a 200ms window to expire", func() bool { return len(keysOf(t, c, "*:e:short")) == 0 })
		if ended := time.Since(time.Unix(0, start+int64(2*size))); ended < 0 {
			t.Errorf("the counter disappeared %v before its window ended", -ended)
		}
	})
}

// A fetch larger than one MGET and one pipeline: many keys in one bucket,
// two window sizes, and keys in every other bucket.
func TestFetchMany(t *testing.T) {
	_, r := startStandalone(t)
	ctx := testCtx(t)
	now := steadyNow()
	sizes := []time.Duration{time.Minute, time.Hour}
	var keys []string
	for i := 0; len(keys) < 600; i++ {
		if k := fmt.Sprint("same-", i); bucketOf("many", k) == 9 {
			keys = append(keys, k)
		}
	}
	for i := range 3000 {
		keys = append(keys, fmt.Sprint("spread-", i))
	}
	var diffs []window.Diff
	for i, k := range keys {
		for j, size := range sizes {
			start := window.Start(now.UnixNano(), size)
			diffs = append(diffs,
				window.Diff{Key: k, Size: size, Start: start, Value: float64(i + j)},
				window.Diff{Key: k, Size: size, Start: start - int64(size), Value: 0.5})
		}
	}
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "many", Diffs: diffs}); err != nil {
		t.Fatal(err)
	}
	counts, err := r.GetCounters(ctx, "many", keys, sizes, now)
	if err != nil {
		t.Fatal(err)
	}
	got := countsByWindow(t, counts)
	want := make(map[winKey]float64)
	for _, d := range diffs {
		if d.Value != 0 { // key 0's first window got a zero diff: dropped, so missing
			want[winKey{d.Key, d.Size, d.Start}] = d.Value
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %d counts, want %d; they differ", len(got), len(want))
	}
}
