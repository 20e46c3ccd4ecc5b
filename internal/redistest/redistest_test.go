package redistest

import (
	"context"
	"testing"
)

func TestServerLifecycle(t *testing.T) {
	ctx := context.Background()
	s := Start(t, "--requirepass", "pw")
	c := s.Client("pw")
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("a killed server answered")
	}
	s.Restart()
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("restarted server: exists = %d, %v; want an empty server", n, err)
	}
}

func TestCluster(t *testing.T) {
	c := StartCluster(t, 3)
	if len(c.Addrs) != 3 {
		t.Fatalf("%d nodes", len(c.Addrs))
	}
}
