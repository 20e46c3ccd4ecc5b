package pgtest

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
)

func TestServerLifecycle(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	if s.Port == 5432 {
		t.Fatal("the test server took the machine's PostgreSQL port")
	}
	dsn := s.CreateDB(t, "app")
	if dsn != s.DSN("app") {
		t.Fatalf("CreateDB returned %q, DSN says %q", dsn, s.DSN("app"))
	}
	c := s.Conn(t, "app")
	if _, err := c.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	if n := s.Connections(t, "app"); n != 1 {
		t.Fatalf("Connections(app) = %d, want 1", n)
	}
	if n := s.Connections(t, "postgres"); n != 0 {
		t.Fatalf("Connections(postgres) = %d, want 0: the asking connection counts", n)
	}

	read := func() int {
		t.Helper()
		c := s.Conn(t, "app")
		defer c.Close(ctx)
		var v int
		if err := c.QueryRow(ctx, "SELECT v FROM t").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	s.Stop()
	if err := c.Ping(ctx); err == nil {
		t.Fatal("a stopped server answered")
	}
	s.Start()
	if v := read(); v != 42 {
		t.Fatalf("after Stop and Start: v = %d, want 42", v)
	}

	held := s.Conn(t, "app")
	s.Kill()
	// The backend of a held connection dies with the server, as in a crash.
	if err := held.Ping(ctx); err == nil {
		t.Fatal("a connection to a killed server answered")
	}
	if _, err := pgx.Connect(ctx, s.DSN("app")); err == nil {
		t.Fatal("a killed server accepted a connection")
	}
	s.Start()
	if v := read(); v != 42 {
		t.Fatalf("after Kill and Start: v = %d, want 42", v)
	}
	poll.Until(t, 5*time.Second, "the closed connections to leave", func() bool {
		return s.Connections(t, "app") == 0
	})
}

// TestStartWaitsForItsPort restarts a server whose port another process
// holds for a moment: the start waits for it instead of failing, and does
// not mistake the other listener for the server.
func TestStartWaitsForItsPort(t *testing.T) {
	s := Start(t)
	s.Kill()
	l, err := net.Listen("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(300*time.Millisecond, func() { l.Close() })
	s.Start()
	if n := s.Connections(t, "postgres"); n != 0 {
		t.Fatalf("Connections = %d", n)
	}
}

func TestCleanupRemovesTheDirectory(t *testing.T) {
	var dir string
	t.Run("server", func(t *testing.T) {
		dir = Start(t).Dir
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after the test: %v", dir, err)
	}
}
