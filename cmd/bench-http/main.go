// Command bench-http measures what the rate_limit handler costs a Caddy
// server over HTTP. It starts its own redis-server and one Caddy process
// (scripts/bench-http.Caddyfile) on free loopback ports, drives a bare
// route and each rate-limited route with wrk in interleaved pairs, and
// prints, for each case, the ratio of the limited route's requests per
// second to the bare route's. Run it through scripts/bench-http.sh, which
// installs wrk and redis-server when missing and builds Caddy and this
// command first.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/benchhttp"
	"github.com/ratesync/caddy-ratelimit/internal/docgen"
	"github.com/ratesync/caddy-ratelimit/internal/proc"
)

// benchCase is one limited route, compared with the bare route.
type benchCase struct {
	name   string // for CASES and PROFILE
	label  string // for the table
	path   string
	newKey bool // a new key per request: a counter in the query string
	// keys, unless 0, spreads the requests over that many keys, in the
	// query string, in turn.
	keys  int
	redis bool // count the Redis commands it sends
	shows int  // the rate limit headers its responses carry: draftShown, kongShown
}

var cases = []benchCase{
	{name: "local", label: "local, one key, headers draft (default)", path: "/local", shows: draftShown},
	{name: "local-kong", label: "local, one key, headers kong", path: "/local-kong", shows: kongShown},
	{name: "local-both", label: "local, one key, headers draft kong", path: "/local-both", shows: draftShown | kongShown},
	{name: "local-hidden", label: "local, one key, headers none", path: "/local-hidden"},
	// One limit sends two of Kong's headers fewer: with Server and
	// Content-Type, the response's header map then stays within the 8
	// entries of a small Go map, which two limits' 7 headers take past.
	{name: "local-one", label: "local, one key, one limit, kong (5)", path: "/local-one", shows: kongShown},
	{name: "local-newkey", label: "local, new key per request", path: "/local-newkey", newKey: true, shows: draftShown},
	{name: "periodic", label: "periodic 100ms, one key, Redis", path: "/periodic", redis: true, shows: draftShown},
	{name: "sync", label: "synchronous, one key, Redis", path: "/sync", redis: true, shows: draftShown},
	{name: "sync-rate", label: "synchronous, one key, rate only, Redis", path: "/sync-rate", redis: true, shows: draftShown},
	{name: "sync-32", label: "synchronous, 32 keys, Redis", path: "/sync-32", keys: 32, redis: true, shows: draftShown},
	{name: "sync-100", label: "synchronous, 100 keys, Redis", path: "/sync-100", keys: 100, redis: true, shows: draftShown},
	{name: "sync-1000", label: "synchronous, 1,000 keys, Redis", path: "/sync-1000", keys: 1000, redis: true, shows: draftShown},
	{name: "sync-concurrent", label: "synchronous, 32 keys, max_concurrent, Redis", path: "/sync-concurrent", keys: 32, redis: true, shows: draftShown},
	// The floors of the cases that show headers: what writing them costs
	// net/http, with no limiter at all.
	{name: "draft-only", label: "control: the draft's 2 fields, no limiter", path: "/draft-only", shows: draftShown},
	{name: "headers-only", label: "control: kong's 7 headers, no limiter", path: "/headers-only", shows: kongShown},
}

// keying is how a run's requests vary their keys: oneKey, newKeys, or a
// positive number of keys that they take in turn.
type keying int

const (
	oneKey  keying = 0
	newKeys keying = -1
)

func (c benchCase) keying() keying {
	if c.newKey {
		return newKeys
	}
	return keying(c.keys)
}

// Which rate limit headers a route's responses carry.
const (
	draftShown = 1 << iota // RateLimit-Policy and RateLimit
	kongShown              // X-RateLimit-*-<Window> and RateLimit-Limit/Remaining/Reset
)

const barePath = "/bare"

// routes are the paths of every route the Caddyfile serves, the bare one
// first.
func routes() []string {
	paths := []string{barePath}
	for _, c := range cases {
		paths = append(paths, c.path)
	}
	return paths
}

// portEnv names the environment variable that gives the port of the
// route at path, such as BENCH_PORT_LOCAL_NEWKEY for /local-newkey. Each
// route is a server of its own, on its own port, with no matcher: in one
// server, Caddy tries its routes' matchers in turn, so a route would pay
// for the matchers of every route before it.
func portEnv(path string) string {
	return "BENCH_PORT_" + strings.ToUpper(strings.ReplaceAll(strings.TrimPrefix(path, "/"), "-", "_"))
}

// urlOf is the URL of the route at path: its port, and the path, which
// Caddy does not read but a log shows.
func urlOf(ports map[string]int, path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", ports[path], path)
}

type config struct {
	caddy, caddyfile, workdir string
	command                   string // how the harness was invoked, for the report
	pairs                     int
	duration, warmup          time.Duration
	connections, threads      int
	cases                     []benchCase
	profile                   string // a case name (or "bare") to profile, or ""
	profileOut                string
	profileFor                time.Duration
	doc                       string // the page whose generated part the results replace, or ""
	source                    string // what Caddy was built from, for the report
}

func main() {
	var cfg config
	var caseList string
	flag.StringVar(&cfg.caddy, "caddy", "", "the Caddy binary, built with this plugin")
	flag.StringVar(&cfg.caddyfile, "caddyfile", "scripts/bench-http.Caddyfile", "the benchmark's Caddyfile")
	flag.StringVar(&cfg.workdir, "workdir", "", "a directory for logs, scripts and Redis (default: a new temporary one)")
	flag.StringVar(&cfg.command, "command", "", "the command line to print in the report")
	flag.IntVar(&cfg.pairs, "pairs", 5, "bare/limited pairs per case")
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "length of each run (whole seconds: wrk takes no less)")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "warm-up run of each route before a case's pairs (whole seconds)")
	flag.IntVar(&cfg.connections, "connections", 32, "wrk's keep-alive connections")
	flag.IntVar(&cfg.threads, "threads", 1, "wrk's threads")
	flag.StringVar(&caseList, "cases", "", "comma-separated cases to run (default: all): "+caseNames())
	flag.StringVar(&cfg.profile, "profile", "", "after the cases, write a CPU profile of Caddy under this case's load (a case name or bare)")
	flag.StringVar(&cfg.profileOut, "profile-out", "", "where the profile goes (default: caddy-<case>.pprof)")
	flag.DurationVar(&cfg.profileFor, "profile-seconds", 10*time.Second, "length of the CPU profile")
	flag.StringVar(&cfg.source, "source", "", "what Caddy was built from, for the report (such as the working tree at a commit)")
	flag.StringVar(&cfg.doc, "doc", "", "also write the results into this page (docs/performance.md), between its markers")
	flag.Parse()

	if err := cfg.check(caseList); err != nil {
		fmt.Fprintln(os.Stderr, "bench-http:", err)
		os.Exit(2)
	}
	// Ctrl-C or a kill stops wrk through the context, and the deferred
	// stops in run then end Caddy and Redis.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "bench-http: interrupted; Caddy and redis-server are stopped")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "bench-http:", err)
		os.Exit(1)
	}
}

func caseNames() string {
	var names []string
	for _, c := range cases {
		names = append(names, c.name)
	}
	return strings.Join(names, ",")
}

func (cfg *config) check(caseList string) error {
	if cfg.caddy == "" {
		return errors.New("-caddy is required")
	}
	if cfg.pairs < 1 || cfg.connections < 1 || cfg.threads < 1 || cfg.connections < cfg.threads {
		return errors.New("-pairs, -threads and -connections must be positive, with at least one connection per thread")
	}
	for _, d := range []time.Duration{cfg.duration, cfg.warmup} {
		if d < time.Second || d%time.Second != 0 {
			return fmt.Errorf("durations must be whole seconds, at least 1s: got %v", d)
		}
	}
	if cfg.profileFor < time.Second {
		return fmt.Errorf("-profile-seconds must be at least 1s: got %v", cfg.profileFor)
	}
	if caseList == "" {
		cfg.cases = cases
	} else {
		for name := range strings.SplitSeq(caseList, ",") {
			c, ok := findCase(strings.TrimSpace(name))
			if !ok {
				return fmt.Errorf("unknown case %q: want some of %s", name, caseNames())
			}
			cfg.cases = append(cfg.cases, c)
		}
	}
	if cfg.profile != "" {
		if _, ok := findCase(cfg.profile); !ok && cfg.profile != "bare" {
			return fmt.Errorf("unknown profile case %q: want bare or one of %s", cfg.profile, caseNames())
		}
		if cfg.profileOut == "" {
			cfg.profileOut = "caddy-" + cfg.profile + ".pprof"
		}
	}
	return nil
}

func findCase(name string) (benchCase, bool) {
	for _, c := range cases {
		if c.name == name {
			return c, true
		}
	}
	return benchCase{}, false
}

func run(ctx context.Context, cfg config) error {
	if cfg.workdir == "" {
		dir, err := os.MkdirTemp("", "bench-http-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		cfg.workdir = dir
	}

	info := printHeader(cfg)

	redisSrv, redisAddr, err := startRedis(ctx, cfg.workdir)
	if err != nil {
		return err
	}
	defer redisSrv.Stop(syscall.SIGTERM, 5*time.Second)
	// RESP2 and no CLIENT SETINFO: this client sends nothing but the
	// harness's own CONFIG RESETSTAT and INFO, which the counts leave out.
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, Protocol: 2, DisableIdentity: true, PoolSize: 1})
	defer rdb.Close()

	caddySrv, ports, admin, err := startCaddy(ctx, cfg, redisAddr)
	if err != nil {
		return err
	}
	defer caddySrv.Stop(syscall.SIGTERM, 5*time.Second)
	fmt.Printf("servers:  redis-server on %s, Caddy with a server per route on 127.0.0.1 (bare on port %d; admin and /debug/pprof/ on %s)\n", redisAddr, ports[barePath], admin)
	if err := checkRoutes(ports); err != nil {
		return err
	}

	b := &bencher{cfg: cfg, ports: ports, caddyPID: caddySrv.Pid(), rdb: rdb, redisAddr: redisAddr}
	if err := b.writeScripts(); err != nil {
		return err
	}
	var results []caseResult
	for _, c := range cfg.cases {
		res, err := b.runCase(ctx, c)
		if err != nil {
			return fmt.Errorf("case %s: %v", c.name, err)
		}
		results = append(results, res)
	}
	printTable(results)
	end := loadAvg()
	fmt.Printf("\nload average at the end: %s\n", end)
	info.Machine += "; at the end " + end

	if cfg.profile != "" {
		if err := b.profile(ctx, admin); err != nil {
			return fmt.Errorf("profile: %v", err)
		}
	}
	if !caddySrv.Running() {
		return fmt.Errorf("Caddy exited during the benchmark; its log:\n%s", caddySrv.Log(30))
	}
	for _, r := range results {
		if r.statusErrors > 0 {
			return fmt.Errorf("case %s: %d responses were not 2xx: the numbers measure rejections or failures, not the limiter's cost", r.c.name, r.statusErrors)
		}
	}
	var md strings.Builder
	benchhttp.WriteMarkdown(&md, info, caseRows(results))
	fmt.Printf("\nAs Markdown, the part of docs/performance.md between its markers:\n\n%s", md.String())
	if cfg.doc != "" {
		if err := docgen.ReplaceFile(cfg.doc, benchhttp.DocCommand, md.String()); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench-http: wrote the results into %s\n", cfg.doc)
	}
	return nil
}

// caseRows are the cases' figures for the Markdown report.
func caseRows(results []caseResult) []benchhttp.CaseRow {
	var rows []benchhttp.CaseRow
	for _, r := range results {
		row := benchhttp.CaseRow{Label: r.c.label, Summary: r.sum, Redis: r.c.redis}
		if r.c.redis {
			row.RanPer1k = benchhttp.PerThousand(r.cmds.Total(), r.cmdRequests)
			row.SentPer1k = benchhttp.PerThousand(r.sent.Total(), r.monRequests)
			row.RedisCPU = perRequestMicros(r.redisCPU, r.cmdRequests)
		}
		rows = append(rows, row)
	}
	return rows
}

// printHeader prints how the run goes, and returns it for the Markdown
// report.
func printHeader(cfg config) benchhttp.RunInfo {
	fmt.Println("HTTP benchmark of the rate_limit handler: requests per second of each limited route over a bare route's, one Caddy process")
	fmt.Printf("date:     %s\n", time.Now().UTC().Format(time.RFC3339))
	if cfg.command != "" {
		fmt.Printf("command:  %s\n", cfg.command)
	}
	fmt.Printf("machine:  nproc %d, %s, load average %s\n", runtime.NumCPU(), cpuModel(), loadAvg())
	fmt.Printf("go:       %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Printf("caddy:    %s\n", firstLine(output(cfg.caddy, "version")))
	fmt.Printf("redis:    %s\n", firstLine(output("redis-server", "--version")))
	wrkVersion, _, _ := strings.Cut(firstLine(output("wrk", "--version")), " Copyright")
	fmt.Printf("load:     %s, %d connections, %d thread(s), keep-alive; %v per run, %v warm-up per route and case\n",
		wrkVersion, cfg.connections, cfg.threads, cfg.duration, cfg.warmup)
	fmt.Printf("pairs:    %d per case; a pair is a bare run and a limited run back to back, alternately bare first and limited first\n", cfg.pairs)
	if cfg.pairs < 5 {
		fmt.Println("          (fewer than 5 pairs: a smoke test, not a measurement)")
	}
	info := benchhttp.RunInfo{
		Date:    time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Plugin:  cfg.source,
		Machine: fmt.Sprintf("nproc %d, %s, load average %s at the start", runtime.NumCPU(), cpuModel(), loadAvg()),
		Go:      fmt.Sprintf("%s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH),
		Caddy:   firstLine(output(cfg.caddy, "version")),
		Redis:   firstLine(output("redis-server", "--version")),
		Load: fmt.Sprintf("%s, %d connections, %d thread(s), keep-alive; %v per run, %v warm-up per route and case",
			wrkVersion, cfg.connections, cfg.threads, cfg.duration, cfg.warmup),
		Pairs: fmt.Sprintf("%d per case, a bare run and a limited run back to back, alternately bare first and limited first", cfg.pairs),
	}
	if cfg.command != "" {
		info.Command = "`" + cfg.command + "`"
	}
	if cfg.pairs < 5 {
		info.Pairs += " (fewer than 5: a smoke test, not a measurement)"
	}
	return info
}

// output runs a command for its version line; a failure is reported in
// its place.
func output(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if len(out) == 0 && err != nil {
		return fmt.Sprintf("(%s: %v)", name, err)
	}
	return string(out)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return strings.TrimSpace(line)
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "CPU model unknown"
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "CPU model unknown"
}

func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// startRedis starts a redis-server of the harness's own on a free loopback
// port, persisting nothing: never the machine's Redis.
func startRedis(ctx context.Context, dir string) (*proc.Proc, string, error) {
	var lastErr error
	for range 3 {
		port, err := proc.FreePort()
		if err != nil {
			return nil, "", err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		logfile := filepath.Join(dir, "redis.log")
		p, err := proc.Start(logfile, nil, "redis-server",
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--logfile", logfile)
		if err != nil {
			return nil, "", err
		}
		rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
		// The server that answers must be this one, not one that took the
		// port first.
		pid := fmt.Sprintf("process_id:%d\r\n", p.Pid())
		err = p.WaitUntil(ctx, 10*time.Second, 50*time.Millisecond, func() bool {
			info, err := rdb.Info(ctx, "server").Result()
			return err == nil && strings.Contains(info, pid)
		})
		rdb.Close()
		if err == nil {
			return p, addr, nil
		}
		p.Stop(syscall.SIGTERM, 5*time.Second)
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		lastErr = fmt.Errorf("redis-server on %s: %v; its log:\n%s", addr, err, p.Log(10))
	}
	return nil, "", lastErr
}

// startCaddy starts Caddy with the benchmark's Caddyfile, each route on a
// free loopback port of its own, its Redis namespaces on redisAddr, and
// waits until the bare route answers. It returns the port of each route's
// path.
func startCaddy(ctx context.Context, cfg config, redisAddr string) (p *proc.Proc, ports map[string]int, admin string, err error) {
	var lastErr error
	for range 3 {
		adminPort, err := proc.FreePort()
		if err != nil {
			return nil, nil, "", err
		}
		admin = net.JoinHostPort("127.0.0.1", strconv.Itoa(adminPort))
		env := []string{
			"BENCH_ADMIN_PORT=" + strconv.Itoa(adminPort),
			"BENCH_REDIS=" + redisAddr,
		}
		ports = make(map[string]int)
		for _, path := range routes() {
			port, err := proc.FreePort()
			if err != nil {
				return nil, nil, "", err
			}
			ports[path] = port
			env = append(env, portEnv(path)+"="+strconv.Itoa(port))
		}
		logfile := filepath.Join(cfg.workdir, "caddy.log")
		p, err = proc.Start(logfile, env, cfg.caddy, "run", "--config", cfg.caddyfile, "--adapter", "caddyfile")
		if err != nil {
			return nil, nil, "", err
		}
		url := urlOf(ports, barePath)
		err = p.WaitUntil(ctx, 30*time.Second, 50*time.Millisecond, func() bool {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
		if err == nil {
			return p, ports, admin, nil
		}
		p.Stop(syscall.SIGTERM, 5*time.Second)
		if ctx.Err() != nil {
			return nil, nil, "", ctx.Err()
		}
		lastErr = fmt.Errorf("Caddy, bare route on port %d: %v; its log:\n%s", ports[barePath], err, p.Log(30))
	}
	return nil, nil, "", lastErr
}

// checkRoutes makes sure every route answers 200, and that the headers
// are there or not as the case says: otherwise the benchmark would
// measure something else.
func checkRoutes(ports map[string]int) error {
	for _, c := range append([]benchCase{{name: "bare", path: barePath}}, cases...) {
		resp, err := http.Get(urlOf(ports, c.path) + "?check")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "ok" {
			return fmt.Errorf("%s answered %d %q, want 200 \"ok\"", c.path, resp.StatusCode, body)
		}
		shows := 0
		if resp.Header.Get("RateLimit-Policy") != "" && resp.Header.Get("RateLimit") != "" {
			shows |= draftShown
		}
		if resp.Header.Get("RateLimit-Limit") != "" {
			shows |= kongShown
		}
		if shows != c.shows {
			return fmt.Errorf("%s: rate limit headers %v, want the draft's %v and Kong's %v", c.path, resp.Header,
				c.shows&draftShown != 0, c.shows&kongShown != 0)
		}
	}
	return nil
}

type bencher struct {
	cfg          config
	ports        map[string]int // of each route's path
	caddyPID     int
	rdb          *redis.Client
	redisAddr    string
	staticScript string            // prints the result only: wrk sends one fixed request
	newKeyScript string            // also puts a new counter in each request's query
	keysScripts  map[keying]string // put one of so many keys in each request's query
	runs         int               // wrk runs so far, for distinct keys across runs
}

// The scripts' done() prints one line that benchhttp.ParseWrk reads.
const doneLua = `
function done(summary, latency, requests)
	local e = summary.errors
	io.write(string.format("WRK_RESULT requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
		summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout))
end
`

// newKeyLua numbers the threads in setup (run in the main Lua state) so
// that each thread's keys, "<run>-<thread>-<n>", differ from every other
// request's. It is used for the bare side of the pair too, so that both
// runs pay wrk the same cost of building requests.
const newKeyLua = `
local threads = 0
function setup(thread)
	threads = threads + 1
	thread:set("id", threads)
end
function init(args)
	prefix = wrk.path .. "?" .. (args[1] or "run") .. "-" .. id .. "-"
	n = 0
end
function request()
	n = n + 1
	return wrk.format(nil, prefix .. n)
end
` + doneLua

// keysLua sends each request with one of {keys} keys in its query, in
// turn.
const keysLua = `
function init(args)
	n = 0
end
function request()
	n = n + 1
	return wrk.format(nil, wrk.path .. "?k" .. (n % {keys}))
end
` + doneLua

func (b *bencher) writeScripts() error {
	b.staticScript = filepath.Join(b.cfg.workdir, "static.lua")
	b.newKeyScript = filepath.Join(b.cfg.workdir, "newkey.lua")
	scripts := map[string]string{b.staticScript: doneLua, b.newKeyScript: newKeyLua}
	b.keysScripts = make(map[keying]string)
	for _, c := range cases {
		if k := c.keying(); k > 0 {
			path := filepath.Join(b.cfg.workdir, fmt.Sprintf("keys-%d.lua", k))
			b.keysScripts[k] = path
			scripts[path] = strings.ReplaceAll(keysLua, "{keys}", strconv.Itoa(int(k)))
		}
	}
	for path, script := range scripts {
		if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// wrk runs wrk once against path; keys selects the script that varies
// the query string.
func (b *bencher) wrk(ctx context.Context, path string, keys keying, d time.Duration) (benchhttp.WrkResult, error) {
	b.runs++
	script := b.staticScript
	switch {
	case keys == newKeys:
		script = b.newKeyScript
	case keys > 0:
		script = b.keysScripts[keys]
	}
	url := urlOf(b.ports, path)
	cmd := exec.CommandContext(ctx, "wrk",
		"-t", strconv.Itoa(b.cfg.threads), "-c", strconv.Itoa(b.cfg.connections),
		"-d", fmt.Sprintf("%ds", int(d/time.Second)), "-s", script, url, "--", "r"+strconv.Itoa(b.runs))
	proc.SetDeathSignal(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return benchhttp.WrkResult{}, ctx.Err()
		}
		return benchhttp.WrkResult{}, fmt.Errorf("wrk %s: %v:\n%s", path, err, out)
	}
	return benchhttp.ParseWrk(string(out))
}

// measured runs wrk once and reads the CPU time Caddy used meanwhile, or
// 0 where /proc cannot tell.
func (b *bencher) measured(ctx context.Context, path string, keys keying) (benchhttp.Run, error) {
	before, errBefore := b.caddyCPU()
	r, err := b.wrk(ctx, path, keys, b.cfg.duration)
	after, errAfter := b.caddyCPU()
	run := benchhttp.Run{WrkResult: r}
	if errBefore == nil && errAfter == nil {
		run.CaddyCPU = after - before
	}
	return run, err
}

func (b *bencher) caddyCPU() (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", b.caddyPID))
	if err != nil {
		return 0, err
	}
	return benchhttp.ParseProcStat(string(stat))
}

type caseResult struct {
	c            benchCase
	sum          benchhttp.Summary
	cmds         benchhttp.CommandStats // Redis commands during the limited runs
	cmdRequests  int64                  // requests of those runs
	redisCPU     time.Duration          // Redis's CPU time during those runs
	statusErrors int64

	// From the MONITOR run: the commands Caddy sent, those its scripts
	// ran, and the requests of that run.
	sent, scripted benchhttp.CommandStats
	monRequests    int64
}

// redisSettle is how long a limited run's Redis counts wait after the run
// ends: two periodic syncs (100 ms), so that the last hits' push counts
// with the run that made them.
const redisSettle = 300 * time.Millisecond

// limited runs the limited route once; for a Redis case, it also counts
// the Redis commands the run sent: CONFIG RESETSTAT before, INFO
// commandstats after. Only the limited runs are counted, so the sync
// loop's idle work during the bare runs is left out.
func (b *bencher) limited(ctx context.Context, c benchCase, res *caseResult) (benchhttp.Run, error) {
	if c.redis {
		if err := b.rdb.ConfigResetStat(ctx).Err(); err != nil {
			return benchhttp.Run{}, fmt.Errorf("CONFIG RESETSTAT: %v", err)
		}
	}
	var cpuBefore time.Duration
	if c.redis {
		var err error
		if cpuBefore, err = b.redisCPU(ctx); err != nil {
			return benchhttp.Run{}, err
		}
	}
	r, err := b.measured(ctx, c.path, c.keying())
	if err != nil || !c.redis {
		return r, err
	}
	cpuAfter, err := b.redisCPU(ctx)
	if err != nil {
		return r, err
	}
	res.redisCPU += cpuAfter - cpuBefore
	select {
	case <-ctx.Done():
		return r, ctx.Err()
	case <-time.After(redisSettle):
	}
	info, err := b.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return r, fmt.Errorf("INFO commandstats: %v", err)
	}
	stats, err := benchhttp.ParseCommandStats(info)
	if err != nil {
		return r, err
	}
	res.cmds.Add(stats)
	res.cmdRequests += r.Requests
	return r, nil
}

// redisCPU returns the CPU time the harness's redis-server has used.
func (b *bencher) redisCPU(ctx context.Context) (time.Duration, error) {
	info, err := b.rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO cpu: %v", err)
	}
	return benchhttp.ParseRedisCPU(info)
}

func (b *bencher) runCase(ctx context.Context, c benchCase) (caseResult, error) {
	res := caseResult{c: c, cmds: benchhttp.CommandStats{}}
	fmt.Printf("\n%s (%s vs %s)\n", c.label, c.path, barePath)
	// Warm-up: connections, Caddy's pools, the key's counters and the
	// Redis connections exist before anything is measured.
	for _, path := range []string{barePath, c.path} {
		if _, err := b.wrk(ctx, path, c.keying(), b.cfg.warmup); err != nil {
			return res, err
		}
	}
	var pairs []benchhttp.Pair
	for i := range b.cfg.pairs {
		var p benchhttp.Pair
		var err error
		// Odd pairs run the limited route first: over two pairs, a drift
		// of the machine's speed weighs on both routes alike.
		if i%2 == 0 {
			if p.Bare, err = b.measured(ctx, barePath, c.keying()); err == nil {
				p.Limited, err = b.limited(ctx, c, &res)
			}
		} else {
			if p.Limited, err = b.limited(ctx, c, &res); err == nil {
				p.Bare, err = b.measured(ctx, barePath, c.keying())
			}
		}
		if err != nil {
			return res, err
		}
		note := ""
		if e := p.Bare.Errors() + p.Limited.Errors(); e > 0 {
			note = fmt.Sprintf("  (errors: bare %+v, limited %+v)", p.Bare.WrkResult, p.Limited.WrkResult)
		}
		res.statusErrors += p.Bare.Status + p.Limited.Status
		fmt.Printf("  pair %d: bare %6.0f req/s %5.1f µs CPU/req, limited %6.0f req/s %5.1f µs CPU/req: ratio %.3f%s\n",
			i+1, p.Bare.ReqPerSec(), p.Bare.CPUPerRequest(), p.Limited.ReqPerSec(), p.Limited.CPUPerRequest(), p.Ratio(), note)
		pairs = append(pairs, p)
	}
	res.sum = benchhttp.Summarize(pairs)
	if c.redis {
		if err := b.monitor(ctx, c, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// monitor runs the limited route once more with a MONITOR connection to
// Redis, to tell the commands Caddy sends (round trips, pipelined or not)
// from the commands its Lua scripts run, which INFO commandstats counts
// alike. MONITOR slows Redis down, so this run is not one of the pairs.
func (b *bencher) monitor(ctx context.Context, c benchCase, res *caseResult) error {
	conn, err := net.DialTimeout("tcp", b.redisAddr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		return err
	}
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		return fmt.Errorf("MONITOR: %q, %v", line, err)
	}
	res.sent, res.scripted = benchhttp.CommandStats{}, benchhttp.CommandStats{}
	read := make(chan struct{})
	go func() {
		defer close(read)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return // the connection was closed
			}
			if name, inScript, ok := benchhttp.ParseMonitorLine(line); ok && inScript {
				res.scripted[name]++
			} else if ok {
				res.sent[name]++
			}
		}
	}()
	r, err := b.wrk(ctx, c.path, c.keying(), b.cfg.duration)
	if err == nil {
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(redisSettle):
		}
	}
	conn.Close()
	<-read
	res.monRequests = r.Requests
	res.statusErrors += r.Status
	return err
}

func printTable(results []caseResult) {
	fmt.Println()
	fmt.Println("ratio: limited req/s over bare req/s of the same pair, median and range over the pairs; req/s: medians")
	fmt.Println("CPU µs/req: Caddy's CPU time per request (/proc), medians; added: median over the pairs of limited minus bare")
	// (No %-Ns with "µ": it is two bytes wide in the count, one on screen.)
	fmt.Printf("%-38s %6s  %-13s %10s %10s   %s\n", "", "", "", "bare", "limited", "Caddy CPU µs/req")
	fmt.Printf("%-38s %6s  %-13s %10s %10s   %6s %7s %6s\n", "case", "ratio", "min-max", "req/s", "req/s", "bare", "limited", "added")
	for _, r := range results {
		fmt.Printf("%-38s %6.3f  %5.3f-%-7.3f %10.0f %10.0f   %6.1f %7.1f %+6.1f\n",
			r.c.label, r.sum.Ratio, r.sum.Min, r.sum.Max, r.sum.BareRPS, r.sum.LimitedRPS,
			r.sum.BareCPU, r.sum.LimitedCPU, r.sum.AddedCPU)
	}

	var redisCases []caseResult
	for _, r := range results {
		if r.c.redis {
			redisCases = append(redisCases, r)
		}
	}
	if len(redisCases) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("Redis commands per 1,000 requests: ran = all that Redis ran in the timed limited runs (INFO commandstats, which")
	fmt.Println("counts the commands Lua scripts run too); sent = those Caddy sent, in one more limited run under MONITOR;")
	fmt.Println("Redis CPU = Redis's CPU time per request in the timed limited runs (INFO cpu, system and user)")
	fmt.Printf("%-38s %10s %10s %16s\n", "case", "ran", "sent", "Redis CPU µs/req")
	for _, r := range redisCases {
		fmt.Printf("%-38s %10.1f %10.1f %16.1f\n", r.c.label,
			benchhttp.PerThousand(r.cmds.Total(), r.cmdRequests), benchhttp.PerThousand(r.sent.Total(), r.monRequests),
			perRequestMicros(r.redisCPU, r.cmdRequests))
	}
	for _, r := range redisCases {
		printBreakdown(r)
	}
}

// perRequestMicros returns d per request, in microseconds.
func perRequestMicros(d time.Duration, requests int64) float64 {
	if requests == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(requests)
}

// printBreakdown prints a Redis case's commands one by one, per 1,000
// requests: all that Redis ran in the timed limited runs, and from the
// MONITOR run, those Caddy sent and those its scripts ran.
func printBreakdown(r caseResult) {
	fmt.Printf("\n%s: Redis commands per 1,000 requests\n", r.c.label)
	fmt.Printf("  (commandstats: %d commands over %d requests of the timed limited runs; MONITOR: %d sent and %d run by scripts over %d requests)\n",
		r.cmds.Total(), r.cmdRequests, r.sent.Total(), r.scripted.Total(), r.monRequests)
	all := benchhttp.CommandStats{}
	for _, stats := range []benchhttp.CommandStats{r.cmds, r.sent, r.scripted} {
		for name := range stats {
			all[name] = max(all[name], stats[name])
		}
	}
	fmt.Printf("  %-20s %10s %10s %16s\n", "command", "ran", "sent", "run by scripts")
	per := func(stats benchhttp.CommandStats, name string, requests int64) string {
		if stats[name] == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", benchhttp.PerThousand(stats[name], requests))
	}
	for _, name := range r.cmds.Names() {
		delete(all, name)
		fmt.Printf("  %-20s %10s %10s %16s\n", name, per(r.cmds, name, r.cmdRequests), per(r.sent, name, r.monRequests), per(r.scripted, name, r.monRequests))
	}
	for _, name := range all.Names() { // seen only under MONITOR
		fmt.Printf("  %-20s %10s %10s %16s\n", name, "-", per(r.sent, name, r.monRequests), per(r.scripted, name, r.monRequests))
	}
}

// profile writes a CPU profile of Caddy, taken from its admin endpoint's
// /debug/pprof/ while wrk loads one route.
func (b *bencher) profile(ctx context.Context, admin string) error {
	c, ok := findCase(b.cfg.profile)
	if !ok {
		c = benchCase{name: "bare", path: barePath}
	}
	type wrkDone struct {
		r   benchhttp.WrkResult
		err error
	}
	done := make(chan wrkDone, 1)
	// The load starts a second before the profile and ends after it.
	load := b.cfg.profileFor + 3*time.Second
	go func() {
		r, err := b.wrk(ctx, c.path, c.keying(), load)
		done <- wrkDone{r, err}
	}()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Second):
	}
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, int(b.cfg.profileFor/time.Second))
	client := &http.Client{Timeout: b.cfg.profileFor + 30*time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	f, err := os.Create(b.cfg.profileOut)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	w := <-done
	if w.err != nil {
		return w.err
	}
	fmt.Printf("\nprofile: %v of Caddy's CPU under %s load (%.0f req/s, %d non-2xx) written to %s\n",
		b.cfg.profileFor, c.path, w.r.ReqPerSec(), w.r.Status, b.cfg.profileOut)
	return nil
}
