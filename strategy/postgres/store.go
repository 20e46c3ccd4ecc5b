package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Purging of expired rows.
const (
	// purgeEvery is how often each store purges expired rows, when no
	// other node is purging the table at the time.
	purgeEvery = 30 * time.Second
	// purgeChunk is the most rows one purge statement deletes, so that a
	// purge holds its locks briefly and never bloats one transaction.
	purgeChunk = 10000
	// maxPurgeChunks bounds one periodic purge: what is left waits for the
	// next one.
	maxPurgeChunks = 100
)

// errs words the store's errors.
var errs = strategy.Errors{Store: "postgres"}

// Store is a store of window counters in one PostgreSQL table, opened by
// Postgres.Open or OpenStore. It implements strategy.BatchHitter (so
// strategy.Hitter), strategy.Slotter, strategy.Banner and
// strategy.NearFeed (whose slots, bans and marks live in tables of their
// own), and is safe for concurrent use.
//
// It connects when first used, not before: the first call makes the
// connection pool, starts the purge goroutine, and creates the tables if
// they are missing. Close undoes it.
type Store struct {
	config *pgxpool.Config
	names  *names
	sql    *statements
	logger *zap.Logger
	// now is the clock that decides which diffs have expired and when rows
	// expire; tests replace it. The now of GetCounters and Reset, and the
	// starts of diffs and hits, only choose windows.
	now func() time.Time
	// purgeEvery is how often the purge goroutine runs; tests shorten it.
	purgeEvery time.Duration

	mu        sync.Mutex
	pool      *pgxpool.Pool // made at first use
	closed    bool
	stopPurge context.CancelFunc // stops the purge goroutine
	purgeDone chan struct{}      // closed when it has stopped
	// nextPurge is when the next purge is due, in Unix nanoseconds: a
	// periodic namespace's run does it (Maintain), and the purge goroutine
	// only when no run did for half an interval more.
	nextPurge atomic.Int64

	// schemaMu serializes the creation of the parts of the schema, each
	// made by the first call that needs it (see part): the counters' by
	// any call, the batch hit function by the first HitBatch, the slots',
	// bans', rates', near marks' and members' by their first call.
	schemaMu                                                          sync.Mutex
	core, batchPart, slotPart, banPart, ratePart, nearPart, fleetPart part
	parts                                                             []*part // all of them, in the purge's order
	// nearOffUntil is when to try making the feed's part again, in Unix
	// nanoseconds, after the role was refused it (see nearOn).
	nearOffUntil atomic.Int64
}

func newStore(cfg *pgxpool.Config, n *names, logger *zap.Logger) *Store {
	if logger == nil {
		logger = zap.NewNop()
	}
	r := n.placeholders()
	s := &Store{
		config:     cfg,
		names:      n,
		sql:        newStatements(n, r),
		logger:     logger,
		now:        time.Now,
		purgeEvery: purgeEvery,
	}
	s.parts = s.newParts(n, r)
	return s
}

// getPool returns the store's pool, making it (and starting the purge
// goroutine) on first use.
func (s *Store) getPool() (*pgxpool.Pool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errs.Closed()
	}
	if s.pool != nil {
		return s.pool, nil
	}
	// It connects to nothing (the pool's minimum is 0 unless the DSN sets
	// pool_min_conns), but starts the pool's health check goroutine.
	pool, err := pgxpool.NewWithConfig(context.Background(), s.config)
	if err != nil {
		return nil, errs.NotSent(fmt.Errorf("making the connection pool: %w", err))
	}
	s.pool = pool
	// The first purge at a random point of the first interval, so that
	// nodes started together spread their purges.
	s.nextPurge.Store(time.Now().Add(rand.N(s.purgeEvery) + time.Millisecond).UnixNano())
	ctx, cancel := context.WithCancel(context.Background())
	s.stopPurge, s.purgeDone = cancel, make(chan struct{})
	go s.purgeLoop(ctx, pool, s.purgeDone)
	return pool, nil
}

// acquire returns a connection of the pool, with the counters' part of
// the schema and the parts given in place. Its errors wrap
// strategy.ErrNotSent: nothing of the caller's request was sent yet.
func (s *Store) acquire(ctx context.Context, parts ...*part) (*pgxpool.Conn, error) {
	if err := s.ensure(ctx, append([]*part{&s.core}, parts...)...); err != nil {
		return nil, err
	}
	pool, err := s.getPool()
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, fmt.Errorf("%w: %w", errs.Closed(), err)
		}
		return nil, errs.NotSent(err)
	}
	return conn, nil
}

// sent classifies an error of a request that was handed to a connection:
// it wraps strategy.ErrNotSent when pgx knows that nothing was sent (the
// connection failed before the request was written), and is returned as
// it is otherwise, when the request may have been applied. pgx never
// resends a request by itself. An error that says a table or a function
// is missing (someone dropped them) has the next call create the schema
// again.
func (s *Store) sent(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883") { // undefined_table, undefined_function
		for _, p := range s.parts {
			p.ready.Store(false)
		}
	}
	if pgconn.SafeToRetry(err) {
		return errs.NotSent(err)
	}
	return err
}

// Close stops the purge goroutine and closes the connection pool, if the
// store was used; it waits for the calls in flight to end. Calls made
// after it fail with an error that wraps strategy.ErrNotSent. Closing it
// again does nothing.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	pool, stop, done := s.pool, s.stopPurge, s.purgeDone
	s.mu.Unlock()
	if pool == nil {
		return nil
	}
	stop()
	<-done
	pool.Close()
	return nil
}

// purgeLoop purges expired rows when no run did (see Maintain): half an
// interval after a purge was due, until ctx is cancelled. A purge it
// claims keeps the cadence, due again an interval after it was due.
func (s *Store) purgeLoop(ctx context.Context, pool *pgxpool.Pool, done chan<- struct{}) {
	defer close(done)
	late := s.purgeEvery / 2
	untilLate := func() time.Duration {
		return max(time.Until(time.Unix(0, s.nextPurge.Load()).Add(late)), time.Millisecond)
	}
	timer := time.NewTimer(untilLate())
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		due := s.nextPurge.Load()
		if time.Now().UnixNano() >= due+int64(late) && s.nextPurge.CompareAndSwap(due, due+int64(s.purgeEvery)) {
			s.purgeOnce(ctx, pool)
		}
		timer.Reset(untilLate())
	}
}

// Maintain implements strategy.Maintainer: it purges expired rows when a
// purge is due. A periodic namespace's run calls it after its own calls,
// so that the purge takes the connection the run just gave back: a purge
// of its own, every 30 s at any point, would find the run's connection
// busy one time in a few at short sync_rates, and the pool would open a
// second connection for it, which the node keeps.
func (s *Store) Maintain(ctx context.Context) {
	s.mu.Lock()
	pool := s.pool
	if s.closed {
		pool = nil
	}
	s.mu.Unlock()
	due, now := s.nextPurge.Load(), time.Now()
	if pool == nil || now.UnixNano() < due || !s.nextPurge.CompareAndSwap(due, now.Add(s.purgeEvery).UnixNano()) {
		return
	}
	s.purgeOnce(ctx, pool)
}

// purgeOnce runs one periodic purge, logging its failures and recovering
// from its panics: the loop carries on.
func (s *Store) purgeOnce(ctx context.Context, pool *pgxpool.Pool) {
	defer func() {
		if r := recover(); r != nil {
			s.logger.Error("panic while purging expired counters",
				zap.Any("panic", r), zap.ByteString("stack", debug.Stack()))
		}
	}()
	if !s.core.ready.Load() {
		return // nothing to purge yet, and no reason to create the tables
	}
	ctx, cancel := context.WithTimeout(ctx, s.purgeEvery)
	defer cancel()
	n, err := s.purge(ctx, pool, false, maxPurgeChunks)
	switch {
	case err != nil && ctx.Err() == nil:
		s.logger.Warn("purging expired counters", zap.String("table", s.names.counters), zap.Error(err))
	case n > 0:
		if c := s.logger.Check(zap.DebugLevel, "purged expired counters"); c != nil {
			c.Write(zap.String("table", s.names.counters), zap.Int64("rows", n))
		}
	}
}

// Purge deletes the expired counters, ID records, concurrency slots, bans
// and marks near limits of the store's tables, of every namespace, and returns how many rows it
// deleted. It waits while another node purges the table. The store purges
// on its own every 30 seconds, skipping a turn when another node is
// purging; Purge is for tests and tools that need the expired rows gone
// now.
func (s *Store) Purge(ctx context.Context) (n int64, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("purging expired counters: %w", err)
		}
	}()
	pool, err := s.getPool()
	if err == nil {
		err = s.ensure(ctx, &s.core)
	}
	if err != nil {
		return 0, err
	}
	return s.purge(ctx, pool, true, -1)
}

// purge deletes expired rows in chunks of purgeChunk, each in a short
// transaction that holds the table's purge lock, so that one node at a
// time purges. With wait, it waits for the lock; without, it stops when
// another node holds it. It stops after chunks chunks (negative: when
// nothing expired is left).
func (s *Store) purge(ctx context.Context, pool *pgxpool.Pool, wait bool, chunks int) (int64, error) {
	var total int64
	for i := 0; chunks < 0 || i < chunks; i++ {
		nowMs := s.now().UnixMilli()
		locked, more := true, false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			lock := "SELECT pg_try_advisory_xact_lock($1)"
			if wait {
				lock = "SELECT true FROM pg_advisory_xact_lock($1)"
			}
			if err := tx.QueryRow(ctx, lock, s.names.purgeLock).Scan(&locked); err != nil || !locked {
				return err
			}
			for _, p := range s.parts {
				if !p.ready.Load() {
					continue
				}
				for _, q := range p.purges {
					args := []any{purgeChunk}
					if q.nodeClock {
						args = append(args, nowMs)
					}
					tag, err := tx.Exec(ctx, q.sql, args...)
					if err != nil {
						return err
					}
					total += tag.RowsAffected()
					more = more || tag.RowsAffected() >= purgeChunk
				}
			}
			return nil
		})
		if err != nil || !locked || !more {
			return total, err
		}
	}
	return total, nil
}

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

// Interface guards
var (
	_ strategy.BatchHitter = (*Store)(nil)
	_ strategy.Slotter     = (*Store)(nil)
	_ strategy.Banner      = (*Store)(nil)
	_ strategy.NearFeed    = (*Store)(nil)
	_ strategy.Roster      = (*Store)(nil)
	_ strategy.Maintainer  = (*Store)(nil)
	_ strategy.Pinger      = (*Store)(nil)
)
