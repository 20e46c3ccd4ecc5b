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
}{}

func registerMetrics(reg prometheus.Registerer) error {
	metrics.once.Do(func() {
		metrics.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "caddy",
			Subsystem: "rate_limit",
			Name:      "requests_total",
			Help:      "Requests the rate_limit handler counted, by namespace and outcome (allowed, rejected, dry_run, concurrency_rejected).",
		}, []string{"namespace", "outcome"})
	})
	return promreg.Register(reg, metrics.requests)
}
