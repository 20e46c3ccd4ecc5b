package ratelimit

import (
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

func TestBoundKey(t *testing.T) {
	short := strings.Repeat("a", maxKeyLen)
	if got := boundKey(short); got != short {
		t.Fatal("a key of maxKeyLen bytes was changed")
	}
	long1 := strings.Repeat("a", 10000) + "1"
	long2 := strings.Repeat("a", 10000) + "2"
	b1, b2 := boundKey(long1), boundKey(long2)
	if b1 == b2 {
		t.Fatal("two long keys with a common prefix share a bounded key")
	}
	if len(b1) <= maxKeyLen || len(b1) > maxKeyLen+32 {
		t.Fatalf("bounded key of %d bytes, want just over %d", len(b1), maxKeyLen)
	}
	if boundKey(long1) != b1 {
		t.Fatal("bounding is not stable")
	}
}

func TestUntilAdmitted(t *testing.T) {
	const size = 60.0
	for i, tc := range []struct {
		cur, prev, target, pos float64
		fixed                  bool
		want                   float64
	}{
		// Sliding: 2 + 10*(60-t)/60 <= 4 at t = 48; now at 30, so 18s.
		{cur: 2, prev: 10, target: 4, pos: 30, want: 18},
		// Already low enough.
		{cur: 1, prev: 2, target: 4, pos: 30, want: 0},
		// The current count alone is too high: wait for the next window,
		// where 8*(60-t)/60 <= 4 at t = 30: 30s left + 30s.
		{cur: 8, prev: 0, target: 4, pos: 30, want: 60},
		// Fixed: only the current window counts, so its end.
		{cur: 8, prev: 0, target: 4, pos: 30, fixed: true, want: 30},
		{cur: 3, prev: 50, target: 4, pos: 30, fixed: true, want: 0},
		// A limit below one hit: both windows must pass.
		{cur: 0, prev: 0, target: -0.5, pos: 10, want: 110},
	} {
		s := window.Sample{Current: tc.cur, Previous: tc.prev}
		if got := untilAdmitted(s, tc.target, size, tc.pos, tc.fixed); got != tc.want {
			t.Errorf("Test %d: %v, want %v", i, got, tc.want)
		}
	}
}

func TestWindowNames(t *testing.T) {
	for size, want := range map[time.Duration]string{
		time.Second:            "Second",
		time.Minute:            "Minute",
		time.Hour:              "Hour",
		24 * time.Hour:         "Day",
		30 * 24 * time.Hour:    "Month",
		365 * 24 * time.Hour:   "Year",
		90 * time.Second:       "90",
		500 * time.Millisecond: "0.5",
	} {
		if got := windowName(size); got != want {
			t.Errorf("windowName(%v) = %q, want %q", size, got, want)
		}
	}
}

func TestSFString(t *testing.T) {
	if got := sfString("api-\"x\\y\n-é"); got != `"api-\"x\\y_-__"` {
		t.Fatalf("sfString = %s", got)
	}
}
