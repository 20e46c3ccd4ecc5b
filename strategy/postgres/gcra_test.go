package postgres

import (
	"context"
	"testing"
	"time"
)

// rateRows purges, then counts the TATs of a namespace that the table
// holds.
func rateRows(t testing.TB, s *Store, namespace string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Purge(ctx); err != nil {
		t.Fatalf("purging: %v", err)
	}
	n, err := s.RateKeys(ctx, namespace)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
