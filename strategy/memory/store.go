package memory

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// errs words the store's errors.
var errs = strategy.Errors{Store: "memory"}

// Store is a store of the counters of one in-memory data set, opened by
// Memory.Open. It implements strategy.BatchHitter (so strategy.Hitter), strategy.Slotter and
// strategy.Banner. Stores of the same data set (opened from strategies of
// the same name) see the same counters, and each can be closed on its own.
// It is safe for concurrent use.
type Store struct {
	data   *data
	closed atomic.Bool
	// now is the clock that expires counters, markers and slots, as a Redis
	// server's clock does; tests replace it. The now of GetCounters and
	// Reset, and the starts of diffs and hits, only choose windows.
	now func() time.Time
}

func newStore(d *data) *Store { return &Store{data: d, now: time.Now} }

// check returns why a call cannot be served: the store is closed or the
// context is done. Either way nothing was applied, so the error wraps
// strategy.ErrNotSent, as a network store's does when it sent nothing.
func (s *Store) check(ctx context.Context) error {
	if s.closed.Load() {
		return errs.Closed()
	}
	if err := ctx.Err(); err != nil {
		return errs.NotSent(err)
	}
	return nil
}

// run runs f on the data set as lock does, unless the store cannot serve
// (see check) or the input failed its check, bad.
func (s *Store) run(ctx context.Context, bad error, f func(d *data, now int64)) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	if bad != nil {
		return bad
	}
	s.lock(f)
	return nil
}

// lock runs f on the data set at the store's clock (Unix nanoseconds),
// under the data set's lock and after a sweep.
func (s *Store) lock(f func(d *data, now int64)) {
	now := s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(now)
	f(d, now)
}

// Close marks the store closed: its later calls fail with an error that
// wraps strategy.ErrNotSent. The data set, and the other stores that share
// it, are not affected. Closing it again does nothing.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}

// Lookups returns how many counters GetCounters has looked up in the data
// set so far, through any of its stores: a running total of the work
// fetches did, for strategytest.Harness.Cost.
func (s *Store) Lookups() int64 { return s.data.lookups.Load() }

// Interface guards
var (
	_ strategy.BatchHitter = (*Store)(nil)
	_ strategy.Slotter     = (*Store)(nil)
	_ strategy.Banner      = (*Store)(nil)
)
