package postgres

import (
	"context"
	"fmt"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// RateKeys returns how many keys' TATs of a namespace the table holds,
// passed or not (a purge drops those that passed), for tests and tools.
func (s *Store) RateKeys(ctx context.Context, namespace string) (int, error) {
	n, err := s.countRows(ctx, &s.ratePart, "_rates", namespace)
	if err != nil {
		return 0, fmt.Errorf("counting rate keys: %w", err)
	}
	return n, nil
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher: its
// batch hit function decides hits' rates (see hitsBodySQL), and its push
// takes a Batch's rates (see ratedSQL).
func (*Store) DecidesRatesInBatches() {}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
