package syncapp

import (
	"strings"
	"testing"
)

func TestBoundKey(t *testing.T) {
	short := strings.Repeat("a", MaxKeyLen)
	if got := BoundKey(short); got != short {
		t.Fatal("a key of MaxKeyLen bytes was changed")
	}
	long1 := strings.Repeat("a", 10000) + "1"
	long2 := strings.Repeat("a", 10000) + "2"
	b1, b2 := BoundKey(long1), BoundKey(long2)
	if b1 == b2 {
		t.Fatal("two long keys with a common prefix share a bounded key")
	}
	if len(b1) <= MaxKeyLen || len(b1) > MaxKeyLen+32 {
		t.Fatalf("bounded key of %d bytes, want just over %d", len(b1), MaxKeyLen)
	}
	if BoundKey(long1) != b1 {
		t.Fatal("bounding is not stable")
	}
}
