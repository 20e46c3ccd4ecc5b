package memory

import (
	"fmt"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// acquire takes a slot and checks what the store answered.
func acquire(t *testing.T, s *Store, key, id string, max int, lease time.Duration, wantHeld int, wantOK bool) {
	t.Helper()
	held, ok, err := s.AcquireSlot(t.Context(), "ns", key, id, max, lease)
	if err != nil || held != wantHeld || ok != wantOK {
		t.Fatalf("acquiring slot %s of key %s: got held %d, ok %v and error %v, want %d and %v", id, key, held, ok, err, wantHeld, wantOK)
	}
}

// A slot expires exactly its lease, in whole milliseconds, after the
// store's clock's now; a renewal or an acquisition of its id dates it
// anew.
func TestSlotLeaseByTheStoreClock(t *testing.T) {
	s, clock := newTestStore()
	acquire(t, s, "k", "a", 1, time.Second+time.Microsecond, 1, true) // counts as 1s
	clock.Advance(time.Second - 1)
	acquire(t, s, "k", "b", 1, time.Second, 1, false)
	clock.Advance(1)
	acquire(t, s, "k", "b", 1, time.Second, 1, true)

	// Renewed at 500ms for a second: held until 1.5s.
	clock.Advance(500 * time.Millisecond)
	if err := s.RenewSlots(t.Context(), "ns", []strategy.Slot{{Key: "k", ID: "b"}}, time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second - 1)
	acquire(t, s, "k", "c", 1, time.Second, 1, false)
	// Acquired again under its id for 2s: held until 2s from now.
	acquire(t, s, "k", "b", 1, 2*time.Second, 1, true)
	clock.Advance(2*time.Second - 1)
	acquire(t, s, "k", "c", 1, time.Second, 1, false)
	clock.Advance(1)
	// Expired: a renewal does not take it again.
	if err := s.RenewSlots(t.Context(), "ns", []strategy.Slot{{Key: "k", ID: "b"}}, time.Minute); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, "k", "c", 1, time.Second, 1, true)
}

// Slots leave nothing behind: once their leases end, or they are
// released, the data set holds no key of theirs and no expiry entry.
func TestSlotsLeaveNothingBehind(t *testing.T) {
	s, clock := newTestStore()
	for i := range 100 {
		key := fmt.Sprint("k", i%10)
		acquire(t, s, key, fmt.Sprint("id", i), 100, time.Second, i/10+1, true)
	}
	var some, rest []strategy.Slot
	for i := range 100 {
		sl := strategy.Slot{Key: fmt.Sprint("k", i%10), ID: fmt.Sprint("id", i)}
		if i < 50 {
			some = append(some, sl)
		} else {
			rest = append(rest, sl)
		}
	}
	if err := s.ReleaseSlots(t.Context(), "ns", some); err != nil {
		t.Fatal(err)
	}
	if n := s.Slots("ns"); n != 50 {
		t.Fatalf("after releasing 50 of 100 slots, %d held, want 50", n)
	}
	// Renewals add expiry entries, which the sweep drops too.
	for range 5 {
		clock.Advance(500 * time.Millisecond)
		if err := s.RenewSlots(t.Context(), "ns", rest, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Slots("ns"); n != 50 {
		t.Fatalf("after renewals past the first lease, %d held, want 50", n)
	}
	clock.Advance(time.Second)
	if n := s.Slots("ns"); n != 0 {
		t.Fatalf("after every lease ended, %d slots held, want 0", n)
	}
	if len(s.data.slots.m) != 0 || len(s.data.slots.q) != 0 {
		t.Errorf("after every lease ended, the data set holds %d keys of slots and %d expiry entries, want none", len(s.data.slots.m), len(s.data.slots.q))
	}
}
