package accuracy

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/benchhttp"
)

// Store is a store server the harness owns, and its way of counting the
// work the nodes give it.
type Store interface {
	// Name is the store's name in rows and file names: "redis".
	Name() string
	// Title is its name in prose: "Redis".
	Title() string
	// OpsUnit says what Ops counts, for the table's header.
	OpsUnit() string
	// Strategy is the strategy JSON of the nodes' namespace.
	Strategy() json.RawMessage
	// Prepare readies the store for a row, before its nodes start.
	Prepare(ctx context.Context) error
	// Ops is a counter of the store's work: a row's share is its value
	// after the row (Settle first) minus before.
	Ops(ctx context.Context) (int64, error)
	// Settle waits, after a row's nodes have stopped, until Ops counts
	// everything they did.
	Settle(ctx context.Context) error
	// Close releases the harness's own connections.
	Close() error
}

// CommandCounter is a Store that counts each command apart: a Verbose
// runner prints what a row ran of each.
type CommandCounter interface {
	Commands(ctx context.Context) (benchhttp.CommandStats, error)
}

// RedisStore is a redis-server of the harness's own. It counts the
// commands Redis ran, those that scripts run included (INFO
// commandstats).
type RedisStore struct {
	addr string
	rdb  *redis.Client
}

// NewRedisStore returns the store of the redis-server at addr, which the
// harness owns: Prepare flushes it.
func NewRedisStore(addr string) *RedisStore {
	// RESP2 and no CLIENT SETINFO: this client sends nothing but FLUSHALL,
	// before a row's first count, and INFO, which the counts leave out.
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, PoolSize: 1})
	return &RedisStore{addr: addr, rdb: rdb}
}

// Name implements Store.
func (s *RedisStore) Name() string { return "redis" }

// Title implements Store.
func (s *RedisStore) Title() string { return "Redis" }

// OpsUnit implements Store.
func (s *RedisStore) OpsUnit() string {
	return "Redis commands per 1,000 requests (INFO commandstats: script commands included)"
}

// Strategy implements Store.
func (s *RedisStore) Strategy() json.RawMessage {
	b, _ := json.Marshal(map[string]any{"module": "redis", "addresses": []string{s.addr}})
	return b
}

// Prepare implements Store: it empties the server, so that no counter of
// an earlier row is left.
func (s *RedisStore) Prepare(ctx context.Context) error {
	if err := s.rdb.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("FLUSHALL: %w", err)
	}
	return nil
}

// Ops implements Store: the calls of every command but the harness's own
// INFO and CONFIG.
func (s *RedisStore) Ops(ctx context.Context) (int64, error) {
	stats, err := s.Commands(ctx)
	if err != nil {
		return 0, err
	}
	// FLUSHALL is the harness's too, sent before a row's first count: it
	// never falls between two counts of a row.
	return stats.Total(), nil
}

// Commands implements CommandCounter.
func (s *RedisStore) Commands(ctx context.Context) (benchhttp.CommandStats, error) {
	info, err := s.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO commandstats: %w", err)
	}
	return benchhttp.ParseCommandStats(info)
}

// Settle implements Store: Redis counts a command as it runs it.
func (s *RedisStore) Settle(context.Context) error { return nil }

// Close implements Store.
func (s *RedisStore) Close() error { return s.rdb.Close() }

// PostgresStore is a database of a PostgreSQL server of the harness's
// own. It counts the database's transactions (pg_stat_database's
// xact_commit + xact_rollback): PostgreSQL has no count of statements
// without an extension loaded at start.
type PostgresStore struct {
	dsn, db string
	admin   *pgx.Conn // to another database, so that its queries are not counted
}

// NewPostgresStore returns the store of database db, reached at dsn by
// the nodes; adminDSN reaches another database of the same server (such
// as "postgres"), from which the harness reads the statistics.
func NewPostgresStore(ctx context.Context, dsn, db, adminDSN string) (*PostgresStore, error) {
	cfg, err := pgx.ParseConfig(adminDSN)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "accuracy-harness"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	return &PostgresStore{dsn: dsn, db: db, admin: admin}, nil
}

// Name implements Store.
func (s *PostgresStore) Name() string { return "postgres" }

// Title implements Store.
func (s *PostgresStore) Title() string { return "PostgreSQL" }

// OpsUnit implements Store.
func (s *PostgresStore) OpsUnit() string {
	return "PostgreSQL transactions per 1,000 requests (pg_stat_database: xact_commit + xact_rollback)"
}

// Strategy implements Store.
func (s *PostgresStore) Strategy() json.RawMessage {
	b, _ := json.Marshal(map[string]any{"module": "postgres", "dsn": s.dsn, "table": "accuracy_counters"})
	return b
}

// Prepare implements Store. Every row's keys are new, so the rows of
// earlier rows are left for the store to expire.
func (s *PostgresStore) Prepare(context.Context) error { return nil }

// Ops implements Store.
func (s *PostgresStore) Ops(ctx context.Context) (int64, error) {
	// A new snapshot of the statistics, not one cached by an earlier read.
	if _, err := s.admin.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return 0, err
	}
	var n int64
	err := s.admin.QueryRow(ctx,
		"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", s.db).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reading pg_stat_database: %w", err)
	}
	return n, nil
}

// Settle implements Store. A backend reports its transactions to the
// statistics up to seconds late, but always before it exits: Settle
// waits until the database's connections, the stopped nodes', are gone.
func (s *PostgresStore) Settle(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := s.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = $1 AND backend_type = 'client backend'`, s.db).Scan(&n)
		if err != nil {
			return fmt.Errorf("reading pg_stat_activity: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d connections to database %s left 20s after the nodes stopped", n, s.db)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close implements Store.
func (s *PostgresStore) Close() error { return s.admin.Close(context.Background()) }
