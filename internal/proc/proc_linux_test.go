package proc

import (
	"context"
	"net"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// listenReusePort binds addr with SO_REUSEPORT, as Caddy binds its
// listeners.
func listenReusePort(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

// TestListenLoopbackIsExclusive shows why Caddy gets sockets bound here
// rather than a port from FreePort: two SO_REUSEPORT binds of one port
// both succeed (two Caddy processes share it silently), while a port
// ListenLoopback holds cannot be bound again, even with SO_REUSEPORT.
func TestListenLoopbackIsExclusive(t *testing.T) {
	a, err := listenReusePort("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := listenReusePort(a.Addr().String())
	if err != nil {
		t.Fatalf("second SO_REUSEPORT bind of %s: %v; the kernel no longer shares ports this way", a.Addr(), err)
	}
	b.Close()

	l, port, err := ListenLoopback()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if c, err := listenReusePort(net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
		c.Close()
		t.Fatalf("port %d of ListenLoopback bound again with SO_REUSEPORT", port)
	}
}
