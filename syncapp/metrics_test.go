package syncapp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
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

// TestStoreUpAndTimeouts reads store_up and sync_interval_seconds from the
// pooled state of a namespace whose store refuses connections, and
// store_timeouts_total from the failures its health counts: a timeout
// counts, another failure does not. A local namespace has neither gauge.
func TestStoreUpAndTimeouts(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := l.Addr().String() // nobody listens there once closed
	l.Close()
	cfg := `{"namespaces": {"up-ns": {"sync_rate": "1h", "window_sizes": ["1m"],
			"strategy": {"module": "redis", "addresses": ["` + refused + `"], "dial_timeout": "100ms"}},
		"up-local": {}}}`
	n := start(t, defaultPool, cfg)
	defer n.stop()
	ns := n.ns("up-ns")
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	up := `caddy_rate_limit_store_up{namespace="up-ns"}`
	timeouts := `caddy_rate_limit_store_timeouts_total{namespace="up-ns"}`
	errs := `caddy_rate_limit_sync_errors_total{namespace="up-ns"}`
	for series, want := range map[string]float64{
		up: 1, // nothing asked the store yet
		`caddy_rate_limit_sync_interval_seconds{namespace="up-ns"}`:    3600,
		`caddy_rate_limit_store_up{namespace="up-local"}`:              -1,
		`caddy_rate_limit_sync_interval_seconds{namespace="up-local"}`: -1,
		`caddy_rate_limit_sync_errors_total{namespace="up-local"}`:     -1,
	} {
		if got := gathered(t, reg, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	// Counters are process-wide (-count=2 runs this twice): compare deltas.
	// They have a series before any failure, so alerts and panels find it.
	timeoutsBefore, errsBefore := gathered(t, reg, timeouts), gathered(t, reg, errs)
	if timeoutsBefore < 0 || errsBefore < 0 {
		t.Fatalf("%s = %v and %s = %v before any failure, want series", timeouts, timeoutsBefore, errs, errsBefore)
	}

	ns.health.fail(fmt.Errorf("hitting: %w", context.DeadlineExceeded), 0)
	ns.health.fail(fmt.Errorf("reading: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), 0)
	ns.health.stalled()
	ns.health.fail(errors.New("connection refused"), 0) // a failure, not a timeout
	ns.health.fail(context.Canceled, 0)                 // says nothing of the store
	if got := gathered(t, reg, timeouts) - timeoutsBefore; got != 3 {
		t.Errorf("%s rose by %v, want 3", timeouts, got)
	}
	if got := gathered(t, reg, errs) - errsBefore; got < 5 {
		t.Errorf("%s rose by %v, want at least 5", errs, got)
	}
	// The loop probes the store at once and keeps failing: it stays down.
	if got := gathered(t, reg, up); got != 0 {
		t.Errorf("%s = %v after failures, want 0", up, got)
	}
}

// TestScrapesDuringReloads scrapes the metrics while configs come and go:
// a reload takes the loop's reference to its store while a scrape reads
// each loop under the pool's lock, and neither may wait for the other.
func TestScrapesDuringReloads(t *testing.T) {
	srv := redistest.Start(t)
	cfg := `{"namespaces": {"scrape-ns": {"sync_rate": "1h", "window_sizes": ["1m"],
		"strategy": {"module": "redis", "addresses": ["` + srv.Addr + `"]}}}}`
	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	// A hang is a deadlock: end the test binary with every goroutine's
	// stack rather than wait for go test's timeout.
	watchdog := time.AfterFunc(2*time.Minute, func() { panic("reloads and scrapes hold each other up") })
	defer watchdog.Stop()
	stop, scraped := make(chan struct{}), make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				scraped <- nil
				return
			default:
			}
			if _, err := reg.Gather(); err != nil {
				scraped <- err
				return
			}
		}
	}()
	n := start(t, defaultPool, cfg)
	for range 200 {
		next := start(t, defaultPool, cfg)
		n.stop()
		n = next
	}
	n.stop()
	close(stop)
	if err := <-scraped; err != nil {
		t.Fatal(err)
	}
}
