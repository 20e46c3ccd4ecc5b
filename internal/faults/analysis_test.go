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

func TestMaxInFlight(t *testing.T) {
	u := &Upstream{}
	t0 := time.Unix(100, 0)
	s := func(key string, a, b int) span {
		return span{key, t0.Add(time.Duration(a) * time.Millisecond), t0.Add(time.Duration(b) * time.Millisecond)}
	}
	u.ran = []span{s("k", 0, 100), s("k", 50, 150), s("k", 100, 200), s("other", 60, 70), s("k", 120, 130)}
	if got := u.MaxInFlight("k", t0, t0.Add(time.Second)); got != 3 {
		t.Errorf("MaxInFlight = %d, want 3 (at 120 ms)", got)
	}
	if got := u.MaxInFlight("k", t0.Add(100*time.Millisecond), t0.Add(time.Second)); got != 2 {
		t.Errorf("MaxInFlight from 100 ms = %d, want 2", got)
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
