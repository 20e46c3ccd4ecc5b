package ratelimit

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// discard is a ResponseWriter that keeps one header map, cleared per
// request, so that neither arm of the benchmark pays for a recorder.
type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(b []byte) (int, error) { return len(b), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkServeHTTP compares a route that answers at once with the same
// route behind a local-mode rate_limit handler (two limits, a generous
// limit so every request passes, one client key among 1,000). Both arms
// prepare every request as Caddy's server does (a new replacer, a fresh
// header map), so the difference between "without" and the others is
// what the handler adds: with the default headers, with
// hide_client_headers, and with a key template that is more than one
// placeholder.
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
	requests := make([]*http.Request, 1000)
	for i := range requests {
		r, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/api", nil)
		r.Header.Set("X-Key", "client-"+strconv.Itoa(i))
		requests[i] = r
	}
	run := func(name string, h caddyhttp.Handler) {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				w := &discard{h: http.Header{"Server": {"Caddy"}}} // as Caddy's server sets it
				r := caddyhttp.PrepareRequest(requests[i%len(requests)], caddy.NewReplacer(), w, nil)
				if err := h.ServeHTTP(w, r); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}

	run("without", next)
	for _, tc := range []struct {
		name string
		h    *Handler
	}{
		{"with", &Handler{Key: "{http.request.header.X-Key}"}},
		{"hidden", &Handler{Key: "{http.request.header.X-Key}", HideClientHeaders: true}},
		{"template", &Handler{Key: "api-{http.request.header.X-Key}"}},
	} {
		tc.h.Limits = []Limit{
			{Limit: 1e12, Window: caddy.Duration(60e9)},
			{Limit: 1e12, Window: caddy.Duration(3600e9)},
		}
		if err := tc.h.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		run(tc.name, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			return tc.h.ServeHTTP(w, r, next)
		}))
	}
}
