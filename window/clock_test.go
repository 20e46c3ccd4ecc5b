package window

import (
	"testing"
	"time"
)

func TestSystemClockFollowsTheWallClock(t *testing.T) {
	for range 5 {
		before := time.Now().UnixNano()
		got := SystemClock()
		after := time.Now().UnixNano()
		// A millisecond of slack: the wall clock may be slewed by NTP
		// between two readings of its base.
		if got < before-int64(time.Millisecond) || got > after+int64(time.Millisecond) {
			t.Fatalf("SystemClock = %d, want within [%d, %d]", got, before, after)
		}
		time.Sleep(10 * time.Millisecond) // not a wait: the wall clock moves on between the samples it follows
	}
}

// TestSystemClockFollowsAStep plays a wall clock stepped by an hour since
// the last base: once the base is older than rebaseInterval, SystemClock
// reads the wall clock again.
func TestSystemClockFollowsAStep(t *testing.T) {
	defer rebase()
	now := time.Now()
	stale := &wallBase{mono: now.Add(-rebaseInterval), wall: now.Add(-rebaseInterval + time.Hour).UnixNano()}
	clockBase.Store(stale)
	if got := SystemClock(); got > time.Now().UnixNano() {
		t.Fatalf("SystemClock = %v, an hour ahead: the stale base was kept", time.Unix(0, got))
	}
	if clockBase.Load() == stale {
		t.Fatal("the stale base was not replaced")
	}
	// A fresh base with the hour's step is used as is, until it is stale.
	clockBase.Store(&wallBase{mono: time.Now(), wall: time.Now().Add(time.Hour).UnixNano()})
	if got := SystemClock(); got < time.Now().Add(59*time.Minute).UnixNano() {
		t.Fatalf("SystemClock = %v, want the fresh base's hour ahead", time.Unix(0, got))
	}
}

func BenchmarkSystemClock(b *testing.B) {
	var sink int64
	for b.Loop() {
		sink += SystemClock()
	}
	_ = sink
}

func BenchmarkTimeNow(b *testing.B) {
	var sink int64
	for b.Loop() {
		sink += time.Now().UnixNano()
	}
	_ = sink
}
