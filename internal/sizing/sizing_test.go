package sizing

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/benchhttp"
	"github.com/ratesync/caddy-ratelimit/internal/docgen"
)

func near(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > tol {
		t.Errorf("%s = %g, want %g ± %g", what, got, want, tol)
	}
}

func TestDistinct(t *testing.T) {
	near(t, "Distinct(0, 100)", Distinct(0, 100), 0, 0)
	near(t, "Distinct(1, 1e6)", Distinct(1, 1e6), 1, 1e-6)
	near(t, "Distinct(1000, 1000)", Distinct(1000, 1000), 1000*(1-math.Exp(-1)), 1e-9)
	near(t, "Distinct(1e9, 10)", Distinct(1e9, 10), 10, 1e-9)
}

func TestPeriodicWork(t *testing.T) {
	// Few hits over many keys: each hit is a diff of its own.
	d, f := periodicWork(100, 1e9, 100*time.Millisecond)
	near(t, "diffs", d, 10, 1e-3)
	near(t, "fetched", f, 20, 1e-3)
	// One key hit often: one diff a run, as runs aligned to multiples
	// of 100 ms or 1 s never span a window's start; runs of 300 ms do,
	// two in ten (0.9 to 1.2 s, 1.8 to 2.1 s), and then have two.
	d, _ = periodicWork(1000, 1, 100*time.Millisecond)
	near(t, "diffs of one key at 100ms", d, 1, 1e-9)
	d, _ = periodicWork(1000, 1, time.Second)
	near(t, "diffs of one key at 1s", d, 1, 1e-9)
	d, _ = periodicWork(1000, 1, 300*time.Millisecond)
	near(t, "diffs of one key at 300ms", d, 1.2, 0.01)
}

func TestPredictRedis(t *testing.T) {
	c := Constants{CPUPerCommand: 10, TripLatency: 0, ConnsPeriodic: 2, ConnsOverlap: 3, BytesPerCounter: 100}
	// Synchronous, no batching: EVALSHA, marker, MGET and one write a hit
	// that is its key's first in a window, as all are among 10⁶ keys.
	p := Predict(Row{Store: "redis", Nodes: 2, Keys: 1e6, Rate: 500}, c, 10*time.Second)
	near(t, "sync commands", p.Commands, 2000, 1)
	near(t, "sync trips", p.Trips, 500, 1e-9)
	near(t, "sync CPU %", p.CPU, 2, 1e-3) // 2,000 × 10 µs = 20 ms a second
	near(t, "sync conns", p.Conns, 2, 0)  // a round trip that takes no time never overlaps
	near(t, "sync markers", p.Markers, 5000, 1e-6)
	// Periodic, 1 node, 1 s, 1,000 keys at 1,000 req/s: about 632 diffs,
	// 3 commands a script run, and the fetch's MGETs (measured: 645).
	p = Predict(Row{Store: "redis", Nodes: 1, Keys: 1000, Rate: 1000, SyncRate: time.Second}, c, 10*time.Second)
	d, f := periodicWork(1000, 1000, time.Second)
	want := d + 3*math.Ceil(d/256) + math.Ceil(f/256)
	near(t, "periodic commands", p.Commands, want, 1e-9)
	near(t, "periodic commands", p.Commands, 632+9+4, 1)
	// Batching: at 1,000 hits a second and 250 µs a trip, 800 trips.
	c.TripLatency = 250
	p = Predict(Row{Store: "redis", Nodes: 1, Keys: 1e9, Rate: 1000}, c, 10*time.Second)
	near(t, "batched trips", p.Trips, 800, 1e-6)
	// EVALSHA and marker a trip, a write a hit, an MGET a first hit.
	near(t, "batched commands", p.Commands, 2*800+1000+1000, 0.01)
}

func TestPredictPostgres(t *testing.T) {
	// Periodic: a push and a fetch a run, each a transaction.
	p := Predict(Row{Store: "postgres", Nodes: 3, Keys: 1000, Rate: 1000, SyncRate: 100 * time.Millisecond}, Constants{}, time.Minute)
	near(t, "periodic transactions", p.Commands, 60, 0.01)
	// Synchronous: a transaction a trip.
	p = Predict(Row{Store: "postgres", Nodes: 3, Keys: 1000, Rate: 300}, Constants{}, time.Minute)
	near(t, "sync transactions", p.Commands, 300, 1e-9)
}

func TestFitNonNeg(t *testing.T) {
	x := [][]float64{{1, 0, 5}, {2, 1, 5}, {3, 5, 1}, {10, 2, 0}, {4, 4, 4}}
	var y []float64
	for _, r := range x {
		y = append(y, 3*r[0]+0.5*r[1]+7*r[2])
	}
	k, ok := FitNonNeg(x, y)
	if !ok {
		t.Fatal("no fit")
	}
	near(t, "k0", k[0], 3, 1e-9)
	near(t, "k1", k[1], 0.5, 1e-9)
	near(t, "k2", k[2], 7, 1e-9)
	// A coefficient that would be negative is 0 instead.
	y = []float64{10, 20, 30}
	k, ok = FitNonNeg([][]float64{{1, 1}, {2, 3}, {3, 5}}, y)
	if !ok || k[0] < 0 || k[1] < 0 {
		t.Fatalf("FitNonNeg = %v, %v, want non-negative", k, ok)
	}
	if _, ok := FitNonNeg(nil, nil); ok {
		t.Error("an empty fit succeeded")
	}
}

func TestFit(t *testing.T) {
	truth := Constants{CPUPerCommand: 8, CPUPerTrip: 20, CPUPerBeat: 300, CPUIdle: 0.3, CPUPerConn: 0.05, BytesPerCounter: 90, BytesPerMarker: 150, BytesPerConn: 20000,
		TripLatency: 200, ConnsPeriodic: 1}
	var rows []Measured
	for _, row := range QuickPlan([]string{"redis"}, 1000) {
		p := Predict(row, truth, 14*time.Second)
		rows = append(rows, Measured{Row: row, Commands: p.Commands, Trips: p.Trips, CPU: p.CPU,
			Memory: p.Memory, Conns: int(math.Round(p.Conns)), Elapsed: 14 * time.Second})
	}
	got := Fit(rows, Constants{})
	near(t, "TripLatency", got.TripLatency, 200, 1e-6)
	near(t, "CPUPerCommand", got.CPUPerCommand, 8, 1e-6)
	near(t, "CPUPerTrip", got.CPUPerTrip, 20, 1e-6)
	near(t, "CPUPerBeat", got.CPUPerBeat, 300, 1e-6)
	near(t, "CPUIdle", got.CPUIdle, 0.3, 1e-6)
	near(t, "BytesPerCounter", got.BytesPerCounter, 90, 1e-3)
	near(t, "BytesPerMarker", got.BytesPerMarker, 150, 1e-3)
	near(t, "ConnsOverlap", got.ConnsOverlap, 0, 0)
}

// TestFitOverlap checks that the synchronous rows' connections give back
// the ConnsOverlap that made them: fleets of a thousand nodes, so that
// whole connections round off little.
func TestFitOverlap(t *testing.T) {
	truth := Constants{TripLatency: 300, ConnsOverlap: 0.8}
	var rows []Measured
	for _, rate := range []float64{2e5, 5e5, 1e6} {
		row := Row{Store: "postgres", Nodes: 1000, Keys: 1000, Rate: rate}
		p := Predict(row, truth, 14*time.Second)
		rows = append(rows, Measured{Row: row, Conns: int(math.Round(p.Conns)), Elapsed: 14 * time.Second})
	}
	near(t, "ConnsOverlap", fitOverlap(rows, truth), 0.8, 0.05)
}

func TestPlans(t *testing.T) {
	if n := len(FullPlan([]string{"redis", "postgres"}, 1000)); n != 54 {
		t.Errorf("the full grid has %d rows, want 54", n)
	}
	seen := map[string]bool{}
	for _, r := range QuickPlan([]string{"redis", "postgres"}, 1000) {
		if seen[r.ID()] {
			t.Errorf("row %s twice", r.ID())
		}
		seen[r.ID()] = true
		if r.Rate != min(float64(r.Keys), 1000) {
			t.Errorf("row %s: rate %g", r.ID(), r.Rate)
		}
	}
	for _, want := range []string{"redis-n10-k100000-sync1s", "redis-n1-k1000-sync0", "postgres-n3-k1000-sync100ms"} {
		if !seen[want] {
			t.Errorf("no row %s in the quick plan", want)
		}
	}
}

func TestSchedule(t *testing.T) {
	row := Row{Store: "redis", Nodes: 3, Keys: 10, Rate: 100}
	reqs := Schedule(row, 2*time.Second, 1)
	if len(reqs) != 200 {
		t.Fatalf("%d requests, want 200", len(reqs))
	}
	hits := make([]int, row.Keys)
	for i, r := range reqs {
		if r.Node != i%3 || r.At != time.Duration(i)*10*time.Millisecond {
			t.Fatalf("request %d: node %d at %v", i, r.Node, r.At)
		}
		hits[r.Key]++
	}
	for k, n := range hits {
		if n < 5 || n > 40 {
			t.Errorf("key %d hit %d times of 200, want about 20", k, n)
		}
	}
}

func TestParsing(t *testing.T) {
	info := "# Memory\r\nused_memory:123456\r\nused_memory_human:120.56K\r\n# Clients\r\nconnected_clients:7\r\n"
	if n, err := InfoInt(info, "used_memory"); err != nil || n != 123456 {
		t.Errorf("used_memory = %d, %v", n, err)
	}
	if n, err := InfoInt(info, "connected_clients"); err != nil || n != 7 {
		t.Errorf("connected_clients = %d, %v", n, err)
	}
	if _, err := InfoInt(info, "missing"); err == nil {
		t.Error("a missing field was found")
	}
	stat := "42 (postgres: x (y)) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 30 20 20 0 1 0 100 0 0"
	d, err := benchhttp.ParseProcStatTree(stat)
	if err != nil || d != 2500*time.Millisecond {
		t.Errorf("ParseProcStatTree = %v, %v, want 2.5s", d, err)
	}
	if _, err := benchhttp.ParseProcStatTree("42 (x) S 1"); err == nil {
		t.Error("a short stat parsed")
	}
}

func TestFormatting(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Thousands(0), "0"}, {Thousands(999.6), "1,000"}, {Thousands(1234567), "1,234,567"}, {Thousands(-4200), "−4,200"},
		{Percent(0.123), "+12 %"}, {Percent(-0.031), "−3 %"}, {Percent(0.001), "0 %"}, {Percent(math.Inf(1)), "—"},
		{Bytes(512 * 1024), "512 KiB"}, {Bytes(3 << 20), "3.0 MiB"}, {Bytes(50 << 20), "50 MiB"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if e := Error(0, 0); e != 0 {
		t.Errorf("Error(0, 0) = %g", e)
	}
	near(t, "Error(125, 100)", Error(125, 100), 0.25, 1e-12)
}

func TestMarkdown(t *testing.T) {
	row := Row{Store: "redis", Nodes: 3, Keys: 10000, SyncRate: time.Second, Rate: 1000}
	c := Constants{CPUPerCommand: 10, BytesPerCounter: 100, ConnsPeriodic: 1}
	p := Predict(row, c, 14*time.Second)
	rep := Report{
		Date: time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC), Machine: "a machine", Command: Command, Source: "the working tree",
		Versions: []string{"Redis: 7"}, Warmup: 4 * time.Second, Measure: 10 * time.Second, MaxRate: 1000, Elapsed: time.Minute,
		Rows:      []Measured{{Row: row, Sent: 1000, Commands: p.Commands * 1.1, Trips: p.Trips, CPU: p.CPU, Memory: p.Memory, Conns: 3}},
		Constants: map[string]Constants{"redis": c}, Titles: map[string]string{"redis": "Redis"},
	}
	md := rep.Markdown()
	for _, want := range []string{"| Redis | 3 | 10,000 | 1s | 1,000 |", "−9 %", "Worst error over the rows: commands −9 %", "1,000 requests a second"} {
		if !strings.Contains(md, want) {
			t.Errorf("the Markdown lacks %q:\n%s", want, md)
		}
	}
	for line := range strings.Lines(md) {
		if !strings.HasPrefix(line, "|") && len([]rune(strings.TrimRight(line, "\n"))) > docgen.Width {
			t.Errorf("a line over %d characters: %q", docgen.Width, line)
		}
	}
	page := "# Ops\n\n" + docgen.Begin(Command) + "\nOLDTEXT\n" + docgen.End(Command) + "\n"
	out, err := docgen.Replace(page, Command, md)
	if err != nil || strings.Contains(out, "OLDTEXT") || !strings.Contains(out, "| Redis |") {
		t.Errorf("Replace: %v\n%s", err, out)
	}
}

func TestSaveLoad(t *testing.T) {
	var buf strings.Builder
	ms := []Measured{
		{Row: Row{Store: "redis", Nodes: 3, Keys: 1000, SyncRate: time.Second, Rate: 1000}, Commands: 812.5, Conns: 6, Elapsed: 14 * time.Second},
		{Row: Row{Store: "postgres", Nodes: 1, Keys: 100000, Rate: 1000}, Commands: 990, Rows: 2000, Memory: 1 << 20},
	}
	for _, m := range ms {
		if err := json.NewEncoder(&buf).Encode(m); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Load(strings.NewReader(buf.String()))
	if err != nil || len(got) != 2 || got[0] != ms[0] || got[1] != ms[1] {
		t.Errorf("Load = %+v, %v, want %+v", got, err, ms)
	}
	if _, err := Load(strings.NewReader("{")); err == nil {
		t.Error("a cut line loaded")
	}
}

// TestSavedRows checks the formula against the rows the page shows,
// saved in testdata: Redis's commands within 10 % on every row, and
// PostgreSQL's within 25 % or 5 transactions a second (what the purge and
// autovacuum add now and then, a large share of the few a periodic
// fleet's runs make).
func TestSavedRows(t *testing.T) {
	f, err := os.Open("testdata/rows-2026-11-29.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 54 {
		t.Fatalf("%d rows saved, want the grid's 54", len(rows))
	}
	rep := Report{Rows: rows, Constants: map[string]Constants{}}
	for _, store := range []string{"redis", "postgres"} {
		var mine []Measured
		for _, m := range rows {
			if m.Row.Store == store {
				mine = append(mine, m)
			}
		}
		rep.Constants[store] = Fit(mine, Constants{})
	}
	for _, m := range rows {
		p, e := rep.RowErrors(m)
		bound := 0.10
		if m.Row.Store == "postgres" {
			if math.Abs(p.Commands-m.Commands) <= 5 {
				continue
			}
			bound = 0.25
		}
		if math.Abs(e.Commands) > bound {
			t.Errorf("%s: commands %.0f, predicted off by %s", m.Row.ID(), m.Commands, Percent(e.Commands))
		}
	}
}
