package window

import (
	"math"
	"runtime"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

// tenPerSecond is nginx's rate=10r/s burst=5: 6 at once, then one per
// 100ms.
var tenPerSecond = Rate{Window: time.Second, N: 10, Burst: 5}

func TestRateCheck(t *testing.T) {
	for i, r := range []Rate{
		{Window: 0, N: 1},
		{Window: time.Second, N: 0},
		{Window: time.Second, N: -1},
		{Window: time.Second, N: 1, Burst: -1},
		{Window: time.Second, N: 1, Burst: nan()},
	} {
		if err := r.Check(); err == nil {
			t.Errorf("Test %d: %+v accepted", i, r)
		}
	}
	if err := tenPerSecond.Check(); err != nil {
		t.Fatal(err)
	}
}

func nan() float64 { return math.NaN() }

// TestConformBurstThenRate: 1 + burst requests at once, then one per
// emission interval, each rejection telling the exact wait.
func TestConformBurstThenRate(t *testing.T) {
	now := base.UnixNano()
	var tat int64
	for i := range 6 {
		var wait time.Duration
		if tat, wait = Conform(tat, now, tenPerSecond, 1); wait != 0 {
			t.Fatalf("request %d of the burst waits %v", i+1, wait)
		}
	}
	if _, wait := Conform(tat, now, tenPerSecond, 1); wait != 100*time.Millisecond {
		t.Fatalf("the 7th request at once waits %v, want 100ms", wait)
	}
	// 99ms later: still 1ms to wait; at 100ms, one; then 100ms again.
	if _, wait := Conform(tat, now+int64(99*time.Millisecond), tenPerSecond, 1); wait != time.Millisecond {
		t.Fatalf("after 99ms: waits %v, want 1ms", wait)
	}
	for step := 1; step <= 20; step++ {
		at := now + int64(step)*int64(100*time.Millisecond)
		var wait time.Duration
		if tat, wait = Conform(tat, at, tenPerSecond, 1); wait != 0 {
			t.Fatalf("step %d: the request due waits %v", step, wait)
		}
		if _, wait = Conform(tat, at, tenPerSecond, 1); wait != 100*time.Millisecond {
			t.Fatalf("step %d: a second request waits %v, want 100ms", step, wait)
		}
	}
	// Idle for the whole burst's length: the whole burst is back.
	later := now + int64(21*100*time.Millisecond) + int64(600*time.Millisecond)
	if got := (RateSample{TAT: tat, At: later}).Remaining(tenPerSecond); got != 6 {
		t.Fatalf("after idling: %d remaining, want 6", got)
	}
}

func TestConformCost(t *testing.T) {
	now := base.UnixNano()
	tat, wait := Conform(0, now, tenPerSecond, 4)
	if wait != 0 || tat != now+int64(400*time.Millisecond) {
		t.Fatalf("cost 4: TAT +%v, wait %v", time.Duration(tat-now), wait)
	}
	if _, wait = Conform(tat, now, tenPerSecond, 3); wait != 100*time.Millisecond {
		t.Fatalf("cost 3 after 4: waits %v, want 100ms", wait)
	}
	if _, wait = Conform(tat, now, tenPerSecond, 2); wait != 0 {
		t.Fatalf("cost 2 after 4: waits %v, want 0", wait)
	}
	if _, wait = Conform(0, now, tenPerSecond, 7); wait != Never {
		t.Fatalf("cost 7 over a burst of 6: waits %v, want Never", wait)
	}
	if next, wait := Conform(tat, now, tenPerSecond, 0); wait != 0 || next != tat {
		t.Fatalf("cost 0 changed the TAT or waited: %v, %v", next-tat, wait)
	}
	// A rate of 3 per second, an interval of a third of a second: 3
	// requests at once with burst 2, a fourth one interval later.
	third := Rate{Window: time.Second, N: 3, Burst: 2}
	tat = 0
	for range 3 {
		if tat, wait = Conform(tat, now, third, 1); wait != 0 {
			t.Fatalf("3/s burst 2: waits %v within the burst", wait)
		}
	}
	if _, wait = Conform(tat, now, third, 1); wait < 333*time.Millisecond || wait > 334*time.Millisecond {
		t.Fatalf("3/s burst 2: the 4th waits %v, want a third of a second", wait)
	}
}

func TestRateSampleHeaders(t *testing.T) {
	now := base.UnixNano()
	s := RateSample{At: now}
	if got := s.Remaining(tenPerSecond); got != 6 {
		t.Errorf("new key: remaining %d, want 6", got)
	}
	if got := s.Refill(tenPerSecond); got != 0 {
		t.Errorf("new key: refill %v, want 0", got)
	}
	s.TAT = now + int64(250*time.Millisecond) // 2.5 intervals used
	if got := s.Remaining(tenPerSecond); got != 3 {
		t.Errorf("2.5 used: remaining %d, want 3", got)
	}
	if got := s.Refill(tenPerSecond); got != 50*time.Millisecond {
		t.Errorf("2.5 used: refill %v, want 50ms", got)
	}
	if got := s.Full(); got != 250*time.Millisecond {
		t.Errorf("2.5 used: full %v, want 250ms", got)
	}
	s.TAT = now + int64(600*time.Millisecond) // the burst used up
	if got := s.Remaining(tenPerSecond); got != 0 {
		t.Errorf("burst used: remaining %d, want 0", got)
	}
	if got := s.Refill(tenPerSecond); got != 100*time.Millisecond {
		t.Errorf("burst used: refill %v, want 100ms", got)
	}
	if got := s.Wait(tenPerSecond, 1); got != 100*time.Millisecond {
		t.Errorf("burst used: wait %v, want 100ms", got)
	}
}

// TestHitRate: the zone keeps one TAT per key under the rate's window,
// checked before the limits; a request the rate rejects counts in no
// window, one a limit rejects moves no TAT.
func TestHitRate(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	ns := mustNamespace(t, z, "r")
	limits := []Limit{{Size: time.Minute, Max: 8}}
	out := make([]Sample, 1)
	var rs RateSample
	admitted := 0
	for range 20 {
		ok, rejected := ns.HitRate("k", tenPerSecond, 1, limits, 1, false, false, false, out, &rs)
		if ok && rejected < 0 {
			admitted++
		}
	}
	if admitted != 6 {
		t.Fatalf("20 at once: %d admitted, want 6", admitted)
	}
	if got := out[0].Current; got != 6 {
		t.Fatalf("the minute counts %v, want 6: requests the rate rejected must not count", got)
	}
	if got := rs.Remaining(tenPerSecond); got != 0 {
		t.Fatalf("remaining %d after the burst", got)
	}
	// One per 100ms, until the minute's limit of 8 rejects: that request
	// counts in the minute (the penalty) and leaves the TAT.
	for step := 1; step <= 3; step++ {
		clock.Advance(100 * time.Millisecond)
		ok, rejected := ns.HitRate("k", tenPerSecond, 1, limits, 1, false, false, false, out, &rs)
		switch {
		case step <= 2 && (!ok || rejected >= 0):
			t.Fatalf("step %d: rate %v, limit %d: want admitted", step, ok, rejected)
		case step == 3 && (!ok || rejected != 0):
			t.Fatalf("step 3: rate %v, limit %d: want the limit to reject", ok, rejected)
		}
	}
	before := rs.TAT
	if after := ns.ReadRate("k", time.Second); after.TAT != before {
		t.Fatalf("a request the limit rejected moved the TAT by %v", time.Duration(after.TAT-before))
	}
	// The same window's rate is the same state; another window's is not.
	if got := ns.ReadRate("k", time.Minute).TAT; got != 0 {
		t.Fatalf("the TAT of another window is %d, want 0", got)
	}
	// Reset gives the whole burst back.
	ns.Reset("k")
	if got := ns.ReadRate("k", time.Second).Remaining(tenPerSecond); got != 6 {
		t.Fatalf("after reset: %d remaining, want 6", got)
	}
}

func TestHitRateIfRoom(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 100, clock)
	ns := mustNamespace(t, z, "r")
	limits := []Limit{{Size: time.Minute, Max: 7}}
	out := make([]Sample, 1)
	var rs RateSample
	for i := range 6 {
		if ok, rejected, _ := ns.HitRateIfRoom("k", tenPerSecond, 1, limits, 1, out, &rs); !ok || rejected >= 0 {
			t.Fatalf("request %d of the burst: rate %v, limit %d", i+1, ok, rejected)
		}
	}
	ok, rejected, wait := ns.HitRateIfRoom("k", tenPerSecond, 1, limits, 1, out, &rs)
	if ok || rejected >= 0 || wait != 100*time.Millisecond {
		t.Fatalf("7th: rate %v, limit %d, wait %v: want the rate to say 100ms", ok, rejected, wait)
	}
	if got := out[0].Current; got != 6 {
		t.Fatalf("a request that waits counted: the minute holds %v", got)
	}
	clock.Advance(wait)
	if ok, rejected, _ = ns.HitRateIfRoom("k", tenPerSecond, 1, limits, 1, out, &rs); !ok || rejected >= 0 {
		t.Fatalf("after the wait: rate %v, limit %d", ok, rejected)
	}
	clock.Advance(100 * time.Millisecond)
	tat := rs.TAT
	ok, rejected, wait = ns.HitRateIfRoom("k", tenPerSecond, 1, limits, 1, out, &rs)
	if !ok || rejected != 0 || wait <= 0 {
		t.Fatalf("the minute full: rate %v, limit %d, wait %v", ok, rejected, wait)
	}
	if got := ns.ReadRate("k", time.Second).TAT; got != tat {
		t.Fatalf("a request without room moved the TAT by %v", time.Duration(got-tat))
	}
}

// TestRateLeavesTheZone: a rate-only key is swept once its TAT has
// passed, not before; eviction and a reshard keep the zone bounded and
// the TATs it holds.
func TestRateLeavesTheZone(t *testing.T) {
	clock := fakeclock.New(base)
	z := mustZone(t, 20, clock)
	ns := mustNamespace(t, z, "r")
	var rs RateSample
	for range 6 {
		ns.HitRate("busy", tenPerSecond, 1, nil, 1, false, false, false, nil, &rs)
	}
	ns.HitRate("idle", tenPerSecond, 1, nil, 1, false, false, false, nil, &rs)
	clock.Advance(200 * time.Millisecond)
	z.Sweep()
	if z.Len() != 1 || ns.ReadRate("busy", time.Second).TAT == 0 {
		t.Fatalf("sweep: %d keys, want only busy, which has 400ms to go", z.Len())
	}
	// Resize to many shards and back: the TAT moves with its key.
	tat := ns.ReadRate("busy", time.Second).TAT
	if err := z.Resize(10_000); err != nil {
		t.Fatal(err)
	}
	if got := ns.ReadRate("busy", time.Second).TAT; got != tat {
		t.Fatalf("after a reshard the TAT moved by %v", time.Duration(got-tat))
	}
	if err := z.Resize(20); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		ns.HitRate("k"+strconv.Itoa(i), tenPerSecond, 1, nil, 1, false, false, false, nil, &rs)
	}
	if z.Len() != 20 {
		t.Fatalf("zone of 20 holds %d keys", z.Len())
	}
	clock.Advance(time.Second)
	z.Sweep()
	if z.Len() != 0 {
		t.Fatalf("every TAT passed, yet %d keys stay", z.Len())
	}
}

// TestRateMemoryPerKey measures what a key under a rate costs a zone, as
// TestMemoryPerKey does for a key with one window: the TAT lives in the
// key's entry, in place of a window's counts.
func TestRateMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a large zone")
	}
	const n = 200_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	z, err := NewZone(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := z.Namespace("mem")
	var buf []byte
	var rs RateSample
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "10.0."...), int64(i), 10)
		ns.HitRate(string(buf), tenPerSecond, 1, nil, 1, false, false, false, nil, &rs)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if z.Len() != n {
		t.Fatalf("zone holds %d keys, want %d", z.Len(), n)
	}
	runtime.KeepAlive(z)
	perKey := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.1f heap bytes per key under a rate (entry %d bytes)", perKey, entrySize)
	if perKey > 150 {
		t.Fatalf("%.1f heap bytes per key, want at most 150", perKey)
	}
}

// BenchmarkHitRate decides a request of one existing key under a rate.
func BenchmarkHitRate(b *testing.B) {
	z, _ := NewZone(1000, nil)
	ns, _ := z.Namespace("bench")
	r := Rate{Window: time.Nanosecond, N: 1, Burst: 1} // always admits
	var rs RateSample
	b.ReportAllocs()
	for b.Loop() {
		ns.HitRate("10.0.0.1", r, 1, nil, 1, false, false, false, nil, &rs)
	}
}

// entrySize is the size of an entry, which holds the key's TAT.
const entrySize = int(unsafe.Sizeof(entry{}))
