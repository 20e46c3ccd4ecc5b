// Package promreg registers process-wide Prometheus collectors into a
// config's registry. Caddy makes a new registry for every config, so the
// same collectors are registered again at every reload (keeping their
// values), and by every module of one config that uses them.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers each collector into reg, which may be nil (metrics
// are off) or may already hold it.
func Register(reg prometheus.Registerer, collectors ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for _, c := range collectors {
		var are prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &are) {
			return err
		}
	}
	return nil
}
