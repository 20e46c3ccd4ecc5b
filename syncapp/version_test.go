package syncapp

import (
	"context"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestVersionIsReported loads the app as Caddy does and checks that a user
// can see Version: as caddy_rate_limit_build_info{version="..."} 1 in the
// config's metrics registry (the one Caddy's /metrics serves), and in the
// log line the app writes when it starts.
func TestVersionIsReported(t *testing.T) {
	if Version == "" {
		t.Fatal("Version is empty")
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	a := &App{pool: caddy.NewUsagePool()}
	if err := a.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Cleanup()
	core, logs := observer.New(zap.InfoLevel)
	a.logger = zap.New(core)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	defer a.Stop()

	families, err := ctx.GetMetricsRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range families {
		if f.GetName() != "caddy_rate_limit_build_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "version" && l.GetValue() == Version && m.GetGauge().GetValue() == 1 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf(`the registry has no caddy_rate_limit_build_info{version=%q} 1`, Version)
	}

	started := logs.FilterMessage("rate limiting started").FilterField(zap.String("version", Version))
	if started.Len() != 1 {
		t.Errorf("logged %v, want one \"rate limiting started\" with version %s", logs.All(), Version)
	}
}
