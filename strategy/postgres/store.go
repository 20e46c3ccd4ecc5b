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

	// schemaMu serializes the creation of the schema, which schemaReady
	// records, and of the slots' part of it, which slotsReady records: the
	// first slot call makes that (see slotSchemaSQL).
	schemaMu    sync.Mutex
	schemaReady atomic.Bool
	slotsReady  atomic.Bool
	bansReady   atomic.Bool // the bans' part, made by the first ban call
	batchReady  atomic.Bool // the batch hit function, made by the first HitBatch call
	ratesReady  atomic.Bool // the rates' part, made by the first rate call
	nearReady   atomic.Bool // the feed's part, made by its first push or read
	fleetReady  atomic.Bool // the members' table, made by the first Attend
	// nearOffUntil is when to try making the feed's part again, in Unix
	// nanoseconds, after the role was refused it (see nearOn).
	nearOffUntil atomic.Int64
	rateSQL      *rateStatements
	nearSQL      *nearStatements
}

func newStore(cfg *pgxpool.Config, n *names, logger *zap.Logger) *Store {
	if logger == nil {
		logger = zap.NewNop()
	}
	sql := newStatements(n)
	return &Store{
		config:     cfg,
		names:      n,
		sql:        sql,
		rateSQL:    newRateStatements(n),
		nearSQL:    newNearStatements(n, sql.push, sql.pushRates),
		logger:     logger,
		now:        time.Now,
		purgeEvery: purgeEvery,
	}
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

// acquire returns a connection of the pool, with the schema in place. Its
// errors wrap strategy.ErrNotSent: nothing of the caller's request was
// sent yet.
func (s *Store) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	pool, err := s.getPool()
	if err != nil {
		return nil, err
	}
	if !s.schemaReady.Load() {
		if err := s.createSchema(ctx, pool, s.sql.schema, &s.schemaReady); err != nil {
			return nil, errs.NotSent(fmt.Errorf("creating the tables: %w", err))
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		if s.isClosed() {
			return nil, fmt.Errorf("%w: %w", errs.Closed(), err)
		}
		return nil, errs.NotSent(err)
	}
	return conn, nil
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// acquireSlots returns a connection as acquire does, with the slots' part
// of the schema in place too.
func (s *Store) acquireSlots(ctx context.Context) (*pgxpool.Conn, error) {
	return s.acquirePart(ctx, s.sql.slotSchema, &s.slotsReady, "the slots table")
}

// acquirePart returns a connection as acquire does, with a part of the
// schema that not every store needs (schema, which creates what, and
// which ready records) in place too. It makes that part before it takes
// a connection, as createSchema takes one of its own.
func (s *Store) acquirePart(ctx context.Context, schema string, ready *atomic.Bool, what string) (*pgxpool.Conn, error) {
	if err := s.ensurePart(ctx, schema, what, ready); err != nil {
		return nil, err
	}
	return s.acquire(ctx)
}

// ensurePart makes a part of the schema, as acquirePart does, without
// taking a connection: for a call that needs two parts. Given several
// ready flags, schema makes the parts they record together.
func (s *Store) ensurePart(ctx context.Context, schema, what string, ready ...*atomic.Bool) error {
	if allReady(ready) {
		return nil
	}
	pool, err := s.getPool()
	if err != nil {
		return err
	}
	if err := s.createSchema(ctx, pool, schema, ready...); err != nil {
		return errs.NotSent(fmt.Errorf("creating %s: %w", what, err))
	}
	return nil
}

// createSchema runs a schema statement (the tables, their indexes and the
// hit function, or the slots' part, or several parts one after the other)
// that creates what is missing, once per store, and records it in each of
// ready. Nodes that start together may do it at the same time: an
// advisory lock taken in the same transaction makes them take turns, and
// a unique violation (from a node that does not take the lock) means that
// another node created an object first, so it tries again, finding it
// there.
func (s *Store) createSchema(ctx context.Context, pool *pgxpool.Pool, schema string, ready ...*atomic.Bool) error {
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	if allReady(ready) {
		return nil
	}
	var err error
	for range 3 {
		// One simple-protocol query: its statements run in one implicit
		// transaction, which holds the advisory lock until it ends.
		if _, err = pool.Exec(ctx, schema); err == nil {
			for _, r := range ready {
				r.Store(true)
			}
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" { // unique_violation
			break
		}
	}
	return err
}

// allReady reports whether every part of the schema that ready records
// is in place.
func allReady(ready []*atomic.Bool) bool {
	for _, r := range ready {
		if !r.Load() {
			return false
		}
	}
	return true
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
		s.schemaReady.Store(false)
		s.slotsReady.Store(false)
		s.bansReady.Store(false)
		s.batchReady.Store(false)
		s.ratesReady.Store(false)
		s.nearReady.Store(false)
		s.fleetReady.Store(false)
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
	if !s.schemaReady.Load() {
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
func (s *Store) Purge(ctx context.Context) (int64, error) {
	pool, err := s.getPool()
	if err != nil {
		return 0, fmt.Errorf("purging expired counters: %w", err)
	}
	if !s.schemaReady.Load() {
		if err := s.createSchema(ctx, pool, s.sql.schema, &s.schemaReady); err != nil {
			return 0, fmt.Errorf("purging expired counters: %w", errs.NotSent(fmt.Errorf("creating the tables: %w", err)))
		}
	}
	n, err := s.purge(ctx, pool, true, -1)
	if err != nil {
		return n, fmt.Errorf("purging expired counters: %w", err)
	}
	return n, nil
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
		var counters, ids, slots, bans, rates, near int64
		locked := true
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if wait {
				if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.names.purgeLock); err != nil {
					return err
				}
			} else if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", s.names.purgeLock).Scan(&locked); err != nil || !locked {
				return err
			}
			tag, err := tx.Exec(ctx, s.sql.purgeCounters, nowMs, purgeChunk)
			if err != nil {
				return err
			}
			counters = tag.RowsAffected()
			tag, err = tx.Exec(ctx, s.sql.purgeIDs, nowMs, purgeChunk)
			if err != nil {
				return err
			}
			ids = tag.RowsAffected()
			if rates, err = s.purgeRates(ctx, tx); err != nil {
				return err
			}
			// Slots expire by the server's clock, which the statement
			// reads itself. A store that never used slots leaves them to
			// the stores that do: its role may not even see their table.
			if s.slotsReady.Load() {
				tag, err = tx.Exec(ctx, s.sql.purgeSlots, purgeChunk)
				if err != nil {
					return err
				}
				slots = tag.RowsAffected()
				if s.bansReady.Load() {
					tag, err = tx.Exec(ctx, s.sql.purgeBans, nowMs, purgeChunk)
					if err != nil {
						return err
					}
					bans = tag.RowsAffected()
				}
			}
			near, err = s.purgeNear(ctx, tx, nowMs)
			return err
		})
		total += counters + ids + slots + bans + rates + near
		if err != nil || !locked || counters < purgeChunk && ids < purgeChunk && slots < purgeChunk && bans < purgeChunk && rates < purgeChunk && near < purgeChunk {
			return total, err
		}
	}
	return total, nil
}

// Interface guards
var (
	_ strategy.BatchHitter = (*Store)(nil)
	_ strategy.Slotter     = (*Store)(nil)
	_ strategy.Banner      = (*Store)(nil)
	_ strategy.NearFeed    = (*Store)(nil)
	_ strategy.Roster      = (*Store)(nil)
	_ strategy.Maintainer  = (*Store)(nil)
)
