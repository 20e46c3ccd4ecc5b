package postgres

import (
	"testing"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

// BenchmarkStore runs the stores' benchmarks (strategytest.Benchmarks),
// each against a PostgreSQL server of its own. A push of a batch is one
// statement, whatever its size.
func BenchmarkStore(b *testing.B) { strategytest.Benchmarks(b, benchStore) }

func benchStore(b *testing.B) strategy.Store {
	_, dsn := startServer(b)
	return open(b, &Postgres{DSN: dsn})
}

// BenchmarkHitBatch runs strategytest.HitBatchBenchmarks against a
// PostgreSQL server of its own: a batch is one call of the batch hit
// function, whatever its size.
func BenchmarkHitBatch(b *testing.B) {
	strategytest.HitBatchBenchmarks(b, benchStore(b), nil, nil)
}
