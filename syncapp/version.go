package syncapp

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Version is the version of caddy-ratelimit, as CHANGELOG.md names its
// releases. The app logs it when it starts, and reports it on Caddy's
// metrics endpoint as caddy_rate_limit_build_info{version="..."} 1.
const Version = "0.1.0"

// buildInfo is the gauge that reports Version: process-wide like the
// other metrics, registered into every config's registry.
var buildInfo = func() prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace:   "caddy",
		Subsystem:   "rate_limit",
		Name:        "build_info",
		Help:        "Always 1; its version label is the version of the caddy-ratelimit plugin this Caddy runs.",
		ConstLabels: prometheus.Labels{"version": Version},
	})
	g.Set(1)
	return g
}()
