package ratelimit

import (
	"strings"
	"testing"
	"time"
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
