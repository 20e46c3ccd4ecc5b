package accuracy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/machine"
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

func TestWriteDoc(t *testing.T) {
	dir := t.TempDir()
	out := outcomes()
	out[1].Series = []Point{{T: 10 * time.Millisecond, Admitted: 1}, {T: 500 * time.Millisecond, Admitted: 228}}
	r := Report{Date: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC), Machine: machine.Describe(), Command: "./scripts/bench-accuracy.sh",
		Go: "go1.26", Nodes: 3, Limit: 200, Duration: 3 * time.Second, Elapsed: time.Minute, Outcomes: out}
	path := filepath.Join(dir, "accuracy.md")
	if err := r.WriteDoc(path); err != nil {
		t.Fatal(err)
	}
	doc := readFile(t, path)
	for _, want := range []string{"2026-11-23 12:00 UTC", "![Redis, steady 2×: sync_above at sync_rate 100ms](accuracy-redis-steady2x.svg)",
		"| redis | steady 2× | 200 | 100ms | 26.7 | 1.140 |", "100ms: 1.05–1.05 (1 rows)"} {
		if !strings.Contains(doc, want) {
			t.Errorf("the doc lacks %q", want)
		}
	}
	if svg := readFile(t, filepath.Join(dir, "accuracy-redis-steady2x.svg")); !strings.Contains(svg, "100ms, sync_above off") {
		t.Error("the plot lacks its series")
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
