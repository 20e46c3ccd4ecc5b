package syncapp

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// TestMetricsSurviveReloads registers the collectors in two registries, as
// two configs would, and reads the pooled zone and namespace state from
// each; labels are zone and namespace names only.
func TestMetricsSurviveReloads(t *testing.T) {
	srv := redistest.Start(t)
	cfg := `{"zones": {"metrics-zone": {"max_keys": 16}},
		"namespaces": {"metrics-ns": {"zone": "metrics-zone", "sync_rate": "1h", "window_sizes": ["1m"],
			"strategy": {"module": "redis", "addresses": ["` + srv.Addr + `"]}}}}`
	// The collector reports the default pool, the one Caddy uses.
	n := start(t, defaultPool, cfg)
	ns := n.ns("metrics-ns")
	ctx := context.Background()
	for i := range 20 {
		ns.Increment(ctx, "client-"+strconv.Itoa(i), time.Minute, 1)
		ns.Ban(ctx, "client-"+strconv.Itoa(i), time.Now().Add(time.Hour))
	}
	first := prometheus.NewPedanticRegistry()
	if err := registerMetrics(first); err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		`caddy_rate_limit_keys{zone="metrics-zone"}`:                  16,
		`caddy_rate_limit_max_keys{zone="metrics-zone"}`:              16,
		`caddy_rate_limit_evictions_total{zone="metrics-zone"}`:       4,
		`caddy_rate_limit_pending_diffs{namespace="metrics-ns"}`:      20, // 16 keys held, 4 evicted
		`caddy_rate_limit_dropped_diffs_total{zone="metrics-zone"}`:   0,
		`caddy_rate_limit_bans{namespace="metrics-ns"}`:               16, // as many as the zone's keys
		`caddy_rate_limit_dropped_bans_total{namespace="metrics-ns"}`: 4,
	} {
		if got := gathered(t, first, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	runs := `caddy_rate_limit_sync_duration_seconds_count{namespace="metrics-ns"}`
	runsBefore := max(0, gathered(t, first, runs)) // process-wide: earlier runs of this test count too
	if err := ns.Sync(ctx); err != nil {
		t.Fatal(err)
	}

	// A reload: a new config and a new registry, the same live figures.
	next := start(t, defaultPool, cfg)
	n.stop()
	second := prometheus.NewPedanticRegistry()
	for range 2 { // a second handler of the same config registers again
		if err := registerMetrics(second); err != nil {
			t.Fatal(err)
		}
	}
	for series, want := range map[string]float64{
		`caddy_rate_limit_keys{zone="metrics-zone"}`:             16,
		`caddy_rate_limit_evictions_total{zone="metrics-zone"}`:  4,
		`caddy_rate_limit_pending_diffs{namespace="metrics-ns"}`: 0,
		`caddy_rate_limit_bans{namespace="metrics-ns"}`:          16,
		runs: runsBefore + 1, // Sync; the new config's loop took over the rest
	} {
		if got := gathered(t, second, series); got != want {
			t.Errorf("after reload: %s = %v, want %v", series, got, want)
		}
	}
	next.stop()
}

// gathered returns the value of one series, written as in the exposition
// format (histograms as <name>_count), or -1 when it is missing.
func gathered(t *testing.T, reg *prometheus.Registry, series string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					labels += ","
				}
				labels += l.GetName() + "=" + strconv.Quote(l.GetValue())
			}
			switch {
			case m.Counter != nil && series == f.GetName()+"{"+labels+"}":
				return m.Counter.GetValue()
			case m.Gauge != nil && series == f.GetName()+"{"+labels+"}":
				return m.Gauge.GetValue()
			case m.Histogram != nil && series == f.GetName()+"_count{"+labels+"}":
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return -1
}
