package faults

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/docgen"
)

func TestWorstSecond(t *testing.T) {
	base := time.UnixMilli(1_000_000_000) // a whole second
	counts := map[int64]float64{
		1_000_000: 50, // the partial first second: left out
		1_000_001: 60,
		1_000_002: 100,
		1_000_003: 150, // the partial last second: left out
	}
	from, to := base.Add(300*time.Millisecond), base.Add(3500*time.Millisecond)
	if got := worstSecond(counts, from, to); got != 100.0/LimitPerSecond {
		t.Errorf("worstSecond = %v, want %v", got, 100.0/LimitPerSecond)
	}
}

func TestRecovery(t *testing.T) {
	served := time.Unix(100, 0)
	at := func(ms int) time.Time { return served.Add(time.Duration(ms) * time.Millisecond) }
	o := &Outcome{Served: served, KilledNode: -1, Samples: [][]SyncSample{
		// Failures before and after served, then a clean run at +700 ms.
		{{At: at(-200), Runs: 1, Errors: 0}, {At: at(-100), Runs: 2, Errors: 1}, {At: at(300), Runs: 3, Errors: 2}, {At: at(700), Runs: 4, Errors: 2}},
		// No failure at all.
		{{At: at(-200), Runs: 1}, {At: at(100), Runs: 2}},
		// Never a clean run after its last failure.
		{{At: at(-200), Runs: 1}, {At: at(100), Runs: 2, Errors: 1}, {At: at(200), Runs: 2, Errors: 1}},
	}}
	o.recovery()
	want := []time.Duration{700 * time.Millisecond, 0, -1}
	for i := range want {
		if o.Recovery[i] != want[i] {
			t.Errorf("node %d: recovery %v, want %v", i+1, o.Recovery[i], want[i])
		}
	}
	if o.RecoveryMax != -1 {
		t.Errorf("RecoveryMax = %v, want -1 (a node never synced again)", o.RecoveryMax)
	}
	if !o.Failed[0] || o.Failed[1] {
		t.Errorf("Failed = %v", o.Failed)
	}
}

func TestAdmissions(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	s := func(key string, a, b int) span { return span{key, at(a), at(b)} }
	ran := []span{s("k", 0, 100), s("k", 50, 150), s("k", 100, 200), s("other", 60, 70), s("k", 120, 130)}
	for _, tc := range []struct {
		name     string
		from, to int
		limit    int
		want     Admissions
	}{
		// At 100 ms the first one ends as the third starts: 2, not 3.
		// At 120 ms: those of 50 and 100 ms, and itself.
		{"all", 0, 1000, 2, Admissions{N: 4, Worst: 3, Over: 1, LastOver: at(120)}},
		// The one started at 50 ms is not judged, but still runs at
		// 100 and 120 ms: it counts against them.
		{"from 100 ms", 100, 1000, 2, Admissions{N: 2, Worst: 3, Over: 1, LastOver: at(120)}},
		{"within the limit", 0, 1000, 3, Admissions{N: 4, Worst: 3}},
		{"to is left out", 0, 100, 2, Admissions{N: 2, Worst: 2}},
		{"none", 500, 1000, 2, Admissions{}},
	} {
		if got := admissions(ran, "k", at(tc.from), at(tc.to), tc.limit); got != tc.want {
			t.Errorf("%s: admissions = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	// Two starting at once see each other; one that took no time still ran.
	ran = []span{s("k", 0, 100), s("k", 0, 50), s("z", 10, 10)}
	if got := admissions(ran, "k", at(0), at(1000), 5); got.N != 2 || got.Worst != 2 {
		t.Errorf("same start: %+v, want 2 admissions with 2 running", got)
	}
	if got := admissions(ran, "z", at(0), at(1000), 5); got.N != 1 || got.Worst != 1 {
		t.Errorf("no time: %+v, want 1 admission with itself running", got)
	}
}

// TestConcurrencyJudgedOnceSyncing: the cap is judged from the row's
// syncing-again time, with the requests admitted on local counts during
// the outage still counted as running, and from a second after the store
// served when no node time is known.
func TestConcurrencyJudgedOnceSyncing(t *testing.T) {
	served := time.Unix(100, 0)
	at := func(ms int) time.Time { return served.Add(time.Duration(ms) * time.Millisecond) }
	fault, _ := FaultByName("redis-pause")
	key := "row-conc"
	newOutcome := func(syncedAt int, spans ...span) *Outcome {
		o := &Outcome{
			Row: Row{Fault: fault}, KilledNode: -1, BanBeforeKey: "row-ban-before",
			LoadStart: at(-5000), Start: at(-3000), Served: served, LoadEnd: at(5000),
			// One node: a failure before served, a clean run at syncedAt.
			Samples: [][]SyncSample{{{At: at(-2000), Runs: 1}, {At: at(-1000), Runs: 2, Errors: 1}, {At: at(syncedAt), Runs: 3, Errors: 1}}},
		}
		if syncedAt < 0 {
			o.Samples[0] = o.Samples[0][:2] // never a clean run
		}
		o.recovery()
		o.concurrency(&Upstream{ran: spans})
		return o
	}
	reqs := func(n, from, to int) []span {
		var ss []span
		for range n {
			ss = append(ss, span{key, at(from), at(to)})
		}
		return ss
	}
	capCheck := func(o *Outcome) Check {
		for _, c := range o.Checks() {
			if strings.HasPrefix(c.Promise, "max_concurrent: once every node syncs again") {
				return c
			}
		}
		t.Fatal("no max_concurrent cap check")
		return Check{}
	}

	// 7 admitted on local counts at +200 ms, ending at +900 ms; every node
	// syncs again at +700 ms; 5 admitted at +1000 ms, once those ended.
	o := newOutcome(700, append(reqs(7, 200, 900), reqs(5, 1000, 1100)...)...)
	if c := capCheck(o); !c.Held || o.ConcFrom != 700*time.Millisecond || !o.ConcFromSync || o.Conc != (Admissions{N: 5, Worst: 5}) {
		t.Errorf("outage's requests over before the next: %+v, from %v (%v), %+v", c, o.ConcFrom, o.ConcFromSync, o.Conc)
	}
	// One more admitted at +800 ms, while the 7 still run: 8 in flight.
	o = newOutcome(700, append(reqs(7, 200, 900), append(reqs(1, 800, 900), reqs(5, 1000, 1100)...)...)...)
	if c := capCheck(o); c.Held || o.Conc.Worst != 8 || o.Conc.Over != 1 || !strings.Contains(c.Figure, "1 of 6 admissions over the cap, the last at +0.80 s") {
		t.Errorf("admitted with the outage's requests running: %+v, %+v", c, o.Conc)
	}
	// No node time: from the store serving + 1 s.
	o = newOutcome(-1, reqs(7, 200, 900)...)
	if c := capCheck(o); !c.Held || o.ConcFrom != time.Second || o.ConcFromSync || !strings.Contains(c.Figure, "no request admitted from +1.00 s") {
		t.Errorf("never synced: %+v, from %v (%v)", c, o.ConcFrom, o.ConcFromSync)
	}
}

func TestProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // an echo server
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	p, err := StartProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	roundTrip := func() (time.Duration, error) {
		c, err := net.DialTimeout("tcp", p.Addr, time.Second)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		start := time.Now()
		if _, err := c.Write([]byte("ping")); err != nil {
			return 0, err
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	if _, err := roundTrip(); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.SetDelay(300 * time.Millisecond)
	if d, err := roundTrip(); err != nil || d < 300*time.Millisecond {
		t.Errorf("delayed round trip: %v, %v; want ≥ 300 ms", d, err)
	}
	p.SetDelay(0)
	p.Down()
	if _, err := roundTrip(); err == nil {
		t.Error("the proxy is down, yet a round trip worked")
	}
	if err := p.Up(); err != nil {
		t.Fatal(err)
	}
	if _, err := roundTrip(); err != nil {
		t.Errorf("after Up: %v", err)
	}
}

func TestReadLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.log")
	lines := []string{
		`{"level":"info","ts":100.5,"logger":"rate_limit.sync","msg":"store reachable again"}`,
		`{"level":"error","ts":101,"logger":"rate_limit.sync","msg":"store unreachable"}`,
		`{"level":"error","ts":500,"logger":"rate_limit.sync","msg":"store unreachable"}`, // out of the span
		`{"level":"warn","ts":101,"logger":"http","msg":"HTTP/2 skipped because it requires TLS"}`,
		`redis: 2026/11/25 14:29:22 pool.go:770: redis: connection pool: failed to dial`,
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l := readLogFile(path, 0, time.Unix(100, 0), time.Unix(200, 0))
	if l.Failures != 1 || l.Other != 1 || l.Foreign != 1 || l.Recovered != 1 {
		t.Errorf("ReadLog = %+v, want 1 failure, 1 other, 1 foreign, 1 recovered", l)
	}
}

func TestNodeConfig(t *testing.T) {
	b, err := NodeConfig{Listen: "fd/3", AdminListen: "fd/4", SyncRate: 0, Strategy: json.RawMessage(`{"module":"memory"}`),
		Limit: 5, BanLimit: 5, Ban: time.Minute, MaxConcurrent: 5, Upstream: "127.0.0.1:3"}.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"sync_rate": "0"`, `"max_concurrent": 5`, `"ban": "1m0s"`, `"listen": "fd/4"`, `"fd/3"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config lacks %s:\n%s", want, b)
		}
	}
}

func TestFaultsTable(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range Faults {
		if seen[f.Name] {
			t.Errorf("fault %s twice", f.Name)
		}
		seen[f.Name] = true
		if strings.Contains(f.TitleFor(1), "%!") {
			t.Errorf("fault %s: title %q", f.Name, f.TitleFor(1))
		}
	}
	if got := (&Fault{Name: "redis-flap", Title: "flapping for %s"}).TitleFor(0.5); got != "flapping for 22.5 s" {
		t.Errorf("scaled title = %q", got)
	}
}

func TestSlots(t *testing.T) {
	rs := parseSlots([]string{"0-5460", "7000", "[93->-abc]"})
	if len(rs) != 2 || !inSlots(rs, 0) || !inSlots(rs, 5460) || !inSlots(rs, 7000) || inSlots(rs, 5461) {
		t.Errorf("parseSlots = %v", rs)
	}
	if b := redisBucket("api", "k"); b < 0 || b >= redisBuckets || b != redisBucket("api", "k") {
		t.Errorf("redisBucket = %d", b)
	}
}

// report is a made-up run of one row, with a log line and a row that
// could not run.
func report() *Report {
	served := time.Unix(100, 0)
	at := func(ms int) time.Time { return served.Add(time.Duration(ms) * time.Millisecond) }
	fault, _ := FaultByName("redis-pause")
	o := &Outcome{
		Row: Row{Fault: fault}, Title: fault.TitleFor(1), KilledNode: -1, BanBeforeKey: "row-ban-before",
		LoadStart: at(-5000), Start: at(-3000), End: at(0), Served: served, LoadEnd: at(5000),
		Samples:  [][]SyncSample{{{At: at(-2000), Runs: 1}, {At: at(-1000), Runs: 2, Errors: 1}, {At: at(700), Runs: 3, Errors: 1}}},
		Admitted: 8192, InStore: 8192, P50: time.Millisecond, P99: 3 * time.Millisecond, Max: 7 * time.Millisecond,
		LimitDuring: 3, LimitAfter: 1.2, BanLag: 50 * time.Millisecond, BanKept: []bool{true, true, true}, BanBack: notMeasured,
		GoroutinesBefore: []int{26}, GoroutinesAfter: []int{25}, ConnsBefore: 7, ConnsAfter: 11,
		Logs: []LogLines{{Failures: 1, Examples: []string{`{"level":"error","ts":1.5,"logger":"rate_limit.sync","msg":"store unreachable","error":"redis store: i/o timeout"}`}}},
	}
	o.recovery()
	o.concurrency(&Upstream{ran: []span{{"row-conc", at(200), at(900)}, {"row-conc", at(800), at(900)}}})
	return &Report{Date: served.UTC(), MachineAt: "a machine, load 0.5", MachineEnd: "a machine, load 1.0",
		Command: "./scripts/bench-faults.sh -o docs/faults.md", Source: "the working tree at commit abc1234", Go: "go1.26",
		Versions: []string{"Redis: Redis server v=7.0.15"}, Elapsed: 90 * time.Second,
		Nodes: 3, Scale: 1, Rates: DefaultRates, Outcomes: []*Outcome{o}, Errors: []string{"a row: an error"}}
}

// TestMarkdown checks the part of docs/faults.md the harness prints and
// writes, given its rows.
func TestMarkdown(t *testing.T) {
	got, err := report().Markdown()
	if err != nil {
		t.Fatal(err)
	}
	if got != wantMarkdown {
		t.Errorf("Markdown() =\n%s\nwant\n%s", got, wantMarkdown)
	}
	for _, l := range strings.Split(got, "\n") {
		if len([]rune(l)) > 200 && !strings.HasPrefix(l, "|") {
			t.Errorf("a line of %d characters outside the tables: %q", len([]rune(l)), l)
		}
	}
}

const wantMarkdown = `### The run

- **Date:** 1970-01-01 00:01 UTC
- **Machine:** a machine, load 0.5 at the start; a machine, load 1.0 at the end. The nodes, the
  stores and the load generator share it, and so did other busy work.
- **Command:** ` + "`" + `./scripts/bench-faults.sh -o docs/faults.md` + "`" + ` (took 1m30s)
- **Scale:** 1 (of the fault durations and the phases around them)
- **Fleet:** 3 nodes, ` + "`" + `sync_rate 100ms` + "`" + ` (periodic) or ` + "`" + `sync_rate 0` + "`" + ` (synchronous)
- **Load:** 600 requests per second: 330 to ` + "`" + `/count` + "`" + ` (5 new keys a second), 150 to ` + "`" + `/limit` + "`" + ` (50 per
  second on one key), 60 to ` + "`" + `/conc` + "`" + ` (` + "`" + `max_concurrent 5` + "`" + `, the upstream holding each 100ms), 60 to
  ` + "`" + `/rate` + "`" + ` (` + "`" + `rate 1/1h burst 100` + "`" + `, a new key per request; a periodic row, which refuses a rate, sends
  them to ` + "`" + `/count` + "`" + `); ` + "`" + `/ban` + "`" + ` limits 5 per minute with ` + "`" + `ban 10m0s` + "`" + `; ` + "`" + `read_timeout` + "`" + ` 1s
- **Plugin:** the working tree at commit abc1234
- **Go:** go1.26
- Redis: Redis server v=7.0.15

Faults run:

- ` + "`" + `redis-pause` + "`" + `: Redis paused 10 s (SIGSTOP, SIGCONT)

### Counts, errors and latency

| fault | mode | hits admitted / in store | lost | counted twice | 5xx | no answer | latency during: p50 / p99 / max (ms) | ≥ 900 ms | admitted / limit, worst second: during / after |
|---|---|--:|--:|--:|--:|--:|--:|--:|--:|
| Redis paused 10 s (SIGSTOP, SIGCONT) | sync_rate 100ms | 8192 / 8192 | 0 | 0 | 0 | 0 | 1 / 3 / 7 | 0.00 % | 3.00 / 1.20 |

### Recovery after the store serves again

| fault | mode | syncing again (worst node) | max_concurrent: first admitted / most in flight at an admission, from every node syncing again | ban on every node | failure log lines / min (worst node); stderr lines | goroutines before → after (per node) | store connections before → after | promises held |
|---|---|--:|--:|--:|--:|--:|--:|--:|
| Redis paused 10 s (SIGSTOP, SIGCONT) | sync_rate 100ms | 0.70 s | 0.00 s / 2 from +0.70 s (before: 0) | 0.05 s | 7.5; 0 | 26 → 25 | 7 → 11 | ✅ 9 of 9 |

Rows that could not run:

- a row: an error

### Promises

| promise | rows checked | held |
|---|--:|--:|
| 0 hits lost | 1 | ✅ 1 |
| 0 counted twice | 1 | ✅ 1 |
| the store's counts can be read through a node | 1 | ✅ 1 |
| 0 responses 5xx | 1 | ✅ 1 |
| every node syncs again ≤ 5 s after the store serves | 1 | ✅ 1 |
| a ban set off during the fault on every node ≤ 5 s after the store serves | 1 | ✅ 1 |
| a ban set off before the fault still held on every node | 1 | ✅ 1 |
| max_concurrent: first request admitted ≤ 3 s after the store serves | 1 | ✅ 1 |
| max_concurrent: once every node syncs again, every request is admitted with ≤ 5 of its key in flight, itself included | 1 | ✅ 1 |

### Promises that did not hold

None.

### Notes

- **Redis paused 10 s (SIGSTOP, SIGCONT), sync_rate 100ms:**
  - syncing again per node: node1 0.70 s.
  - node1 logged at error: ` + "`" + `store unreachable` + "`" + `: ` + "`" + `redis store: i/o timeout` + "`" + `
`

// TestWriteDoc writes the results between a page's markers, the prose
// around them untouched: a template error would end a run of many
// minutes.
func TestWriteDoc(t *testing.T) {
	path := filepath.Join(t.TempDir(), "faults.md")
	page := "# Faults\n\n" + docgen.Begin(DocCommand) + "\nold\n" + docgen.End(DocCommand) + "\n\n## After\n"
	if err := os.WriteFile(path, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	r := report()
	if err := r.WriteDoc(path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	md, _ := r.Markdown()
	want := "# Faults\n\n" + docgen.Begin(DocCommand) + "\n\n" + strings.TrimRight(md, "\n") + "\n\n" + docgen.End(DocCommand) + "\n\n## After\n"
	if string(b) != want {
		t.Errorf("the page is\n%s\nwant\n%s", b, want)
	}
	for _, want := range []string{
		"most in flight at an admission, from every node syncing again",
		"2 from +0.70 s (before: 0)", "every request is admitted with ≤ 5 of its key in flight, itself included",
		"a row: an error",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("faults.md lacks %q", want)
		}
	}
}
