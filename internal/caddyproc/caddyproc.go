// Package caddyproc builds Caddy with the plugin and runs it as separate
// processes on loopback, for tests and harnesses that need real nodes: a
// fleet sharing a store, or a node killed outright.
package caddyproc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/proc"
)

// ModuleRoot returns the directory of the go.mod of the module that dir
// is in, from `go env GOMOD` run in dir.
func ModuleRoot(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOMOD")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("no go.mod above %s", dir)
	}
	return filepath.Dir(gomod), nil
}

// BinaryPath is where Build puts the binary of the module in root: a
// directory of the user's cache per checkout, so that go build finds its
// previous output up to date and does not link again.
func BinaryPath(root string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(cache, "caddy-ratelimit-accuracy", hex.EncodeToString(sum[:6]), "caddy"), nil
}

// Build builds Caddy with the plugin (./cmd/caddy of the module in root)
// into out. It leaves -race out of GOFLAGS: nodes are often measured, and
// the race detector would slow them down several times.
func Build(ctx context.Context, root, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/caddy")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOFLAGS="+withoutRace(os.Getenv("GOFLAGS")))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/caddy: %w\n%s", err, b)
	}
	return nil
}

// BuildHere builds the binary of the module that dir is in, at its
// BinaryPath, and returns that path.
func BuildHere(ctx context.Context, dir string) (string, error) {
	root, err := ModuleRoot(ctx, dir)
	if err != nil {
		return "", err
	}
	bin, err := BinaryPath(root)
	if err != nil {
		return "", err
	}
	return bin, Build(ctx, root, bin)
}

var testBuild struct {
	once sync.Once
	bin  string
	err  error
}

// TestBinary returns the Caddy binary a test runs: the file that the
// environment variable env names, when it is set, or else Caddy with the
// plugin of the module the test runs in, built once per test binary at
// its BinaryPath (go build finds it up to date when nothing changed).
func TestBinary(t testing.TB, env string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		return bin
	}
	testBuild.once.Do(func() {
		start := time.Now()
		testBuild.bin, testBuild.err = BuildHere(context.Background(), ".")
		t.Logf("go build ./cmd/caddy: %v", time.Since(start).Round(time.Millisecond))
	})
	if testBuild.err != nil {
		t.Fatal(testBuild.err)
	}
	return testBuild.bin
}

// Env returns the value of the environment variable name, or def when it
// is unset or empty: the settings of a harness run.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// EnvParsed returns the environment variable name parsed by parse, or
// def when it is unset, and fails t, naming the variable, when it does
// not parse: the harnesses' settings (durations, counts, rates).
func EnvParsed[T any](t testing.TB, name string, def T, parse func(string) (T, error)) T {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	x, err := parse(v)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return x
}

// withoutRace drops -race from a GOFLAGS value.
func withoutRace(flags string) string {
	var kept []string
	for _, f := range strings.Fields(flags) {
		if f != "-race" && f != "-race=true" && f != "--race" {
			kept = append(kept, f)
		}
	}
	return strings.Join(kept, " ")
}

// Node is one Caddy process: its Log, Running and Kill are the process's.
type Node struct {
	// Port is the port of its first socket, which serves the ready path.
	Port int
	// Ports are the ports of all its sockets, in the order of Listen.
	Ports []int
	*proc.Proc
}

// ErrUnknownField reports a config that the Caddy binary refuses because
// it does not know one of its fields, such as an option newer than the
// binary.
var ErrUnknownField = errors.New("unknown config field")

// Listen returns the listen address, in a Caddy config, of the i-th
// socket (from 0) that Start binds for a node: "fd/3", "fd/4", …
func Listen(i int) string { return "fd/" + strconv.Itoa(3+i) }

// Start starts one Caddy process of the binary bin, in dir, and waits
// until it answers readyPath with 200 on its first socket. The node's
// sockets, as many as sockets (at least one), are bound here on free
// loopback ports and handed to Caddy open; config gets their ports, and
// the config it returns must listen on Listen(i) for the i-th. So no
// other process can take a port between its choice and Caddy's bind:
// Caddy binds with SO_REUSEPORT, and another Caddy (another node's admin
// endpoint, a test's) that picked the same free port would share it
// silently, the kernel splitting the connections between them. The
// kernel kills the process if the caller dies first.
func Start(ctx context.Context, bin, dir, name, readyPath string, sockets int, config func(ports []int) ([]byte, error)) (*Node, error) {
	files := make([]*os.File, 0, sockets)
	defer func() {
		// Caddy holds its own copies: once it exits, the ports are closed.
		for _, f := range files {
			f.Close()
		}
	}()
	ports := make([]int, 0, sockets)
	for range max(sockets, 1) {
		l, port, err := proc.ListenLoopback()
		if err != nil {
			return nil, err
		}
		f, err := l.File()
		l.Close()
		if err != nil {
			return nil, err
		}
		files, ports = append(files, f), append(ports, port)
	}
	cfg, err := config(ports)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, name+".json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, err
	}
	// Caddy's data and config directories: the node's own.
	env := []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}
	p, err := proc.StartWithFiles(filepath.Join(dir, name+".log"), env, files, bin, "run", "--config", cfgPath)
	if err != nil {
		return nil, err
	}
	n := &Node{Port: ports[0], Ports: ports, Proc: p}
	if err = n.waitReady(ctx, readyPath); err == nil {
		return n, nil
	}
	n.Stop()
	log := n.Log(20)
	if strings.Contains(log, "unknown field") {
		return nil, fmt.Errorf("%w: Caddy refused its config:\n%s", ErrUnknownField, log)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("Caddy on port %d: %v; its log:\n%s", n.Port, err, log)
}

// StartAll starts n nodes at once, named node1 to noden, each with the
// sockets Start binds for it, or none: on an error, those started are
// stopped.
func StartAll(ctx context.Context, bin, dir string, n int, readyPath string, sockets int, config func(ports []int) ([]byte, error)) ([]*Node, error) {
	nodes := make([]*Node, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			nodes[i], errs[i] = Start(ctx, bin, dir, fmt.Sprintf("node%d", i+1), readyPath, sockets, config)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		StopAll(nodes)
		return nil, err
	}
	return nodes, nil
}

// StopAll stops the nodes at once and waits for all of them.
func StopAll(nodes []*Node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n != nil {
			wg.Go(n.Stop)
		}
	}
	wg.Wait()
}

// URL returns the address of path on the node.
func (n *Node) URL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(n.Port) + path
}

// Stop asks Caddy to stop gracefully (it pushes its pending diffs and
// gives back what it holds), and kills it if it has not exited within
// 15 s.
func (n *Node) Stop() { n.Proc.Stop(syscall.SIGINT, 15*time.Second) }

// waitReady polls path until it answers 200 or the node exits.
func (n *Node) waitReady(ctx context.Context, path string) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last error
	err := n.WaitUntil(ctx, 30*time.Second, 20*time.Millisecond, func() bool {
		resp, err := client.Get(n.URL(path))
		if err != nil {
			last = err
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("%s answered %d", path, resp.StatusCode)
			return false
		}
		return true
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w: %v", err, last)
	}
	return err
}
