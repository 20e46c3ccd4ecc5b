package benchhttp

import (
	"fmt"
	"io"

	"github.com/ratesync/caddy-ratelimit/internal/docgen"
)

// DocCommand is the script that runs the harness; it names the markers
// around the part of docs/performance.md it writes.
const DocCommand = "./scripts/bench-http.sh"

// RunInfo describes a run for the report: each field one line, left out
// when empty.
type RunInfo struct {
	Date, Command, Plugin, Machine, Go, Caddy, Redis, Load, Pairs string
}

// CaseRow is one case's figures as the report shows them.
type CaseRow struct {
	Label string
	Summary
	// Redis is whether the case counts at Redis; then RanPer1k and
	// SentPer1k are the commands Redis ran and those Caddy sent per 1,000
	// requests, and RedisCPU is Redis's CPU time per request, in µs.
	Redis                         bool
	RanPer1k, SentPer1k, RedisCPU float64
}

// WriteMarkdown writes the run as docs/performance.md holds it, between
// the markers of DocCommand: the run, a table of every case against bare
// Caddy, and one of the Redis cases' commands and CPU.
func WriteMarkdown(w io.Writer, info RunInfo, rows []CaseRow) {
	fmt.Fprintln(w, "### The run")
	fmt.Fprintln(w)
	for _, f := range []struct{ name, value string }{
		{"Date", info.Date}, {"Command", info.Command}, {"Plugin", info.Plugin}, {"Machine", info.Machine}, {"Go", info.Go},
		{"Caddy", info.Caddy}, {"Redis", info.Redis}, {"Load", info.Load}, {"Pairs", info.Pairs},
	} {
		if f.value != "" {
			fmt.Fprintln(w, docgen.WrapItem("**"+f.name+":** "+f.value))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Each case against bare Caddy")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| case | ratio | min–max | bare req/s | limited req/s | Caddy CPU µs/req: bare | limited | added |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|")
	var redis []CaseRow
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %.3f | %.3f–%.3f | %.0f | %.0f | %.1f | %.1f | %+.1f |\n",
			r.Label, r.Ratio, r.Min, r.Max, r.BareRPS, r.LimitedRPS, r.BareCPU, r.LimitedCPU, r.AddedCPU)
		if r.Redis {
			redis = append(redis, r)
		}
	}
	if len(redis) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "### Redis, per request")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| case | commands Redis ran / 1,000 requests | commands Caddy sent / 1,000 requests | Redis CPU µs/req |")
	fmt.Fprintln(w, "|---|--:|--:|--:|")
	for _, r := range redis {
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %.1f |\n", r.Label, r.RanPer1k, r.SentPer1k, r.RedisCPU)
	}
}
