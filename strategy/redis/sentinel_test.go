package redis

import (
	"context"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// TestSentinel finds the primary through a real Redis Sentinel.
func TestSentinel(t *testing.T) {
	primary := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, primary, "mymaster")
	r := &Redis{Addresses: []string{sentinel.Addr}, MasterName: "mymaster"}
	if err := r.Open(); err != nil {
		t.Fatal(err)
	}
	defer r.Cleanup()
	ctx := context.Background()
	start := time.Now().Truncate(time.Minute).UnixNano()
	for range 3 {
		if _, _, err := hitOne(ctx, r, "ns", "k", time.Minute, start, 1); err != nil {
			t.Fatalf("hit through the sentinel: %v", err)
		}
	}
	// The counter is on the primary, read without the sentinel.
	direct := &Redis{Addresses: []string{primary.Addr}}
	if err := direct.Open(); err != nil {
		t.Fatal(err)
	}
	defer direct.Cleanup()
	got, err := direct.GetWindow(ctx, "ns", "k", time.Minute, start)
	if err != nil || got != 3 {
		t.Fatalf("primary holds %v, %v; want 3", got, err)
	}
}
