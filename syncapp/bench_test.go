package syncapp

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// BenchmarkSync10000 measures one periodic sync run (push and fetch) of a
// namespace in which 10,000 keys changed since the last run, against a
// local redis-server.
func BenchmarkSync10000(b *testing.B) {
	srv := redistest.Start(b)
	n := start(b, caddy.NewUsagePool(), nsConfig(srv.Addr, "1h", "1m"))
	ns := n.ns("api")
	ctx := context.Background()
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "client-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		for _, k := range keys {
			ns.Increment(ctx, k, time.Minute, 1)
		}
		b.StartTimer()
		if err := ns.Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
