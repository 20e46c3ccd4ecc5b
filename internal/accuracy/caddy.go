package accuracy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Routes of every node. Each answers with the server's clock in
// TimeHeader, so that an admitted request is counted in the window the
// node counted it in, not in the one the client saw it in.
const (
	BarePath   = "/bare" // no limiter: the latency baseline
	OnePath    = "/one"  // the patterns of one key
	ManyPath   = "/many" // the many keys pattern, with its own limit
	KeyHeader  = "X-Key"
	TimeHeader = "X-Server-Time-Ms"
)

// Window is the limit's window. Fixed windows of one second: each window
// is an independent trial, which one node alone admits exactly the limit
// of.
const Window = time.Second

// ModuleRoot returns the directory of the go.mod of the module the
// harness is part of, from `go env GOMOD` run in dir.
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

// CaddyPath is where BuildCaddy puts the binary of the module in root: a
// directory of the user's cache per checkout, so that go build finds its
// previous output up to date and does not link again.
func CaddyPath(root string) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256([]byte(root))
	return filepath.Join(cache, "caddy-ratelimit-accuracy", hex.EncodeToString(sum[:6]), "caddy"), nil
}

// BuildCaddy builds Caddy with the plugin (./cmd/caddy of the module in
// root) into out. It leaves -race out of GOFLAGS: the nodes are measured,
// and the race detector would slow them down several times.
func BuildCaddy(ctx context.Context, root, out string) error {
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

// NodeConfig is what one node's JSON config is made of.
type NodeConfig struct {
	Port      int
	SyncRate  time.Duration // 0: synchronous
	SyncAbove float64       // 0: left out
	Strategy  json.RawMessage
	Limit     float64 // of OnePath
	ManyLimit float64 // of ManyPath, per key
}

// JSON returns the node's Caddy config: admin off, nothing persisted, one
// namespace "api" on the store, and the three routes.
func (c NodeConfig) JSON() ([]byte, error) {
	ns := map[string]any{"sync_rate": c.SyncRate.String(), "strategy": c.Strategy}
	if c.SyncRate == 0 {
		ns["sync_rate"] = "0"
	}
	if c.SyncAbove > 0 {
		ns["sync_above"] = c.SyncAbove
	}
	ok := map[string]any{
		"handler": "static_response",
		"body":    "ok",
		"headers": map[string][]string{TimeHeader: {"{time.now.unix_ms}"}},
	}
	limited := func(path string, limit float64) map[string]any {
		return map[string]any{
			"match": []any{map[string]any{"path": []string{path}}},
			"handle": []any{
				map[string]any{
					"handler":     "rate_limit",
					"namespace":   "api",
					"key":         "{http.request.header." + KeyHeader + "}",
					"limits":      []any{map[string]any{"limit": limit, "window": Window.String()}},
					"window_type": "fixed",
				},
				ok,
			},
		}
	}
	cfg := map[string]any{
		"admin":   map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{"level": "WARN"}}},
		"apps": map[string]any{
			"rate_limit": map[string]any{"namespaces": map[string]any{"api": ns}},
			"http": map[string]any{
				"grace_period": "2s",
				"servers": map[string]any{"accuracy": map[string]any{
					"listen":          []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port))},
					"automatic_https": map[string]any{"disable": true},
					"routes": []any{
						map[string]any{
							"match":  []any{map[string]any{"path": []string{BarePath}}},
							"handle": []any{ok},
						},
						limited(OnePath, c.Limit),
						limited(ManyPath, c.ManyLimit),
					},
				}},
			},
		},
	}
	return json.MarshalIndent(cfg, "", "\t")
}

// node is one Caddy process of a row.
type node struct {
	port   int
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// URL returns the address of path on the node.
func (n *node) URL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(n.port) + path
}

func (n *node) running() bool {
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// stop asks Caddy to stop gracefully (it pushes its pending diffs), and
// kills it if it has not exited within 15 s.
func (n *node) stop() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-n.exited:
	case <-time.After(15 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
}

// errUnknownField reports a config that the Caddy binary refuses because
// it does not know one of its fields, such as sync_above before the
// plugin had it.
var errUnknownField = errors.New("unknown config field")

// startNode starts one Caddy process with the config made for a free
// port, and waits until it serves BarePath. A port taken meanwhile by
// another process is tried again with another.
func startNode(ctx context.Context, bin, dir, name string, config func(port int) ([]byte, error)) (*node, error) {
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		cfg, err := config(port)
		if err != nil {
			return nil, err
		}
		cfgPath := filepath.Join(dir, name+".json")
		if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
			return nil, err
		}
		n := &node{port: port, log: filepath.Join(dir, name+".log"), exited: make(chan struct{})}
		f, err := os.Create(n.log)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "run", "--config", cfgPath)
		cmd.Stdout, cmd.Stderr = f, f
		// Caddy's data and config directories: the run's own.
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
		setDeathSignal(cmd)
		err = cmd.Start()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("starting Caddy: %w", err)
		}
		n.cmd = cmd
		go func() {
			_ = cmd.Wait()
			close(n.exited)
		}()
		if err = n.waitReady(ctx); err == nil {
			return n, nil
		}
		n.stop()
		log := tail(n.log, 20)
		if strings.Contains(log, "unknown field") {
			return nil, fmt.Errorf("%w: Caddy refused its config:\n%s", errUnknownField, log)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		lastErr = fmt.Errorf("Caddy on port %d: %v; its log:\n%s", port, err, log)
	}
	return nil, lastErr
}

// waitReady polls BarePath until it answers 200 or the node exits.
func (n *node) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(n.URL(BarePath))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !n.running() {
			return errors.New("exited at start")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after 30s: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// startNodes starts n nodes at once, or none: on an error, those started
// are stopped.
func startNodes(ctx context.Context, bin, dir string, n int, config func(port int) ([]byte, error)) ([]*node, error) {
	nodes := make([]*node, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			nodes[i], errs[i] = startNode(ctx, bin, dir, fmt.Sprintf("node%d", i+1), config)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		stopNodes(nodes)
		return nil, err
	}
	return nodes, nil
}

// stopNodes stops the nodes at once and waits for all of them.
func stopNodes(nodes []*node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n != nil {
			wg.Go(n.stop)
		}
	}
	wg.Wait()
}

// freePort returns a loopback port that was free a moment ago; a node
// that cannot bind it is started again on another.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last lines of a file.
func tail(path string, lines int) string {
	data, _ := os.ReadFile(path)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// ProbeConfig reports whether the Caddy binary accepts a config: it runs
// `caddy validate`, which provisions the config without starting it, so
// it connects to no store. A refusal because of an unknown field, such as
// sync_above before the plugin had it, is reported as false without an
// error.
func ProbeConfig(ctx context.Context, bin, dir string, cfg []byte) (bool, error) {
	path := filepath.Join(dir, "probe.json")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return false, err
	}
	cmd := exec.CommandContext(ctx, bin, "validate", "--config", path)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	out, err := cmd.CombinedOutput()
	if err == nil {
		return true, nil
	}
	if bytes.Contains(out, []byte("unknown field")) {
		return false, nil
	}
	return false, fmt.Errorf("caddy validate: %w\n%s", err, out)
}
