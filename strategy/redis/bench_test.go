package redis

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/benchhttp"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

// BenchmarkStore runs the stores' benchmarks (strategytest.Benchmarks),
// each against a standalone redis-server of its own. A hit's ID record is
// its marker key.
func BenchmarkStore(b *testing.B) { strategytest.Benchmarks(b, benchStrategy) }

func benchStrategy(b *testing.B) strategy.Store {
	srv := redistest.Start(b)
	return open(b, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(30 * time.Second)})
}

// BenchmarkHitBatch runs strategytest.HitBatchBenchmarks against a
// standalone redis-server, and reports the commands it ran per hit, from
// INFO commandstats (commands inside scripts included), and its CPU time
// per hit, from INFO cpu.
func BenchmarkHitBatch(b *testing.B) {
	srv := redistest.Start(b)
	s := open(b, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(30 * time.Second)})
	c := srv.Client("")
	cpu := func() time.Duration {
		info, err := c.Info(context.Background(), "cpu").Result()
		if err != nil {
			b.Fatal(err)
		}
		d, err := benchhttp.ParseRedisCPU(info)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	strategytest.HitBatchBenchmarks(b, s, func() int64 { return int64(sumCalls(serverCalls(b, c))) }, cpu)
}
