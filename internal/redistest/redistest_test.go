package redistest

import (
	"context"
	"net"
	"testing"
	"time"
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

// TestRestartWaitsForItsPort restarts a server whose port another process
// holds for a moment: the restart waits for it instead of failing.
func TestRestartWaitsForItsPort(t *testing.T) {
	s := Start(t)
	s.Kill()
	l, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { l.Close() })
	s.Restart()
	if err := s.Client("").Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the restarted server does not answer: %v", err)
	}
}

func TestClusterPromote(t *testing.T) {
	c := StartClusterWithReplicas(t, 3, 1)
	if len(c.Servers) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Servers))
	}
	masters := c.Masters(t)
	if len(masters) != 3 {
		t.Fatalf("%d masters, want 3", len(masters))
	}
	master := masters[0]
	replica := c.ReplicaOf(t, master)
	master.Kill()
	c.Promote(t, replica)
	role, err := replica.Client("").Do(context.Background(), "role").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Fatalf("the promoted replica's role: %v, %v", role, err)
	}
}
