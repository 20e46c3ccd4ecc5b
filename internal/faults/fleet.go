package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
)

// Routes of every node, and the header that carries the client key.
const (
	BarePath    = "/bare"  // no limiter: readiness
	CountPath   = "/count" // a limit no traffic reaches: every hit is admitted and must reach the store
	LimitPath   = "/limit" // a limit per second the traffic goes over: admitted / limit
	BanPath     = "/ban"   // a limit per minute with ban
	ConcPath    = "/conc"  // max_concurrent, in front of the harness's upstream
	RatePath    = "/rate"  // a rate (GCRA), at sync_rate 0 only: see rates.go
	KeyHeader   = "X-Key"
	TimeHeader  = "X-Server-Time-Ms"
	Namespace   = "api"
	CountWindow = time.Hour
)

// NodeConfig is what one node's JSON config is made of.
type NodeConfig struct {
	// Listen and AdminListen are the listen addresses of the HTTP server
	// and of the admin endpoint: caddyproc.Listen(0) and (1) for a node
	// StartNode starts.
	Listen, AdminListen string
	SyncRate            time.Duration // 0: synchronous
	Strategy            json.RawMessage
	Limit               float64 // of LimitPath, per second
	BanLimit            float64 // of BanPath, per minute
	Ban                 time.Duration
	MaxConcurrent       int
	Upstream            string // host:port of ConcPath's backend
	OnStoreFailure      string // the namespace's on_store_failure; "": the default
}

// JSON returns the node's Caddy config: an admin endpoint on its own
// port (for /metrics, /debug/pprof, /load and the plugin's routes),
// nothing persisted, logs at INFO in JSON, one namespace on the store.
// RatePath is served at sync_rate 0 only: a periodic namespace refuses a
// rate at load.
func (c NodeConfig) JSON() ([]byte, error) {
	ns := map[string]any{"sync_rate": c.SyncRate.String(), "strategy": c.Strategy}
	if c.SyncRate == 0 {
		ns["sync_rate"] = "0"
	}
	if c.OnStoreFailure != "" {
		ns["on_store_failure"] = c.OnStoreFailure
	}
	ok := map[string]any{
		"handler": "static_response",
		"body":    "ok",
		"headers": map[string][]string{TimeHeader: {"{time.now.unix_ms}"}},
	}
	route := func(path string, rl map[string]any, next map[string]any) map[string]any {
		rl["handler"] = "rate_limit"
		rl["namespace"] = Namespace
		rl["key"] = "{http.request.header." + KeyHeader + "}"
		rl["window_type"] = "fixed"
		rl["disable_penalty"] = true
		return map[string]any{
			"match":  []any{map[string]any{"path": []string{path}}},
			"handle": []any{rl, next},
		}
	}
	limits := func(n float64, w time.Duration) []any {
		return []any{map[string]any{"limit": n, "window": w.String()}}
	}
	proxy := map[string]any{
		"handler":   "reverse_proxy",
		"upstreams": []any{map[string]any{"dial": c.Upstream}},
	}
	routes := []any{
		map[string]any{
			"match":  []any{map[string]any{"path": []string{BarePath}}},
			"handle": []any{ok},
		},
		route(CountPath, map[string]any{"limits": limits(1e9, CountWindow)}, ok),
		route(LimitPath, map[string]any{"limits": limits(c.Limit, time.Second)}, ok),
		route(BanPath, map[string]any{"limits": limits(c.BanLimit, time.Minute), "ban": c.Ban.String()}, ok),
		route(ConcPath, map[string]any{"limits": limits(1e9, CountWindow), "max_concurrent": c.MaxConcurrent}, proxy),
	}
	if c.SyncRate == 0 {
		rate := map[string]any{"rate": 1, "window": RateWindow.String(), "burst": RateBurst}
		routes = append(routes, route(RatePath, map[string]any{"rate": rate}, ok))
	}
	cfg := map[string]any{
		"admin": map[string]any{
			"listen": c.AdminListen,
			"config": map[string]any{"persist": false},
		},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"level": "INFO", "encoder": map[string]any{"format": "json"},
		}}},
		"apps": map[string]any{
			"rate_limit": map[string]any{"namespaces": map[string]any{Namespace: ns}},
			"http": map[string]any{
				"grace_period": "2s",
				"servers": map[string]any{"faults": map[string]any{
					"listen":          []string{c.Listen},
					"automatic_https": map[string]any{"disable": true},
					"routes":          routes,
				}},
			},
		},
	}
	return json.MarshalIndent(cfg, "", "\t")
}

// Node is one Caddy process of a fleet, with its admin endpoint.
type Node struct {
	*caddyproc.Node
	// Name is node1, node2, …
	Name string
	// Admin is the admin endpoint's port.
	Admin int
	// Config is the JSON it was started with, which reloads post again.
	Config []byte
}

// StartNode starts a node named name in dir, with the config cfg makes;
// the config must listen on caddyproc.Listen(0) for HTTP and on
// caddyproc.Listen(1) for the admin endpoint (see NodeConfig). Both
// sockets are bound by caddyproc and handed to the node, so the ports are
// the node's alone: with ports it bound itself, Caddy would share them,
// by SO_REUSEPORT, with another Caddy that picked the same free port,
// such as another node's admin endpoint, which answers the routes 404.
func StartNode(ctx context.Context, bin, dir, name string, cfg func() ([]byte, error)) (*Node, error) {
	n := &Node{Name: name}
	cn, err := caddyproc.Start(ctx, bin, dir, name, BarePath, 2, func(ports []int) ([]byte, error) {
		b, err := cfg()
		n.Admin, n.Config = ports[1], b
		return b, err
	})
	if err != nil {
		return nil, err
	}
	n.Node = cn
	// The node answers /bare on its port: its admin endpoint must answer too.
	err = cn.WaitUntil(ctx, 10*time.Second, 20*time.Millisecond, func() bool {
		_, err := n.adminGet(ctx, "/config/")
		return err == nil
	})
	if err != nil {
		cn.Stop()
		return nil, fmt.Errorf("%s: admin endpoint: %w", name, err)
	}
	return n, nil
}

// adminClient talks to the admin endpoints; its own connections, so that
// the load's do not delay it.
var adminClient = &http.Client{Timeout: 5 * time.Second}

// AdminURL returns the address of path on the node's admin endpoint.
func (n *Node) AdminURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(n.Admin) + path
}

func (n *Node) adminGet(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.AdminURL(path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, bytes.TrimSpace(body))
	}
	return body, nil
}

// SyncSample is what a node's metrics say of its namespace's syncs.
type SyncSample struct {
	At      time.Time
	Runs    float64 // caddy_rate_limit_sync_duration_seconds_count: runs, failed or not
	Errors  float64 // caddy_rate_limit_sync_errors_total: failed runs and hits
	Pending float64 // caddy_rate_limit_pending_diffs
	Dropped float64 // caddy_rate_limit_dropped_diffs_total of the zone default
	// Down is 1 when the node held the whole store down
	// (caddy_rate_limit_store_up 0), PartsDown how many parts of it
	// (caddy_rate_limit_store_parts_down).
	Down, PartsDown float64
	OK              bool // the metrics could be read
}

// Sync reads the node's sync metrics.
func (n *Node) Sync(ctx context.Context) SyncSample {
	s := SyncSample{At: time.Now()}
	body, err := n.adminGet(ctx, "/metrics")
	if err != nil {
		return s
	}
	s.OK = true
	label := `{namespace="` + Namespace + `"}`
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "caddy_rate_limit_sync_duration_seconds_count" + label:
			s.Runs = v
		case "caddy_rate_limit_sync_errors_total" + label:
			s.Errors = v
		case "caddy_rate_limit_pending_diffs" + label:
			s.Pending = v
		case `caddy_rate_limit_dropped_diffs_total{zone="default"}`:
			s.Dropped = v
		case "caddy_rate_limit_store_up" + label:
			s.Down = 1 - v
		case "caddy_rate_limit_store_parts_down" + label:
			s.PartsDown = v
		}
	}
	return s
}

// Goroutines returns the node's goroutine count, from
// /debug/pprof/goroutine?debug=1.
func (n *Node) Goroutines(ctx context.Context) (int, error) {
	body, err := n.adminGet(ctx, "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(body, []byte("\n"))
	var total int
	if _, err := fmt.Sscanf(string(line), "goroutine profile: total %d", &total); err != nil {
		return 0, fmt.Errorf("goroutine profile: %q: %w", line, err)
	}
	return total, nil
}

// PendingDiffs returns the diffs the namespace has not pushed yet, from
// the plugin's admin route.
func (n *Node) PendingDiffs(ctx context.Context) (int, error) {
	body, err := n.adminGet(ctx, "/rate_limit/namespaces")
	if err != nil {
		return 0, err
	}
	var list []struct {
		Name         string `json:"name"`
		PendingDiffs int    `json:"pending_diffs"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return 0, err
	}
	for _, ns := range list {
		if ns.Name == Namespace {
			return ns.PendingDiffs, nil
		}
	}
	return 0, fmt.Errorf("namespace %s not listed", Namespace)
}

// StoreCount returns what the store holds for key in the window of size
// size: the current and the previous window's counts, as the node reads
// them from the store (keys of a row are new, so both are the row's).
func (n *Node) StoreCount(ctx context.Context, key string, size time.Duration) (float64, error) {
	body, err := n.adminGet(ctx, "/rate_limit/namespaces/"+Namespace+"/keys?source=store&key="+url.QueryEscape(key))
	if err != nil {
		return 0, err
	}
	var info struct {
		Windows []struct {
			Size     string  `json:"size"`
			Current  float64 `json:"current"`
			Previous float64 `json:"previous"`
		} `json:"windows"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return 0, err
	}
	for _, w := range info.Windows {
		if d, err := time.ParseDuration(w.Size); err == nil && d == size {
			return w.Current + w.Previous, nil
		}
	}
	return 0, fmt.Errorf("key %s: no window of %v in %s", key, size, body)
}

// Banned reports whether the node holds key as banned.
func (n *Node) Banned(ctx context.Context, key string) (bool, error) {
	body, err := n.adminGet(ctx, "/rate_limit/namespaces/"+Namespace+"/bans?limit=100000")
	if err != nil {
		return false, err
	}
	var list struct {
		Bans []struct {
			Key string `json:"key"`
		} `json:"bans"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return false, err
	}
	for _, b := range list.Bans {
		if k, err := url.QueryUnescape(b.Key); err == nil && k == key || b.Key == key {
			return true, nil
		}
	}
	return false, nil
}

// reloadClient posts configs on a new connection each time: a reload
// may restart the admin endpoint, which drops its idle connections.
var reloadClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Reload posts the node's config again to its admin endpoint, forced
// (Cache-Control: must-revalidate), so that Caddy really reloads it. It
// returns how many times the admin endpoint dropped the connection
// before it answered (each time it tries again, up to 5 times).
func (n *Node) Reload(ctx context.Context) (dropped int, err error) {
	for {
		err = n.reloadOnce(ctx)
		var status *statusError
		if err == nil || errors.As(err, &status) || dropped == 5 || ctx.Err() != nil {
			return dropped, err
		}
		dropped++
		if err := Sleep(ctx, 100*time.Millisecond); err != nil {
			return dropped, err
		}
	}
}

// statusError is an answer of the admin endpoint other than 200.
type statusError struct{ msg string }

func (e *statusError) Error() string { return e.msg }

func (n *Node) reloadOnce(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.AdminURL("/load"), bytes.NewReader(n.Config))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Cache-Control", "must-revalidate")
	resp, err := reloadClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return &statusError{fmt.Sprintf("POST /load: %d %s", resp.StatusCode, bytes.TrimSpace(body))}
	}
	return nil
}

// LogSize returns the size of the node's log so far: lines after it are
// later ones.
func (n *Node) LogSize() int64 {
	fi, err := os.Stat(n.LogPath)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// LogLines sums up a node's log from offset on: JSON lines at WARN or
// above in [from, to], and lines that are not Caddy's JSON (a
// dependency writing to stderr), wherever they are.
type LogLines struct {
	Failures  int      // the plugin's lines (loggers rate_limit.*) at warn or above, in the span
	Other     int      // Caddy's other lines at warn or above, in the span
	Foreign   int      // not JSON: a dependency's own output
	Recovered int      // "store reachable again", in the span
	Loads     int      // "load complete": reloads Caddy finished, in the span
	Examples  []string // the first few failure and foreign lines
}

// ReadLog sums up the node's log after offset.
func (n *Node) ReadLog(offset int64, from, to time.Time) LogLines {
	return readLogFile(n.LogPath, offset, from, to)
}

// readLogFile sums up a log file after offset.
func readLogFile(path string, offset int64, from, to time.Time) LogLines {
	var l LogLines
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		return l
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return l
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	foreign, failures := 0, 0
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var e struct {
			Level  string  `json:"level"`
			TS     float64 `json:"ts"`
			Logger string  `json:"logger"`
			Msg    string  `json:"msg"`
		}
		if json.Unmarshal(line, &e) != nil || e.Level == "" {
			l.Foreign++
			if foreign < 2 {
				foreign++
				l.Examples = append(l.Examples, string(line))
			}
			continue
		}
		at := time.Unix(0, int64(e.TS*1e9))
		if at.Before(from) || at.After(to) {
			continue
		}
		switch e.Level {
		case "debug", "info":
			if strings.Contains(e.Msg, "reachable again") {
				l.Recovered++
			}
			if e.Msg == "load complete" {
				l.Loads++
			}
		default:
			if !strings.HasPrefix(e.Logger, "rate_limit") {
				l.Other++
				continue
			}
			l.Failures++
			if failures < 2 {
				failures++
				l.Examples = append(l.Examples, string(line))
			}
		}
	}
	return l
}
