package ratelimit

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/caddy-ratelimit/internal/promreg"
)

// metrics are process-wide, registered into every config's registry, so
// their values survive reloads. Labels are the namespace and the outcome,
// never a client key.
var metrics = struct {
	once     sync.Once
	requests *prometheus.CounterVec
	delays   *prometheus.HistogramVec
}{}

func registerMetrics(reg prometheus.Registerer) error {
	metrics.once.Do(func() {
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "caddy",
			Subsystem: "rate_limit",
			Name:      "requests_total",
			Help:      "Requests the rate_limit handler counted, by namespace and outcome (allowed, delayed, rejected, banned, dry_run, concurrency_rejected, store_unreachable: on_store_failure deny while the store was away, invalid_limit: a limit's placeholders gave no number, 500).",
		}, []string{"namespace", "outcome"})
		metrics.delays = prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "caddy",
			Subsystem: "rate_limit",
			Name:      "delay_seconds",
			Help:      "How long requests that max_delay let wait waited before they were served, by namespace.",
			Buckets:   []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"namespace"})
	})
	return promreg.Register(reg, metrics.requests, metrics.delays)
}
