package memory

import (
	"context"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Ping reports whether the store serves: it fails only once the store is
// closed or ctx is done (see strategy.Pinger).
func (s *Store) Ping(ctx context.Context) error { return s.check(ctx) }

var _ strategy.Pinger = (*Store)(nil)
