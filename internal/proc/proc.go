// Package proc runs the server processes that tests and harnesses own
// (Caddy, redis-server): started with their output in a log file, killed
// by the kernel when the caller dies first, and stopped with a signal and
// a grace period.
package proc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Proc is a running server process.
type Proc struct {
	// LogPath is the file of its standard output and error.
	LogPath string

	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts name with args, its output in a new file at logPath and env
// added to this process's environment.
func Start(logPath string, env []string, name string, args ...string) (*Proc, error) {
	return StartWithFiles(logPath, env, nil, name, args...)
}

// StartWithFiles is Start with files open in the process as file
// descriptors 3, 4, … (exec.Cmd's ExtraFiles): listening sockets the
// caller bound, for instance. The caller still owns its copies of them.
func StartWithFiles(logPath string, env []string, files []*os.File, name string, args ...string) (*Proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.ExtraFiles = files
	SetDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{LogPath: logPath, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process's ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// Stop sends the process sig, and kills it if it has not exited within
// grace. It returns once the process is gone.
func (p *Proc) Stop(sig os.Signal, grace time.Duration) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill kills the process outright, as a crash or the OOM killer would:
// it runs no cleanup. It returns once the process is gone.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// Log returns the last lines of the process's output.
func (p *Proc) Log(lines int) string {
	data, _ := os.ReadFile(p.LogPath)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// WaitUntil polls ready every interval until it is true, and fails when
// the process exits first, limit passes, or ctx ends.
func (p *Proc) WaitUntil(ctx context.Context, limit, interval time.Duration, ready func() bool) error {
	deadline := time.Now().Add(limit)
	for !ready() {
		if !p.Running() {
			return errors.New("exited at start")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}

// FreePort returns a loopback port that was free a moment ago. Another
// process may take it before the server binds it, so callers start the
// server again on another when it cannot. Caddy cannot tell: it binds
// with SO_REUSEPORT, so a second Caddy on the port shares it silently (the
// kernel splits the connections between them); give Caddy sockets bound
// here instead (ListenLoopback, StartWithFiles).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ListenLoopback binds a TCP socket on a free loopback port and returns
// it with its port. It is bound without SO_REUSEPORT, so that no other
// process can bind the port while it is open, even with SO_REUSEPORT.
func ListenLoopback() (*net.TCPListener, int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, err
	}
	tl := l.(*net.TCPListener)
	return tl, tl.Addr().(*net.TCPAddr).Port, nil
}
