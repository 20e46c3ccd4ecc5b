package strategytest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// The leases of the slot tests. longLease outlasts any test; the short
// ones expire while a test waits, which it does by polling or by sleeping
// past them, never by asserting how fast the store is.
const (
	longLease  = time.Minute
	shortLease = 300 * time.Millisecond
	// expiryWait bounds the wait for a short lease to run out, as the
	// store sees it: on a loaded machine a call can take a while.
	expiryWait = 10 * time.Second
)

// testSlots runs the tests of strategy.Slotter if the store implements it.
// A store without slots is fine: max_concurrent then counts per node.
func testSlots(t *testing.T, h Harness) {
	ss, ok := h.open(t).(strategy.Slotter)
	if !ok {
		t.Log("the store holds no concurrency slots (it is not a strategy.Slotter): nothing to check")
		return
	}
	for _, tc := range []struct {
		name string
		f    func(*testing.T, Harness, strategy.Slotter)
	}{
		{"Concurrent", testSlotsConcurrent},
		{"Churn", testSlotsChurn},
		{"Release", testSlotsRelease},
		{"SameIDRenews", testSlotsSameID},
		{"LeaseExpiry", testSlotsLeaseExpiry},
		{"Renew", testSlotsRenew},
		{"HostileKeys", testSlotsHostileKeys},
		{"Expiry", testSlotsExpiry},
		{"RejectsInput", testSlotsRejectsInput},
		{"Close", testSlotsClose},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.f(t, h, ss) })
	}
}

// slotCase is a store, a context and a namespace of its own.
type slotCase struct {
	t   *testing.T
	s   strategy.Slotter
	ctx context.Context
	ns  string
}

func newSlotCase(t *testing.T, s strategy.Slotter) *slotCase {
	return &slotCase{t: t, s: s, ctx: testContext(t), ns: unique("slots")}
}

// acquire takes a slot and checks what the store answered.
func (c *slotCase) acquire(key, id string, max int, lease time.Duration, wantHeld int, wantOK bool) {
	c.t.Helper()
	held, ok, err := c.s.AcquireSlot(c.ctx, c.ns, key, id, max, lease)
	if err != nil {
		c.t.Fatalf("acquiring slot %q of key %q: %v", id, key, err)
	}
	if held != wantHeld || ok != wantOK {
		c.t.Fatalf("acquiring slot %q of key %q (max %d): got held %d and ok %v, want %d and %v", id, key, max, held, ok, wantHeld, wantOK)
	}
}

// release frees slots.
func (c *slotCase) release(slots ...strategy.Slot) {
	c.t.Helper()
	if err := c.s.ReleaseSlots(c.ctx, c.ns, slots); err != nil {
		c.t.Fatalf("releasing %d slots: %v", len(slots), err)
	}
}

// renew renews slots.
func (c *slotCase) renew(lease time.Duration, slots ...strategy.Slot) {
	c.t.Helper()
	if err := c.s.RenewSlots(c.ctx, c.ns, slots, lease); err != nil {
		c.t.Fatalf("renewing %d slots: %v", len(slots), err)
	}
}

// raise sets m to n if n is greater.
func raise(m *atomic.Int64, n int64) {
	for old := m.Load(); n > old && !m.CompareAndSwap(old, n); old = m.Load() {
	}
}

// sleepUntil sleeps until t.
func sleepUntil(t time.Time) { time.Sleep(time.Until(t)) }

// testSlotsConcurrent checks that slots are taken atomically: of 50
// concurrent acquisitions of one key with max 5, exactly 5 succeed, each
// seeing a different number held, and the others see 5 held.
func testSlotsConcurrent(t *testing.T, _ Harness, s strategy.Slotter) {
	c := newSlotCase(t, s)
	const workers, max = 50, 5
	var (
		mu       sync.Mutex
		taken    []int // held, as each successful call saw it
		refused  []int // held, as each refused call saw it
		wg       sync.WaitGroup
		start    = make(chan struct{})
		takenIDs []strategy.Slot
	)
	for i := range workers {
		wg.Go(func() {
			<-start
			id := fmt.Sprintf("req-%d", i)
			held, ok, err := s.AcquireSlot(c.ctx, c.ns, "k", id, max, longLease)
			if err != nil {
				t.Errorf("acquiring slot %s: %v", id, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				taken = append(taken, held)
				takenIDs = append(takenIDs, strategy.Slot{Key: "k", ID: id})
			} else {
				refused = append(refused, held)
			}
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	slices.Sort(taken)
	if !slices.Equal(taken, []int{1, 2, 3, 4, 5}) {
		t.Errorf("the successful acquisitions saw %v slots held, want each of 1 to %d once", taken, max)
	}
	for _, held := range refused {
		if held != max {
			t.Errorf("a refused acquisition saw %d slots held, want %d", held, max)
			break
		}
	}
	// Freeing one place lets exactly one more in.
	c.release(takenIDs[0])
	c.acquire("k", "late-1", max, longLease, max, true)
	c.acquire("k", "late-2", max, longLease, max, false)
}

// testSlotsChurn checks that slots taken and freed by many goroutines at
// once never admit more than max: a goroutine counts itself in after its
// slot is taken and out before it frees it, so the count it sees can
// never exceed the store's.
func testSlotsChurn(t *testing.T, _ Harness, s strategy.Slotter) {
	c := newSlotCase(t, s)
	const workers, rounds, max = 16, 15, 3
	var (
		inFlight, most, admitted atomic.Int64
		wg                       sync.WaitGroup
	)
	for g := range workers {
		wg.Go(func() {
			for r := range rounds {
				id := fmt.Sprintf("g%d-r%d", g, r)
				held, ok, err := s.AcquireSlot(c.ctx, c.ns, "k", id, max, longLease)
				if err != nil {
					t.Errorf("acquiring slot %s: %v", id, err)
					return
				}
				if held > max {
					t.Errorf("acquiring slot %s: the store reports %d held, more than %d", id, held, max)
				}
				if !ok {
					continue
				}
				admitted.Add(1)
				raise(&most, inFlight.Add(1))
				time.Sleep(time.Millisecond)
				inFlight.Add(-1)
				if err := s.ReleaseSlots(c.ctx, c.ns, []strategy.Slot{{Key: "k", ID: id}}); err != nil {
					t.Errorf("releasing slot %s: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d of %d acquisitions were admitted, at most %d at once", admitted.Load(), workers*rounds, most.Load())
	if m := most.Load(); m > max {
		t.Errorf("%d slots were held at once, more than max %d", m, max)
	}
	if admitted.Load() < max {
		t.Errorf("only %d acquisitions were admitted, want at least %d", admitted.Load(), max)
	}
	// Every slot was freed: a new one is alone.
	c.acquire("k", "after", max, longLease, 1, true)
}

// testSlotsRelease checks that a release frees a place, that freeing what
// is not held is no error, and that one call frees slots of several keys.
func testSlotsRelease(t *testing.T, _ Harness, s strategy.Slotter) {
	c := newSlotCase(t, s)
	a, b := strategy.Slot{Key: "k", ID: "a"}, strategy.Slot{Key: "k", ID: "b"}
	c.acquire("k", "a", 2, longLease, 1, true)
	c.acquire("k", "b", 2, longLease, 2, true)
	c.acquire("k", "c", 2, longLease, 2, false)
	c.release(a)
	c.acquire("k", "c", 2, longLease, 2, true)
	// Released twice, never taken, of a key or a namespace without slots:
	// no error, and nothing else freed.
	c.release(a, a, strategy.Slot{Key: "k", ID: "never"}, strategy.Slot{Key: "absent", ID: "a"})
	c.release()
	if err := s.ReleaseSlots(c.ctx, unique("slots-other"), []strategy.Slot{b}); err != nil {
		t.Fatalf("releasing a slot in a namespace without slots: %v", err)
	}
	c.acquire("k", "d", 2, longLease, 2, false)

	// One call frees slots of several keys.
	var all []strategy.Slot
	for i := range 5 {
		key := fmt.Sprintf("multi-%d", i)
		for _, id := range []string{"x", "y"} {
			c.acquire(key, id, 2, longLease, len(all)%2+1, true)
			all = append(all, strategy.Slot{Key: key, ID: id})
		}
	}
	all = append(all, b, strategy.Slot{Key: "k", ID: "c"})
	c.release(all...)
	for i := range 5 {
		c.acquire(fmt.Sprintf("multi-%d", i), "z", 2, longLease, 1, true)
	}
	c.acquire("k", "d", 2, longLease, 1, true)
}

// testSlotsSameID checks that acquiring an id that is held renews it: it
// succeeds, whatever the number held, takes no second place, and its new
// lease counts.
func testSlotsSameID(t *testing.T, _ Harness, s strategy.Slotter) {
	c := newSlotCase(t, s)
	c.acquire("k", "a", 1, longLease, 1, true)
	c.acquire("k", "a", 1, longLease, 1, true)
	c.acquire("k", "b", 1, longLease, 1, false)
	c.acquire("k2", "a", 3, longLease, 1, true)
	c.acquire("k2", "a", 3, longLease, 1, true)
	c.acquire("k2", "b", 3, longLease, 2, true)
	c.acquire("k2", "a", 1, longLease, 2, true) // held, though max is now 1

	// A short lease, then the same id with a long one before it ends: the
	// slot outlives the short lease.
	start := time.Now()
	c.acquire("short", "a", 1, shortLease, 1, true)
	c.acquire("short", "a", 1, longLease, 1, true)
	if time.Since(start) >= shortLease {
		t.Skipf("acquiring twice took %v, more than the short lease: the machine is too slow to check a renewal", time.Since(start))
	}
	sleepUntil(start.Add(shortLease + 200*time.Millisecond))
	c.acquire("short", "b", 1, longLease, 1, false)
}

// testSlotsLeaseExpiry checks that a slot that is neither released nor
// renewed frees its place once its lease ends.
func testSlotsLeaseExpiry(t *testing.T, _ Harness, s strategy.Slotter) {
	c := newSlotCase(t, s)
	start := time.Now()
	c.acquire("k", "a", 1, shortLease, 1, true)
	held, ok, err := s.AcquireSlot(c.ctx, c.ns, "k", "b", 1, longLease)
	switch {
	case err != nil:
		t.Fatalf("acquiring slot b: %v", err)
	case time.Since(start) < shortLease && (ok || held != 1):
		t.Fatalf("acquiring slot b while a holds the only place: got held %d and ok %v, want 1 and false", held, ok)
	case ok:
		t.Log("the machine is too slow to see the slot held before its lease ended")
		return
	}
	poll.Until(t, expiryWait, "slot a's lease to end", func() bool {
		held, ok, err := s.AcquireSlot(c.ctx, c.ns, "k", "b", 1, longLease)
		if err != nil {
			t.Fatalf("acquiring slot b: %v", err)
		}
		if ok && held != 1 {
			t.Fatalf("acquiring slot b after a's lease ended: %d held, want 1", held)
		}
		return ok
	})
	if since := time.Since(start); since < shortLease {
		t.Errorf("slot a's place was free after %v, before its lease of %v ended", since, shortLease)
	}
}

// testSlotsRenew checks that a renewal keeps a slot past its first lease,
// skips slots that are not held, and does not take again a slot whose
// lease ended.
func testSlotsRenew(t *testing.T, _ Harness, s strategy.Slotter) {
	c := newSlotCase(t, s)
	a := strategy.Slot{Key: "k", ID: "a"}
	start := time.Now()
	c.acquire("k", "a", 1, shortLease, 1, true)
	c.renew(longLease, a, strategy.Slot{Key: "k", ID: "never"}, strategy.Slot{Key: "absent", ID: "a"})
	c.renew(longLease) // nothing to renew
	if time.Since(start) >= shortLease {
		t.Skipf("acquiring and renewing took %v, more than the lease: the machine is too slow to check a renewal", time.Since(start))
	}
	sleepUntil(start.Add(shortLease + 200*time.Millisecond))
	c.acquire("k", "b", 1, longLease, 1, false)
	// The renewal took no place for the slots that were not held.
	c.acquire("absent", "b", 1, longLease, 1, true)
	c.release(a)
	c.acquire("k", "b", 1, longLease, 1, true)

	// A slot whose lease ended is not taken again by a renewal. Its lease
	// ended at most shortLease after the call returned, by any clock that
	// runs at the rate of this one.
	c.acquire("gone", "x", 1, shortLease, 1, true)
	sleepUntil(time.Now().Add(shortLease + 100*time.Millisecond))
	c.renew(longLease, strategy.Slot{Key: "gone", ID: "x"})
	c.acquire("gone", "y", 1, longLease, 1, true)
}

// testSlotsHostileKeys checks that keys and namespaces are data: no
// separator, brace, NUL, invalid UTF-8 or length makes two keys, or a key
// of two namespaces, share slots.
func testSlotsHostileKeys(t *testing.T, _ Harness, s strategy.Slotter) {
	ctx, base := testContext(t), unique("slots-hostile")
	pairs := hostilePairs(base)
	acquire := func(p pair, id string, wantHeld int, wantOK bool) {
		t.Helper()
		held, ok, err := s.AcquireSlot(ctx, p.namespace, p.key, id, 1, longLease)
		if err != nil {
			t.Fatalf("acquiring slot %s of key %.40q of namespace %q: %v", id, p.key, strings.TrimPrefix(p.namespace, base), err)
		}
		if held != wantHeld || ok != wantOK {
			t.Fatalf("acquiring slot %s of key %.40q of namespace %q (max 1): got held %d and ok %v, want %d and %v",
				id, p.key, strings.TrimPrefix(p.namespace, base), held, ok, wantHeld, wantOK)
		}
	}
	// Every pair has a place of its own.
	for _, p := range pairs {
		acquire(p, "first", 1, true)
	}
	for _, p := range pairs {
		acquire(p, "second", 1, false)
	}
	// One release per namespace frees its keys' slots, and only them.
	byNS := make(map[string][]strategy.Slot)
	for _, p := range pairs {
		byNS[p.namespace] = append(byNS[p.namespace], strategy.Slot{Key: p.key, ID: "first"})
	}
	if err := s.ReleaseSlots(ctx, base, byNS[base]); err != nil {
		t.Fatalf("releasing the slots of namespace base: %v", err)
	}
	for _, p := range pairs {
		if p.namespace == base {
			acquire(p, "second", 1, true)
		} else {
			acquire(p, "second", 1, false)
		}
	}
	// A slot ID is data too.
	for _, id := range []string{"{a}", "\x00", "\xff", strings.Repeat("i", strategy.MaxIDLen)} {
		if _, ok, err := s.AcquireSlot(ctx, base, "ids", id, 10, longLease); err != nil || !ok {
			t.Fatalf("acquiring slot %.20q: got ok %v and error %v", id, ok, err)
		}
	}
	held, _, err := s.AcquireSlot(ctx, base, "ids", "{a}", 10, longLease)
	if err != nil || held != 4 {
		t.Fatalf("acquiring a held slot of 4 of key ids: got held %d and error %v, want 4", held, err)
	}
}

// testSlotsExpiry checks that the slots of a key expire on their own, so
// that a store never grows without bound, using Harness.Slots.
func testSlotsExpiry(t *testing.T, h Harness, s strategy.Slotter) {
	if h.Slots == nil {
		t.Log("Harness.Slots is nil: the store's slots are not counted")
		return
	}
	c := newSlotCase(t, s)
	const nKeys = 10
	for i := range nKeys {
		key := fmt.Sprintf("k%d", i)
		c.acquire(key, "a", 2, shortLease, 1, true)
		c.acquire(key, "b", 2, shortLease, 2, true)
	}
	c.release(strategy.Slot{Key: "k0", ID: "a"}, strategy.Slot{Key: "k0", ID: "b"})
	if n := h.Slots(t, s, c.ns); n > 2*nKeys {
		t.Errorf("the store holds %d slots of namespace %s, want at most %d", n, c.ns, 2*nKeys)
	}
	poll.Until(t, expiryWait, "the slots of namespace "+c.ns+" to expire", func() bool {
		return h.Slots(t, s, c.ns) == 0
	})
}

// testSlotsRejectsInput checks that input no store can take is refused
// with an error that wraps strategy.ErrRejected, before anything changes.
func testSlotsRejectsInput(t *testing.T, _ Harness, s strategy.Slotter) {
	c := newSlotCase(t, s)
	long := strings.Repeat("i", strategy.MaxIDLen+1)
	for _, tc := range []struct {
		name  string
		id    string
		max   int
		lease time.Duration
	}{
		{"empty id", "", 1, longLease},
		{"id too long", long, 1, longLease},
		{"max 0", "a", 0, longLease},
		{"negative max", "a", -1, longLease},
		{"zero lease", "a", 1, 0},
		{"negative lease", "a", 1, -time.Second},
		{"lease under 1ms", "a", 1, time.Millisecond - 1},
		{"lease over an hour", "a", 1, strategy.MaxSlotLease + time.Millisecond},
	} {
		if _, ok, err := s.AcquireSlot(c.ctx, c.ns, "k", tc.id, tc.max, tc.lease); !errors.Is(err, strategy.ErrRejected) || ok {
			t.Errorf("acquiring with %s: got ok %v and error %v, want an error that wraps ErrRejected", tc.name, ok, err)
		}
	}
	good := strategy.Slot{Key: "k", ID: "a"}
	for _, tc := range []struct {
		name  string
		slots []strategy.Slot
		lease time.Duration
	}{
		{"empty id", []strategy.Slot{good, {Key: "k"}}, longLease},
		{"id too long", []strategy.Slot{good, {Key: "k", ID: long}}, longLease},
		{"zero lease", []strategy.Slot{good}, 0},
		{"lease over an hour", []strategy.Slot{good}, 2 * strategy.MaxSlotLease},
	} {
		if err := s.RenewSlots(c.ctx, c.ns, tc.slots, tc.lease); !errors.Is(err, strategy.ErrRejected) {
			t.Errorf("renewing with %s: got error %v, want one that wraps ErrRejected", tc.name, err)
		}
		if tc.lease == longLease {
			if err := s.ReleaseSlots(c.ctx, c.ns, tc.slots); !errors.Is(err, strategy.ErrRejected) {
				t.Errorf("releasing with %s: got error %v, want one that wraps ErrRejected", tc.name, err)
			}
		}
	}
	// Nothing was taken, and the bounds themselves are taken.
	c.acquire("k", strings.Repeat("i", strategy.MaxIDLen), 1, strategy.MinSlotLease, 1, true)
	c.acquire("k2", "a", 1, strategy.MaxSlotLease, 1, true)
	c.renew(strategy.MaxSlotLease, strategy.Slot{Key: "k2", ID: "a"})
	c.release(strategy.Slot{Key: "k2", ID: "a"})
}

// testSlotsClose checks that slot calls on a closed store fail with an
// error that wraps strategy.ErrNotSent, and so take nothing.
func testSlotsClose(t *testing.T, h Harness, _ strategy.Slotter) {
	ctx, ns := testContext(t), unique("slots-close")
	s := h.Open(t)
	if s == nil {
		t.Fatal("Harness.Open returned a nil store")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("closing the store: %v", err)
	}
	ss := s.(strategy.Slotter)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, strategy.ErrNotSent) {
			t.Errorf("%s after Close: got error %v, want one that wraps ErrNotSent", what, err)
		}
	}
	_, ok, err := ss.AcquireSlot(ctx, ns, "k", "a", 1, longLease)
	check("AcquireSlot", err)
	if ok {
		t.Error("AcquireSlot after Close reported the slot taken")
	}
	check("ReleaseSlots", ss.ReleaseSlots(ctx, ns, []strategy.Slot{{Key: "k", ID: "a"}}))
	check("RenewSlots", ss.RenewSlots(ctx, ns, []strategy.Slot{{Key: "k", ID: "a"}}, longLease))
	fresh := h.open(t).(strategy.Slotter)
	held, ok, err := fresh.AcquireSlot(ctx, ns, "k", "b", 1, longLease)
	if err != nil || !ok || held != 1 {
		t.Errorf("acquiring on an open store after calls on a closed one: got held %d, ok %v and error %v, want 1, true and none", held, ok, err)
	}
}
