package postgres

import (
	"context"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Ping takes a connection of the pool, with the schema in place, and runs
// an empty statement on it (see strategy.Pinger).
func (s *Store) Ping(ctx context.Context) (err error) {
	defer errs.Ping(&err)
	conn, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	return conn.Ping(ctx)
}

var _ strategy.Pinger = (*Store)(nil)
