package postgres

import (
	"testing"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

// TestConformance runs the stores' conformance suite against PostgreSQL.
// It has no Harness.Cost, as PostgreSQL reports table statistics late;
// TestFetchUsesThePrimaryKey checks instead that a fetch looks up the
// counters it is asked for, through the primary key.
func TestConformance(t *testing.T) {
	srv, dsn := startServer(t)
	strategytest.Run(t, strategytest.Harness{
		Open: func(t *testing.T) strategy.Store {
			s, err := (&Postgres{DSN: dsn}).Open()
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Counters: func(t *testing.T, s strategy.Store, namespace string) int {
			return counters(t, srv, s.(*Store), namespace)
		},
		Slots: func(t *testing.T, s strategy.Store, namespace string) int {
			return slotRows(t, s.(*Store), namespace)
		},
		Rates: func(t *testing.T, s strategy.Store, namespace string) int {
			return rateRows(t, s.(*Store), namespace)
		},
	})
}
