package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterTwice(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "promreg_test_total", Help: "A test counter."})
	c.Inc()
	for range 2 {
		reg := prometheus.NewPedanticRegistry()
		for range 2 {
			if err := Register(reg, c); err != nil {
				t.Fatal(err)
			}
		}
		families, err := reg.Gather()
		if err != nil || len(families) != 1 || families[0].GetMetric()[0].GetCounter().GetValue() != 1 {
			t.Fatalf("gathered %v, %v; want the counter with its value", families, err)
		}
	}
	if err := Register(nil, c); err != nil {
		t.Fatal(err)
	}
	clash := prometheus.NewGauge(prometheus.GaugeOpts{Name: "promreg_test_total", Help: "Another type."})
	if err := Register(prometheus.NewPedanticRegistry(), c, clash); err == nil {
		t.Fatal("a clashing collector was accepted")
	}
}
