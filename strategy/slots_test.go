package strategy_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

func TestCheckAcquire(t *testing.T) {
	maxID := strings.Repeat("i", strategy.MaxIDLen)
	for _, tc := range []struct {
		id    string
		max   int
		lease time.Duration
	}{
		{"a", 1, time.Millisecond},
		{maxID, 1 << 40, time.Hour},
		{"\x00{}", 20, 30 * time.Second},
		{"a", 1, 1500 * time.Microsecond}, // counted as 1ms
	} {
		if err := strategy.CheckAcquire(tc.id, tc.max, tc.lease); err != nil {
			t.Errorf("CheckAcquire(%.10q, %d, %v) = %v, want nil", tc.id, tc.max, tc.lease, err)
		}
	}
	for _, tc := range []struct {
		id    string
		max   int
		lease time.Duration
		want  string
	}{
		{"", 1, time.Second, "a slot's ID has 0 bytes, not 1 to 256"},
		{maxID + "x", 1, time.Second, "a slot's ID has 257 bytes, not 1 to 256"},
		{"a", 0, time.Second, "a key's most slots is 0, less than 1"},
		{"a", -3, time.Second, "a key's most slots is -3, less than 1"},
		{"a", 1, 0, "a slot's lease is 0s, not within [1ms, 1h0m0s]"},
		{"a", 1, time.Millisecond - 1, "a slot's lease is 999.999µs"},
		{"a", 1, -time.Second, "a slot's lease is -1s"},
		{"a", 1, time.Hour + time.Millisecond, "a slot's lease is 1h0m0.001s"},
	} {
		err := strategy.CheckAcquire(tc.id, tc.max, tc.lease)
		if !errors.Is(err, strategy.ErrRejected) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckAcquire(%.10q, %d, %v) = %v, want an error that wraps ErrRejected and says %q", tc.id, tc.max, tc.lease, err, tc.want)
		}
	}
}

func TestCheckSlots(t *testing.T) {
	if err := strategy.CheckSlots(nil); err != nil {
		t.Errorf("CheckSlots(nil) = %v, want nil", err)
	}
	good := []strategy.Slot{{Key: "", ID: "a"}, {Key: "\xff", ID: strings.Repeat("i", strategy.MaxIDLen)}}
	if err := strategy.CheckSlots(good); err != nil {
		t.Errorf("CheckSlots of good slots = %v, want nil", err)
	}
	err := strategy.CheckSlots(append(good, strategy.Slot{Key: "k"}, strategy.Slot{Key: "k", ID: strings.Repeat("i", 300)}))
	if !errors.Is(err, strategy.ErrRejected) || !strings.HasPrefix(err.Error(), "slots[2]: ") {
		t.Errorf("CheckSlots = %v, want the first bad slot, slots[2], wrapping ErrRejected", err)
	}
}

func TestCheckRenew(t *testing.T) {
	good := []strategy.Slot{{Key: "k", ID: "a"}}
	if err := strategy.CheckRenew(good, time.Second); err != nil {
		t.Errorf("CheckRenew of good input = %v, want nil", err)
	}
	for _, tc := range []struct {
		slots []strategy.Slot
		lease time.Duration
		want  string
	}{
		{good, 0, "a slot's lease is 0s"},
		{[]strategy.Slot{{Key: "k"}}, time.Second, "slots[0]: "},
		{[]strategy.Slot{{Key: "k"}}, -time.Second, "a slot's lease is -1s"}, // the lease first
	} {
		err := strategy.CheckRenew(tc.slots, tc.lease)
		if !errors.Is(err, strategy.ErrRejected) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckRenew(%v, %v) = %v, want an error that wraps ErrRejected and says %q", tc.slots, tc.lease, err, tc.want)
		}
	}
}

func TestLeaseMs(t *testing.T) {
	for lease, want := range map[time.Duration]int64{
		time.Millisecond:              1,
		1999 * time.Microsecond:       1,
		30 * time.Second:              30000,
		strategy.MaxSlotLease:         3600000,
		time.Second + time.Nanosecond: 1000,
	} {
		if got := strategy.LeaseMs(lease); got != want {
			t.Errorf("LeaseMs(%v) = %d, want %d", lease, got, want)
		}
	}
}
