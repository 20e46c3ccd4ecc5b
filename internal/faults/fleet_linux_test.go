package faults

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
)

// TestStartNodeOwnsItsPorts starts one node and checks that no other
// process can share its ports while it runs: Caddy binds with
// SO_REUSEPORT, so a port it bound itself could be bound again by another
// Caddy (in a full run, another node's admin endpoint took node1's HTTP
// port, and the warm-up's /count got its 404). It checks too that the node
// serves its routes and its admin endpoint on the sockets it was handed,
// across a forced reload, and that its ports close when it stops.
func TestStartNodeOwnsItsPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts Caddy: not under -short")
	}
	bin := caddyproc.TestBinary(t, "FAULTS_CADDY")
	up, err := StartUpstream(0)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	n, err := StartNode(t.Context(), bin, t.TempDir(), "node1", func() ([]byte, error) {
		return NodeConfig{
			Listen: "fd/3", AdminListen: "fd/4", SyncRate: PeriodicRate, Strategy: json.RawMessage(`{"module":"memory"}`),
			Limit: LimitPerSecond, BanLimit: BanLimit, Ban: BanFor, MaxConcurrent: MaxConcurrent, Upstream: up.Addr,
		}.JSON()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()

	for _, port := range []int{n.Port, n.Admin} {
		l, err := listenReusePort(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			l.Close()
			t.Errorf("port %d of the node bound again with SO_REUSEPORT", port)
		} else if !errors.Is(err, syscall.EADDRINUSE) {
			t.Errorf("binding port %d again: %v, want EADDRINUSE", port, err)
		}
	}
	load := NewLoad("owns-", Rates{}, []*Node{n})
	routes := func(when string) {
		for _, path := range []string{CountPath, LimitPath, ConcPath, BanPath} {
			if st := load.Burst(t.Context(), 0, path, "k", 1); st[0] != http.StatusOK {
				t.Errorf("%s: %s answered %d", when, path, st[0])
			}
		}
		if _, err := n.PendingDiffs(t.Context()); err != nil {
			t.Errorf("%s: admin endpoint: %v", when, err)
		}
	}
	routes("at start")
	if _, err := n.Reload(t.Context()); err != nil {
		t.Fatalf("forced reload: %v", err)
	}
	routes("after a forced reload")

	n.Stop()
	for _, port := range []int{n.Port, n.Admin} {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
			t.Errorf("port %d still accepts connections after the node stopped", port)
		}
	}
}

// listenReusePort binds addr with SO_REUSEPORT, as Caddy binds its
// listeners.
func listenReusePort(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}
