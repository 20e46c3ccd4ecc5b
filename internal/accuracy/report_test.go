package accuracy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/benchhttp"
)

// outcomes are made-up results of the must-show rows.
func outcomes() []Outcome {
	ms100 := 100 * time.Millisecond
	ref := Outcome{Row: Row{Pattern: Steady2x, Store: "redis"}, Nodes: 3, Limit: 200, TargetRate: 400, SentRate: 400,
		Worst: 1, WorstAdmitted: 200, Holds: true, Claim: Claim{Exact: true, Allowance: 2}, Ops: 4800, OpsRequests: 1200,
		LimitedP50: 2 * time.Millisecond, BareP50: time.Millisecond}
	off := Outcome{Row: Row{Pattern: Steady2x, Store: "redis", SyncRate: ms100}, Nodes: 3, Limit: 200, TargetRate: 400, SentRate: 399,
		Worst: 1.14, WorstAdmitted: 228, Claim: Claim{Allowance: 80.0 / 3, Others: 80.0 / 3},
		Breach: Breach{Key: 0, Admitted: 228, Allowed: 226.7}, Ops: 480, OpsRequests: 1200}
	above := Outcome{Row: Row{Pattern: Steady2x, Store: "redis", SyncRate: ms100, SyncAbove: 0.8}, Nodes: 3, Limit: 200,
		TargetRate: 400, SentRate: 400, Worst: 1, WorstAdmitted: 200, Holds: true,
		Claim: Claim{Exact: true, Allowance: 2, Others: 80.0 / 3}, Ops: 720, OpsRequests: 1200}
	return []Outcome{ref, off, above}
}

func TestWriteTables(t *testing.T) {
	var b strings.Builder
	WriteTables(&b, outcomes(), nil)
	out := b.String()
	for _, want := range []string{
		"| steady 2× | 200 | 0 | off | 400 (400) | 1.000 (200) | 1 (exact) | yes | – | 4000 | 1.0 / 0.0 |",
		"| steady 2× | 200 | 100ms | off | 399 (400) | 1.140 (228) | 1.133 | **no** | 1.05 | 400 |",
		"| steady 2× | 200 | 100ms | 0.8 | 400 (400) | 1.000 (200) | 1 (exact) | yes | 0.00 | 600 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks\n%s\nin\n%s", want, out)
		}
	}
	lines := MustShow(outcomes(), "redis")
	if len(lines) != 2 || !strings.Contains(lines[0], "15.0 %") || !strings.Contains(lines[1], "0 of 1; of those whose traffic can exceed it, 0 of 1") {
		t.Errorf("MustShow = %q", lines)
	}
}

// report is a made-up run of the must-show rows, the periodic one with a
// plotted series and an admission the design does not explain.
func report() Report {
	out := outcomes()
	out[1].Series = []Point{{T: 10 * time.Millisecond, Admitted: 1}, {T: 500 * time.Millisecond, Admitted: 228}}
	out[1].LagChecked = 28
	out[1].Unexplained = []Unexplained{{AtMs: 512, Node: 1, Key: 0, Before: 204, Unseen: 3}}
	out[2].LagChecked = 0
	return Report{Date: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC), Machine: "a machine, 2 cores",
		Command: "OUT=docs/accuracy.md ./scripts/bench-accuracy.sh", Source: "the working tree at commit abc1234",
		Go: "go1.26", Versions: []string{"Redis: Redis server v=7.0.15"}, Nodes: 3, Limit: 200,
		Duration: 3 * time.Second, Elapsed: time.Minute, Outcomes: out}
}

// TestMarkdown checks the part of docs/accuracy.md the harness prints and
// writes, given its rows.
func TestMarkdown(t *testing.T) {
	got, err := report().Markdown()
	if err != nil {
		t.Fatal(err)
	}
	want := `### The run

- **Date:** 2026-11-23 12:00 UTC
- **Machine:** a machine, 2 cores. The nodes, the store and the load generator share it.
- **Command:** ` + "`OUT=docs/accuracy.md ./scripts/bench-accuracy.sh`" + ` (took 1m0s)
- **Settings:** 3 nodes; a limit of 200 per 1s window; 3s of traffic per row; one bare request for
  every 2 limited ones; a fetch counts as back 2ms after it starts
- **Plugin:** the working tree at commit abc1234
- **Go:** go1.26
- Redis: Redis server v=7.0.15

### The promise, checked

- redis: 3 nodes, sync_rate 100ms, sync_above 0.8, steady 2×: admitted / limit 1.000 (must be ≤
  1.01), 600 commands per 1,000 requests = 15.0 % of sync_rate 0's 4000 (must be ≤ 25 %)
- redis: periodic rows without sync_above within (N−1)·rate·interval: 0 of 1; of those whose traffic
  can exceed it, 0 of 1

### Overshoot, in intervals

Rows without ` + "`sync_above`" + ` whose traffic can show it, per ` + "`sync_rate`" + `:

- redis: 100ms: 1.05–1.05 (1 row)

### Admissions past the limit, against the design

- redis: 28 admissions past the limit in 2 periodic rows, 1 of them unexplained, in:
  - steady 2×, sync_rate 100ms, sync_above off: 1 (key 1 at 512ms@node2: 204 admitted before it, 3
    of them unseen)

### sync_above against its condition

A cell says "promised" when the other nodes' hits of the hottest key within one interval stay under
(1 − ` + "`sync_above`" + `) × limit.

| store | pattern | limit | sync_rate | others' hits per interval | worst, off | worst, 0.9 (exact if others < 0.1 × limit) | worst, 0.8 (exact if others < 0.2 × limit) |
|---|---|--:|--:|--:|--:|--:|--:|
| redis | steady 2× | 200 | 100ms | 26.7 | 1.140 | – | 1.000 (promised) |

### Every row

**redis**: 3 nodes; ops/1k = store operations per 1,000 requests

| pattern | limit | sync_rate | sync_above | req/s sent (target) | admitted / limit, worst window | bound | kept | overshoot, in intervals | ops/1k | added latency p50 / p99 (ms) |
|---|--:|--:|--:|--:|--:|--:|:-:|--:|--:|--:|
| steady 2× | 200 | 0 | off | 400 (400) | 1.000 (200) | 1 (exact) | yes | – | 4000 | 1.0 / 0.0 |
| steady 2× | 200 | 100ms | off | 399 (400) | 1.140 (228) | 1.133 | **no** | 1.05 | 400 | 0.0 / 0.0 |
| steady 2× | 200 | 100ms | 0.8 | 400 (400) | 1.000 (200) | 1 (exact) | yes | 0.00 | 600 | 0.0 / 0.0 |

### Plots

![Redis, steady 2×: sync_above at sync_rate 100ms](accuracy-redis-steady2x.svg)

![Redis, steady 2×: sync_rate, without sync_above](accuracy-redis-steady2x-rates.svg)

`
	if got != want {
		t.Errorf("Markdown() =\n%s\nwant\n%s", got, want)
	}
}

// TestWriteDoc checks that the results go between the page's markers,
// the prose around them untouched, and the plots next to the page.
func TestWriteDoc(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "accuracy.md")
	prose := "# Accuracy\n\nWhat is measured.\n\n"
	after := "\n\n## How to run\n"
	stale := prose + "<!-- generated by ./scripts/bench-accuracy.sh: begin -->\nold\n<!-- generated by ./scripts/bench-accuracy.sh: end -->" + after
	if err := os.WriteFile(path, []byte(stale), 0o644); err != nil {
		t.Fatal(err)
	}
	r := report()
	if err := r.WriteDoc(path); err != nil {
		t.Fatal(err)
	}
	md, _ := r.Markdown()
	want := prose + "<!-- generated by ./scripts/bench-accuracy.sh: begin -->\n\n" + strings.TrimRight(md, "\n") +
		"\n\n<!-- generated by ./scripts/bench-accuracy.sh: end -->" + after
	if doc := readFile(t, path); doc != want {
		t.Errorf("the page is\n%s\nwant\n%s", doc, want)
	}
	if svg := readFile(t, filepath.Join(dir, "accuracy-redis-steady2x.svg")); !strings.Contains(svg, "100ms, sync_above off") {
		t.Error("the plot lacks its series")
	}
	if err := r.WriteDoc(filepath.Join(dir, "no-markers.md")); err == nil {
		t.Error("WriteDoc wrote a page that does not exist")
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCommandsRan lists the calls each command gained, most first, without
// the harness's INFO or a command that ran nothing.
func TestCommandsRan(t *testing.T) {
	before := benchhttp.CommandStats{"evalsha": 10, "get": 2, "info": 5, "time": 1}
	after := benchhttp.CommandStats{"evalsha": 62, "get": 5, "info": 9, "time": 1, "set": 3}
	if got, want := commandsRan(before, after), "evalsha 52, get 3, set 3"; got != want {
		t.Errorf("commandsRan = %q, want %q", got, want)
	}
}
