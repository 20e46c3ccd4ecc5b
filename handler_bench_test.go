package ratelimit

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// discard is a ResponseWriter that keeps one header map, cleared per
// request, so that neither arm of the benchmark pays for a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkServeHTTP measures what a local-mode rate_limit handler (two
// limits, a generous limit so every request passes, one client key among
// 1,000) adds to a route that answers at once. Every request is prepared
// as Caddy's server prepares it (a new replacer, a fresh header map with
// the Server field, and a request header map of its own, as net/http
// parses one per request), and blocks of requests with and without the
// handler alternate, in turn first, so that a busy, noisy machine slows
// both alike. It reports the time the handler adds per request as the
// median over the pairs of blocks of the difference between them (a
// block that another process preempted spoils one pair, not the figure),
// and as their mean difference, which also spreads the garbage
// collector's work over every request; the allocations it adds; and the
// ratio of the two arms' total times. Cases: the default headers (the
// draft's two fields), Kong's, none, a key template that is more than one
// placeholder, and the draft's and Kong's headers before a handler that
// sets Content-Type, as respond does (both arms).
//
// The cases rate and rate-limits put a rate (rate 1e12/1m burst 1e6) in
// front: alone, and beside the two limits.
func BenchmarkServeHTTP(b *testing.B) {
	// A running app, so the handler provisions as it does under Caddy.
	if err := caddy.Load([]byte(`{"admin": {"disabled": true}, "apps": {"rate_limit": {}}}`), true); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = caddy.Stop() })
	ctx := caddy.ActiveContext()

	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
	// respond answers as Caddy's respond handler does, with a
	// Content-Type: with two limits' seven headers and Server, the header
	// map then holds nine entries, one past a small Go map.
	respond := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.Header()["Content-Type"] = []string{"text/plain; charset=utf-8"}
		w.WriteHeader(http.StatusOK)
		return nil
	})
	requests := make([]*http.Request, 1000)
	for i := range requests {
		r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/api", nil)
		r.Header.Set("X-Key", "client-"+strconv.Itoa(i))
		requests[i] = r
	}
	i := 0
	serve := func(h caddyhttp.Handler) {
		w := &discard{h: http.Header{"Server": {"Caddy"}}} // as Caddy's server sets it
		r := caddyhttp.PrepareRequest(requests[i%len(requests)], caddy.NewReplacer(), w, nil)
		r.Header = r.Header.Clone() // PrepareRequest copied the request, not its header map
		if err := h.ServeHTTP(w, r); err != nil {
			b.Fatal(err)
		}
		i++
	}

	for _, tc := range []struct {
		name string
		h    *Handler
		next caddyhttp.Handler
	}{
		{"draft", &Handler{Key: "{http.request.header.X-Key}"}, next},
		{"kong", &Handler{Key: "{http.request.header.X-Key}", Headers: []string{"kong"}}, next},
		{"none", &Handler{Key: "{http.request.header.X-Key}", Headers: []string{"none"}}, next},
		{"template", &Handler{Key: "api-{http.request.header.X-Key}"}, next},
		{"draft-respond", &Handler{Key: "{http.request.header.X-Key}"}, respond},
		{"kong-respond", &Handler{Key: "{http.request.header.X-Key}", Headers: []string{"kong"}}, respond},
		// A rate alone (a rate that admits every request), and beside the
		// two limits.
		{"rate", &Handler{Key: "{http.request.header.X-Key}", Rate: generousRate}, next},
		{"rate-limits", &Handler{Key: "{http.request.header.X-Key}", Rate: generousRate, Limits: twoLimits()}, next},
	} {
		if tc.h.Rate == nil {
			tc.h.Limits = twoLimits()
		}
		if err := tc.h.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		bareNext := tc.next
		limited := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return tc.h.ServeHTTP(w, r, bareNext)
		})
		b.Run(tc.name, func(b *testing.B) {
			const block = 64
			timed := func(h caddyhttp.Handler) time.Duration {
				t0 := time.Now()
				for range block {
					serve(h)
				}
				return time.Since(t0)
			}
			var bareTime, limitedTime time.Duration
			var added []time.Duration
			for pair := 0; b.Loop(); pair++ {
				var bare, lim time.Duration
				if pair%2 == 0 {
					bare = timed(bareNext)
					lim = timed(limited)
				} else {
					lim = timed(limited)
					bare = timed(bareNext)
				}
				bareTime += bare
				limitedTime += lim
				added = append(added, lim-bare)
			}
			slices.Sort(added)
			b.ReportMetric(float64(added[len(added)/2])/block, "added-ns/req")
			b.ReportMetric(float64(limitedTime-bareTime)/float64(b.N*block), "mean-added-ns/req")
			b.ReportMetric(float64(bareTime)/float64(limitedTime), "bare/limited")
			allocs := testing.AllocsPerRun(1000, func() { serve(limited) }) - testing.AllocsPerRun(1000, func() { serve(bareNext) })
			b.ReportMetric(allocs, "added-allocs/req")
		})
	}
}

// twoLimits are the benchmark's generous limits: every request passes.
func twoLimits() []Limit {
	return []Limit{
		{Limit: 1e12, Window: caddy.Duration(60e9)},
		{Limit: 1e12, Window: caddy.Duration(3600e9)},
	}
}

// generousRate is the benchmark's rate: every request passes.
var generousRate = &Rate{Rate: 1e12, Window: caddy.Duration(60e9), Burst: 1e6}
