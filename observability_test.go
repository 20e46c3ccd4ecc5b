package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ratesync/caddy-ratelimit/syncapp"
)

// observabilityFiles are the files a user imports into Grafana and
// Prometheus; every metric name they use must be one the plugin registers.
var observabilityFiles = []string{
	"observability/grafana-dashboard.json",
	"observability/prometheus-rules.yml",
}

// TestObservabilityMetricNames checks every caddy_rate_limit_* name in
// the dashboard and the alerting rules against the metrics the handler
// and the app register, so that a renamed metric or a misspelled query
// fails here rather than as an empty panel or an alert that never fires.
func TestObservabilityMetricNames(t *testing.T) {
	known := registeredMetrics(t)
	if len(known) < 10 {
		t.Fatalf("only %d metrics registered: %v", len(known), known)
	}
	for _, path := range observabilityFiles {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(path, ".json") && !json.Valid(text) {
			t.Errorf("%s: not valid JSON", path)
		}
		used := metricNames(string(text))
		if len(used) == 0 {
			t.Errorf("%s uses no caddy_rate_limit_* metric", path)
		}
		for _, name := range used {
			if err := known.check(name); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		}
	}

	// The check itself: a misspelled name and a histogram suffix on a
	// metric that is no histogram are caught.
	for _, bad := range []string{"caddy_rate_limit_request_total", "caddy_rate_limit_keys_bucket", "caddy_rate_limit_store_upp"} {
		if known.check(bad) == nil {
			t.Errorf("%s passes the check", bad)
		}
	}
}

var metricName = regexp.MustCompile(`caddy_rate_limit_[a-zA-Z0-9_]+`)

// metricNames returns the distinct metric names text uses.
func metricNames(text string) []string {
	names := metricName.FindAllString(text, -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// metricTypes maps each registered metric's name to its type, or to nil
// when the type is unknown (no series yet).
type metricTypes map[string]*dto.MetricType

// check says why name, as a query writes it, is not a registered metric:
// a histogram's series are its name with _bucket, _sum or _count.
func (m metricTypes) check(name string) error {
	if _, ok := m[name]; ok {
		return nil
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		typ, ok := m[base]
		switch {
		case !ok:
		case typ == nil:
			return fmt.Errorf("%s: the type of %s is unknown (it has no series in the test)", name, base)
		case *typ != dto.MetricType_HISTOGRAM:
			return fmt.Errorf("%s: %s is a %v, not a histogram", name, base, typ)
		default:
			return nil
		}
	}
	return fmt.Errorf("%s is not a metric the plugin registers", name)
}

// registeredMetrics provisions the app (with a synchronous namespace, so
// that every histogram has a series) and registers the handler's metrics
// in a fresh Caddy context, then lists what its registry describes, with
// the types of what it gathers.
func registeredMetrics(t *testing.T) metricTypes {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	app := new(syncapp.App)
	cfg := `{"namespaces": {"observability-names": {"sync_rate": "0", "strategy": {"module": "memory"}}}}`
	if err := json.Unmarshal([]byte(cfg), app); err != nil {
		t.Fatal(err)
	}
	err := app.Provision(ctx)
	defer func() {
		if err := app.Cleanup(); err != nil {
			t.Error(err)
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	reg := ctx.GetMetricsRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	metrics.delays.WithLabelValues("observability-names")

	known := make(metricTypes)
	descs := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(descs)
		close(descs)
	}()
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range descs {
		if m := fqName.FindStringSubmatch(d.String()); m != nil && strings.HasPrefix(m[1], "caddy_rate_limit_") {
			known[m[1]] = nil
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if _, ok := known[f.GetName()]; ok {
			known[f.GetName()] = f.Type
		}
	}
	return known
}
