package benchhttp

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{0.9, 0.7, 0.8, 0.95, 0.1}, 0.8},
	} {
		in := slices.Clone(tc.xs)
		if got := Median(tc.xs); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", in, got, tc.want)
		}
		if !slices.Equal(in, tc.xs) {
			t.Errorf("Median reordered its input: %v, was %v", tc.xs, in)
		}
	}
}

// run is a Run of rps requests per second over one second, with Caddy
// using 10 ms of CPU.
func run(rps int64) Run {
	return Run{WrkResult: WrkResult{Requests: rps, DurationUS: 1e6}, CaddyCPU: 10 * time.Millisecond}
}

func TestSummarize(t *testing.T) {
	pairs := []Pair{
		{run(1000), run(900)},  // 0.9
		{run(800), run(400)},   // 0.5: a disturbed pair
		{run(1000), run(950)},  // 0.95
		{run(1200), run(1020)}, // 0.85
		{run(1000), run(880)},  // 0.88
	}
	s := Summarize(pairs)
	near := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	near("Ratio", s.Ratio, 0.88)
	near("Min", s.Min, 0.5)
	near("Max", s.Max, 0.95)
	near("BareRPS", s.BareRPS, 1000)
	near("LimitedRPS", s.LimitedRPS, 900)
	// 10 ms over 1000 requests is 10 µs per request; over 900, 11.1 µs.
	near("BareCPU", s.BareCPU, 10)
	near("LimitedCPU", s.LimitedCPU, 1e4/900)
	near("AddedCPU", s.AddedCPU, 1e4/880-10)
	if s.Pairs != 5 || s.BareRequests != 5000 || s.LimitedRequests != 4150 {
		t.Errorf("Summarize = %+v", s)
	}
	if (Summarize(nil) != Summary{}) {
		t.Errorf("Summarize(nil) = %+v", Summarize(nil))
	}
}

func TestRatioUsesDurations(t *testing.T) {
	// 3000 requests in 3 s against 2000 in 1 s: 1000 vs 2000 req/s.
	p := Pair{Bare: Run{WrkResult: WrkResult{Requests: 2000, DurationUS: 1e6}}, Limited: Run{WrkResult: WrkResult{Requests: 3000, DurationUS: 3e6}}}
	if got := p.Ratio(); got != 0.5 {
		t.Errorf("Ratio = %v, want 0.5", got)
	}
	if got := (Pair{}).Ratio(); got != 0 {
		t.Errorf("Ratio of empty runs = %v, want 0", got)
	}
}

func TestParseWrk(t *testing.T) {
	out := `Running 3s test @ http://127.0.0.1:40000/bare
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   786.47us  312.90us   9.81ms   87.15%
    Req/Sec    41.20k     1.32k   43.50k    70.00%
  123000 requests in 3.00s, 14.31MB read
Requests/sec:  40993.20
Transfer/sec:      4.77MB
WRK_RESULT requests=123000 duration_us=3000500 connect=0 read=1 write=0 status=2 timeout=3
`
	r, err := ParseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := WrkResult{Requests: 123000, DurationUS: 3000500, Read: 1, Status: 2, Timeout: 3}
	if r != want {
		t.Errorf("ParseWrk = %+v, want %+v", r, want)
	}
	if got := r.ReqPerSec(); math.Abs(got-123000/3.0005) > 1e-6 {
		t.Errorf("ReqPerSec = %v", got)
	}
	if r.Errors() != 6 {
		t.Errorf("Errors = %d, want 6", r.Errors())
	}

	for _, bad := range []string{
		"Requests/sec: 1000\n",
		"WRK_RESULT requests=1 duration_us=1\n",
		"WRK_RESULT requests=x duration_us=1 connect=0 read=0 write=0 status=0 timeout=0\n",
		"WRK_RESULT requests=1 duration_us=0 connect=0 read=0 write=0 status=0 timeout=0\n",
		"WRK_RESULT requests=1 duration_us=1 connect=0 read=0 write=0 status=0 timeout=0 bogus=1\n",
	} {
		if _, err := ParseWrk(bad); err == nil {
			t.Errorf("ParseWrk(%q) succeeded", bad)
		}
	}
}

func TestCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=1000,usec=15000,usec_per_call=15.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_mget:calls=20,usec=100,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=10,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=1,usec=10,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n"
	s, err := ParseCommandStats(info)
	if err != nil {
		t.Fatal(err)
	}
	if s["evalsha"] != 1000 || s["mget"] != 20 || s["config|resetstat"] != 1 {
		t.Errorf("ParseCommandStats = %v", s)
	}
	if got := s.Total(); got != 1020 {
		t.Errorf("Total = %d, want 1020 (without INFO and CONFIG)", got)
	}

	sum := CommandStats{}
	sum.Add(s)
	sum.Add(s)
	if got := sum.Total(); got != 2040 {
		t.Errorf("Total after two Adds = %d, want 2040", got)
	}
	if _, ok := sum["info"]; ok {
		t.Errorf("Add kept the harness's INFO: %v", sum)
	}
	if got := sum.Names(); !slices.Equal(got, []string{"evalsha", "mget"}) {
		t.Errorf("Names = %v", got)
	}
	if got := PerThousand(sum.Total(), 2000); got != 1020 {
		t.Errorf("PerThousand = %v, want 1020", got)
	}
	if got := PerThousand(5, 0); got != 0 {
		t.Errorf("PerThousand of no requests = %v", got)
	}

	for _, bad := range []string{"cmdstat_get\r\n", "cmdstat_get:usec=1\r\n", "cmdstat_get:calls=x\r\n"} {
		if _, err := ParseCommandStats(bad); err == nil {
			t.Errorf("ParseCommandStats(%q) succeeded", bad)
		}
	}
}

func TestParseMonitorLine(t *testing.T) {
	for _, tc := range []struct {
		line     string
		cmd      string
		inScript bool
		ok       bool
	}{
		{`+1795447920.767425 [0 127.0.0.1:43922] "EVALSHA" "9c1f" "1" "k"` + "\r\n", "evalsha", false, true},
		{`1795447920.767506 [0 lua] "set" "k" "a b\n"`, "set", true, true},
		{`1795447920.773708 [3 unix:/tmp/redis.sock] "mget" "k" "x"`, "mget", false, true},
		{"+OK\r\n", "", false, false},
		{`1795447920.7 [0 lua]`, "", false, false},
		{`1795447920.7 [0 lua] ""`, "", false, false},
	} {
		cmd, inScript, ok := ParseMonitorLine(tc.line)
		if cmd != tc.cmd || inScript != tc.inScript || ok != tc.ok {
			t.Errorf("ParseMonitorLine(%q) = %q, %v, %v; want %q, %v, %v", tc.line, cmd, inScript, ok, tc.cmd, tc.inScript, tc.ok)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	// A name with spaces and parentheses; utime 150 and stime 50 ticks.
	stat := "4242 (caddy (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 50 0 0 20 0 9 0 100 1000000 2000 18446744073709551615\n"
	got, err := ParseProcStat(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * time.Second; got != want {
		t.Errorf("ParseProcStat = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 0"} {
		if _, err := ParseProcStat(bad); err == nil {
			t.Errorf("ParseProcStat(%q) succeeded", bad)
		}
	}
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:0.408670\r\nused_cpu_user:1.542960\r\nused_cpu_sys_children:0.000000\r\n" +
		"used_cpu_user_children:0.000000\r\nused_cpu_sys_main_thread:0.408650\r\n"
	got, err := ParseRedisCPU(info)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1951630 * time.Microsecond; got != want {
		t.Fatalf("ParseRedisCPU = %v, want %v", got, want)
	}
	if _, err := ParseRedisCPU("# CPU\r\nused_cpu_sys:0.1\r\n"); err == nil {
		t.Fatal("INFO cpu without used_cpu_user parsed")
	}
	if _, err := ParseRedisCPU("used_cpu_sys:x\r\nused_cpu_user:1\r\n"); err == nil {
		t.Fatal("a CPU time that is no number parsed")
	}
}

// TestWriteMarkdown checks the part of docs/performance.md the harness
// prints and writes, given its cases.
func TestWriteMarkdown(t *testing.T) {
	var b strings.Builder
	WriteMarkdown(&b, RunInfo{Date: "2026-11-27 00:00 UTC", Command: "./scripts/bench-http.sh", Machine: "nproc 2, a CPU"},
		[]CaseRow{
			{Label: "local, one key", Summary: Summary{Ratio: 0.9111, Min: 0.783, Max: 0.997, BareRPS: 45708.4, LimitedRPS: 41554,
				BareCPU: 25.1, LimitedCPU: 28.2, AddedCPU: 3.8}},
			{Label: "synchronous, one key, Redis", Summary: Summary{Ratio: 0.621, Min: 0.556, Max: 0.694, BareRPS: 51332, LimitedRPS: 33527,
				BareCPU: 20.4, LimitedCPU: 31.8, AddedCPU: 12.3}, Redis: true, RanPer1k: 585.4, SentPer1k: 114, RedisCPU: 7.8},
			{Label: "control", Summary: Summary{Ratio: 1.01, Min: 0.9, Max: 1.1, BareRPS: 10, LimitedRPS: 10, AddedCPU: -0.25}},
		})
	want := `### The run

- **Date:** 2026-11-27 00:00 UTC
- **Command:** ./scripts/bench-http.sh
- **Machine:** nproc 2, a CPU

### Each case against bare Caddy

| case | ratio | min–max | bare req/s | limited req/s | Caddy CPU µs/req: bare | limited | added |
|---|--:|--:|--:|--:|--:|--:|--:|
| local, one key | 0.911 | 0.783–0.997 | 45708 | 41554 | 25.1 | 28.2 | +3.8 |
| synchronous, one key, Redis | 0.621 | 0.556–0.694 | 51332 | 33527 | 20.4 | 31.8 | +12.3 |
| control | 1.010 | 0.900–1.100 | 10 | 10 | 0.0 | 0.0 | -0.2 |

### Redis, per request

| case | commands Redis ran / 1,000 requests | commands Caddy sent / 1,000 requests | Redis CPU µs/req |
|---|--:|--:|--:|
| synchronous, one key, Redis | 585.4 | 114.0 | 7.8 |
`
	if got := b.String(); got != want {
		t.Errorf("WriteMarkdown =\n%s\nwant\n%s", got, want)
	}
	// Without a Redis case, no Redis table.
	b.Reset()
	WriteMarkdown(&b, RunInfo{}, []CaseRow{{Label: "local"}})
	if strings.Contains(b.String(), "Redis") || strings.Contains(b.String(), "**") {
		t.Errorf("WriteMarkdown without Redis cases or run info =\n%s", b.String())
	}
}
