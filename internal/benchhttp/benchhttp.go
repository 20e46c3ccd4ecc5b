// Package benchhttp holds the arithmetic and parsing of the HTTP benchmark
// harness (cmd/bench-http, run by scripts/bench-http.sh): reading wrk's
// results and Redis's INFO commandstats, and summing up pairs of runs. It
// does no I/O, so it is tested on its own.
package benchhttp

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WrkResult is what one wrk run reports through the harness's Lua done()
// hook, which prints one line:
//
//	WRK_RESULT requests=N duration_us=N connect=N read=N write=N status=N timeout=N
//
// A machine-readable line spares parsing wrk's human output, whose units
// (k, M, ms, s) change with the magnitudes.
type WrkResult struct {
	Requests   int64 // responses received
	DurationUS int64 // the run's length, in microseconds
	// Errors: socket errors by kind, and Status, the responses that were
	// not 2xx or 3xx (a rejection by the limiter would be one).
	Connect, Read, Write, Status, Timeout int64
}

// ReqPerSec is the run's throughput.
func (r WrkResult) ReqPerSec() float64 {
	if r.DurationUS <= 0 {
		return 0
	}
	return float64(r.Requests) / (float64(r.DurationUS) / 1e6)
}

// Errors is the number of failed requests of every kind.
func (r WrkResult) Errors() int64 {
	return r.Connect + r.Read + r.Write + r.Status + r.Timeout
}

// ParseWrk finds the WRK_RESULT line in wrk's output.
func ParseWrk(out string) (WrkResult, error) {
	for line := range strings.Lines(out) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "WRK_RESULT ")
		if !ok {
			continue
		}
		var r WrkResult
		fields := map[string]*int64{
			"requests": &r.Requests, "duration_us": &r.DurationUS,
			"connect": &r.Connect, "read": &r.Read, "write": &r.Write,
			"status": &r.Status, "timeout": &r.Timeout,
		}
		seen := 0
		for _, kv := range strings.Fields(rest) {
			k, v, ok := strings.Cut(kv, "=")
			dst := fields[k]
			if !ok || dst == nil {
				return WrkResult{}, fmt.Errorf("wrk result: unexpected field %q", kv)
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return WrkResult{}, fmt.Errorf("wrk result: field %q: %v", kv, err)
			}
			*dst = n
			seen++
		}
		if seen != len(fields) {
			return WrkResult{}, fmt.Errorf("wrk result: want %d fields, got %d in %q", len(fields), seen, rest)
		}
		if r.DurationUS <= 0 {
			return WrkResult{}, fmt.Errorf("wrk result: duration %dus", r.DurationUS)
		}
		return r, nil
	}
	return WrkResult{}, fmt.Errorf("no WRK_RESULT line in wrk's output:\n%s", out)
}

// Run is one wrk run against a route, and the CPU time Caddy used
// meanwhile.
type Run struct {
	WrkResult
	CaddyCPU time.Duration // 0 when unknown
}

// CPUPerRequest is Caddy's CPU time per request, in microseconds. Unlike
// requests per second, it hardly moves when other processes take CPU
// from the benchmark: they slow Caddy down, but do not make it work more.
func (r Run) CPUPerRequest() float64 {
	if r.Requests <= 0 {
		return 0
	}
	return float64(r.CaddyCPU.Microseconds()) / float64(r.Requests)
}

// Pair is a bare run and a limited run adjacent in time.
type Pair struct {
	Bare, Limited Run
}

// Ratio is the limited route's throughput over the bare route's: 1 means
// the limiter costs nothing, 0.5 that it halves the requests per second.
func (p Pair) Ratio() float64 {
	b := p.Bare.ReqPerSec()
	if b == 0 {
		return 0
	}
	return p.Limited.ReqPerSec() / b
}

// Summary sums up the pairs of one case.
type Summary struct {
	Pairs                         int
	Ratio, Min, Max               float64 // the median ratio, and the extremes
	BareRPS, LimitedRPS           float64 // median requests per second
	BareRequests, LimitedRequests int64   // requests served in all the pairs' runs

	// Caddy's CPU time per request, in microseconds: the medians on each
	// route, and the median over the pairs of what the limiter adds.
	BareCPU, LimitedCPU, AddedCPU float64
}

// Summarize computes the median and range of the pairs' ratios. Medians,
// not means: on a shared machine one run can be disturbed by another
// process, and a median ignores it.
func Summarize(pairs []Pair) Summary {
	s := Summary{Pairs: len(pairs)}
	if len(pairs) == 0 {
		return s
	}
	ratios := make([]float64, len(pairs))
	bare := make([]float64, len(pairs))
	limited := make([]float64, len(pairs))
	bareCPU := make([]float64, len(pairs))
	limitedCPU := make([]float64, len(pairs))
	added := make([]float64, len(pairs))
	for i, p := range pairs {
		ratios[i] = p.Ratio()
		bare[i] = p.Bare.ReqPerSec()
		limited[i] = p.Limited.ReqPerSec()
		bareCPU[i] = p.Bare.CPUPerRequest()
		limitedCPU[i] = p.Limited.CPUPerRequest()
		added[i] = limitedCPU[i] - bareCPU[i]
		s.BareRequests += p.Bare.Requests
		s.LimitedRequests += p.Limited.Requests
	}
	s.Ratio = Median(ratios)
	s.Min, s.Max = slices.Min(ratios), slices.Max(ratios)
	s.BareRPS = Median(bare)
	s.LimitedRPS = Median(limited)
	s.BareCPU = Median(bareCPU)
	s.LimitedCPU = Median(limitedCPU)
	s.AddedCPU = Median(added)
	return s
}

// Median returns the middle value, or the mean of the two middle values
// of an even count; 0 for none. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// CommandStats is the calls per command of Redis's INFO commandstats,
// keyed by the command's name as INFO prints it ("evalsha",
// "config|resetstat").
type CommandStats map[string]int64

// ParseCommandStats reads the cmdstat_* lines of INFO commandstats, such
// as "cmdstat_evalsha:calls=5,usec=80,usec_per_call=16.00,...".
func ParseCommandStats(info string) (CommandStats, error) {
	stats := CommandStats{}
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			return nil, fmt.Errorf("commandstats: no ':' in %q", line)
		}
		found := false
		for f := range strings.SplitSeq(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("commandstats: %q: %v", line, err)
				}
				stats[name] += n
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("commandstats: no calls= in %q", line)
		}
	}
	return stats, nil
}

// ParseRedisCPU reads the CPU time Redis has used, system and user, from
// INFO cpu ("used_cpu_sys:0.408670", "used_cpu_user:1.542960", in
// seconds), so that a run's share is the difference of two readings.
func ParseRedisCPU(info string) (time.Duration, error) {
	var total float64
	found := 0
	for line := range strings.Lines(info) {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %q: %v", line, err)
		}
		total += f
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu: used_cpu_sys and used_cpu_user not found")
	}
	return time.Duration(math.Round(total*1e6)) * time.Microsecond, nil // Redis prints microseconds
}

// harnessCommand reports the commands the harness itself sends to read
// the counts (CONFIG RESETSTAT, INFO), which are not the plugin's.
func harnessCommand(name string) bool {
	return name == "info" || name == "config" || strings.HasPrefix(name, "config|")
}

// Add adds other's calls to s, leaving out the harness's own commands.
func (s CommandStats) Add(other CommandStats) {
	for name, n := range other {
		if !harnessCommand(name) {
			s[name] += n
		}
	}
}

// Total is the number of calls of every command but the harness's own.
func (s CommandStats) Total() int64 {
	var t int64
	for name, n := range s {
		if !harnessCommand(name) {
			t += n
		}
	}
	return t
}

// PerThousand is n per 1,000 requests.
func PerThousand(n, requests int64) float64 {
	if requests <= 0 {
		return 0
	}
	return float64(n) * 1000 / float64(requests)
}

// Names returns the commands of s, most called first (ties by name), for
// a stable breakdown.
func (s CommandStats) Names() []string {
	var names []string
	for name := range s {
		if !harnessCommand(name) {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		if s[a] != s[b] {
			if s[a] > s[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return names
}

// ParseMonitorLine reads one line of Redis's MONITOR output, such as
//
//	1795447920.767425 [0 127.0.0.1:43922] "evalsha" "9c1f..." "1" "k"
//	1795447920.767506 [0 lua] "set" "k" "1"
//
// and returns the command's name in lower case, and whether a script ran
// it rather than a client sending it. INFO commandstats counts both alike,
// so the harness tells them apart from MONITOR.
func ParseMonitorLine(line string) (cmd string, inScript, ok bool) {
	line = strings.TrimPrefix(strings.TrimSpace(line), "+")
	open := strings.IndexByte(line, '[')
	end := strings.IndexByte(line, ']')
	if open < 0 || end < open {
		return "", false, false
	}
	// "[<db> <client>]": the client is "lua" inside a script.
	_, client, _ := strings.Cut(line[open+1:end], " ")
	rest := strings.TrimSpace(line[end+1:])
	if !strings.HasPrefix(rest, `"`) {
		return "", false, false
	}
	name, _, found := strings.Cut(rest[1:], `"`)
	if !found || name == "" {
		return "", false, false
	}
	return strings.ToLower(name), client == "lua", true
}

// ClockTicks is the unit of the CPU times in /proc/<pid>/stat: USER_HZ,
// which is 100 on every Linux architecture Go runs on.
const ClockTicks = 100

// ParseProcStat reads the CPU time a process has used, user and system,
// its live and exited threads included, from the text of
// /proc/<pid>/stat.
func ParseProcStat(stat string) (time.Duration, error) {
	return procStatTicks(stat, 2) // utime, stime
}

// ParseProcStatTree reads, from the text of /proc/<pid>/stat, the CPU time
// of the process (utime + stime) and of its children it has waited for
// (cutime + cstime).
func ParseProcStatTree(stat string) (time.Duration, error) {
	return procStatTicks(stat, 4) // utime, stime, cutime, cstime
}

// procStatTicks adds the n fields of /proc/<pid>/stat from utime (field
// 14) on, and returns them as CPU time.
func procStatTicks(stat string, n int) (time.Duration, error) {
	// The command name, field 2, is in parentheses and may hold spaces:
	// the fields are counted from its closing parenthesis.
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("proc stat: no command name in %q", stat)
	}
	fields := strings.Fields(stat[end+1:])
	// fields[0] is field 3 (state); utime is field 14.
	if len(fields) < 11+n {
		return 0, fmt.Errorf("proc stat: %d fields after the name, want at least %d", len(fields), 11+n)
	}
	var ticks int64
	for _, f := range fields[11 : 11+n] {
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proc stat: %v", err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / ClockTicks, nil
}
