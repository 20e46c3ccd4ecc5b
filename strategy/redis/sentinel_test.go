package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// TestSentinel finds the primary through a real Redis Sentinel.
func TestSentinel(t *testing.T) {
	primary := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, primary, "mymaster", 5*time.Second)
	r, err := (&Redis{Addresses: []string{sentinel.Addr}, MasterName: "mymaster"}).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	start := window.Start(steadyNow().UnixNano(), time.Minute)
	for range 3 {
		if _, _, err := hitOne(ctx, r, "ns", "k", time.Minute, start, 1); err != nil {
			t.Fatalf("hit through the sentinel: %v", err)
		}
	}
	// The counter is on the primary, read without the sentinel.
	direct, err := (&Redis{Addresses: []string{primary.Addr}}).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	got, err := direct.GetWindow(ctx, "ns", "k", time.Minute, start)
	if err != nil || got != 3 {
		t.Fatalf("primary holds %v, %v; want 3", got, err)
	}
}

// TestSentinelFailover kills the primary under a Sentinel with a replica:
// the strategy follows the Sentinel to the promoted replica, where its
// scripts are not cached yet. A batch retried under its ID until the
// failover is done counts once.
func TestSentinelFailover(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	rc := replica.Client("")
	poll.Until(t, 20*time.Second, "the replica to sync", func() bool {
		info, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	sentinel := redistest.StartSentinel(t, primary, "mymaster", time.Second)
	sc := goredis.NewSentinelClient(&goredis.Options{Addr: sentinel.Addr})
	defer sc.Close()
	poll.Until(t, 20*time.Second, "the sentinel to find the replica", func() bool {
		replicas, err := sc.Replicas(context.Background(), "mymaster").Result()
		return err == nil && len(replicas) == 1
	})

	r := open(t, &Redis{Addresses: []string{sentinel.Addr}, MasterName: "mymaster"})
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	for range 3 {
		if _, _, err := hitOne(ctx, r, "ns", "k", size, start, 1); err != nil {
			t.Fatalf("hit through the sentinel: %v", err)
		}
	}
	// The 3 hits reach the replica before the primary dies.
	if n, err := primary.Client("").Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d, %v", n, err)
	}
	primary.Kill()

	batch := strategy.Batch{ID: newID(), Namespace: "ns", Diffs: []window.Diff{{Key: "k", Size: size, Start: start, Value: 1}}}
	failures := 0
	poll.Until(t, 60*time.Second, "a push to succeed after the failover", func() bool {
		pushCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := r.PushDiffs(pushCtx, batch); err != nil {
			failures++
			return false
		}
		return true
	})
	t.Logf("the push failed %d times during the failover", failures)
	if cur, _, err := hitOne(ctx, r, "ns", "k", size, start, 1); err != nil || cur != 5 {
		t.Fatalf("hit on the new primary: %v, %v; want 5 (3 + the batch once + this hit)", cur, err)
	}
	info, err := rc.Info(ctx, "replication").Result()
	if err != nil || !strings.Contains(info, "role:master") {
		t.Fatalf("the replica was not promoted: %v\n%s", err, info)
	}
	direct := open(t, &Redis{Addresses: []string{replica.Addr}})
	if got, err := direct.GetWindow(ctx, "ns", "k", size, start); err != nil || got != 5 {
		t.Fatalf("the promoted replica holds %v, %v; want 5", got, err)
	}
}
