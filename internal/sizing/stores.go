package sizing

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/benchhttp"
)

// Reading is one reading of a store's counters; a row's figures are the
// differences of two (Memory and Conns: the later one's).
type Reading struct {
	// At is when it was read.
	At time.Time
	// Commands are Redis's commandstats calls, or PostgreSQL's
	// transactions; Trips Redis's script runs (PostgreSQL: its
	// transactions); Rows PostgreSQL's rows inserted, updated and deleted.
	Commands, Trips, Rows int64
	// CPU is the store's CPU time so far.
	CPU time.Duration
	// Memory is what the store holds for the nodes, in bytes, and Conns
	// its client connections, the harness's own left out.
	Memory int64
	Conns  int
}

// Store is a store server the harness owns, and how it reads it.
type Store interface {
	// Name is the store's name in rows: "redis".
	Name() string
	// Title is its name in prose: "Redis".
	Title() string
	// Prepare readies the store for a row, before its nodes start, and
	// returns the strategy JSON of the row's namespace.
	Prepare(ctx context.Context, row Row) (json.RawMessage, error)
	// Read reads the store's counters.
	Read(ctx context.Context) (Reading, error)
	// Close releases the harness's own connections.
	Close() error
}

// MemorySampler is a Store that reads its memory alone, with no call
// that its figures count (commands, transactions, CPU worth noting), so
// that the harness can read it every second of the window: Redis, whose
// used_memory moves with its clients' buffers. PostgreSQL's tables only
// grow within a row, and reading their size costs a connection to the
// nodes' database, whose transaction would count: it is read at the
// window's end.
type MemorySampler interface {
	Memory(ctx context.Context) (int64, error)
}

// RedisStore is a redis-server of the harness's own.
type RedisStore struct {
	addr     string
	rdb      *redis.Client
	baseline int64 // used_memory after the row's FLUSHALL
}

// NewRedisStore returns the store of the redis-server at addr, which the
// harness owns: Prepare flushes it.
func NewRedisStore(addr string) *RedisStore {
	// RESP2 and no CLIENT SETINFO: this client sends nothing but
	// FLUSHALL and INFO, which the counts leave out.
	rdb := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, PoolSize: 1})
	return &RedisStore{addr: addr, rdb: rdb}
}

// Name implements Store.
func (s *RedisStore) Name() string { return "redis" }

// Title implements Store.
func (s *RedisStore) Title() string { return "Redis" }

// Prepare implements Store: it empties the server and notes its memory.
func (s *RedisStore) Prepare(ctx context.Context, _ Row) (json.RawMessage, error) {
	if err := s.rdb.FlushAll(ctx).Err(); err != nil {
		return nil, fmt.Errorf("FLUSHALL: %w", err)
	}
	info, err := s.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO memory: %w", err)
	}
	if s.baseline, err = InfoInt(info, "used_memory"); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"module": "redis", "addresses": []string{s.addr}})
}

// Read implements Store.
func (s *RedisStore) Read(ctx context.Context) (Reading, error) {
	r := Reading{At: time.Now()}
	info, err := s.rdb.Info(ctx, "commandstats", "cpu", "memory", "clients").Result()
	if err != nil {
		return r, fmt.Errorf("INFO: %w", err)
	}
	stats, err := benchhttp.ParseCommandStats(info)
	if err != nil {
		return r, err
	}
	r.Commands = stats.Total()
	r.Trips = stats["evalsha"] + stats["eval"]
	if r.CPU, err = benchhttp.ParseRedisCPU(info); err != nil {
		return r, err
	}
	if r.Memory, err = s.memoryIn(info); err != nil {
		return r, err
	}
	clients, err := InfoInt(info, "connected_clients")
	if err != nil {
		return r, err
	}
	r.Conns = int(clients) - 1 // the harness's own
	return r, nil
}

// Memory implements MemorySampler: INFO, which the commands leave out.
func (s *RedisStore) Memory(ctx context.Context) (int64, error) {
	info, err := s.rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO memory: %w", err)
	}
	return s.memoryIn(info)
}

// memoryIn returns the used_memory of INFO output above the row's
// baseline.
func (s *RedisStore) memoryIn(info string) (int64, error) {
	mem, err := InfoInt(info, "used_memory")
	return mem - s.baseline, err
}

// Close implements Store.
func (s *RedisStore) Close() error { return s.rdb.Close() }

// InfoInt returns the integer field name of Redis's INFO output, such as
// "used_memory:1234".
func InfoInt(info, name string) (int64, error) {
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == name {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO %s: %v", name, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("INFO: no %s", name)
}

// harnessApp is the application_name of the harness's own PostgreSQL
// connections, which the connection count leaves out.
const harnessApp = "sizing-harness"

// PostgresStore is a database of a PostgreSQL server of the harness's own.
// It counts transactions (pg_stat_database: xact_commit + xact_rollback),
// as PostgreSQL has no count of statements without an extension loaded at
// start, and rows written (tup_inserted + tup_updated + tup_deleted).
type PostgresStore struct {
	dsn, db string
	data    string    // the data directory, whose postmaster.pid names the server
	admin   *pgx.Conn // to another database, so that its queries are not counted
	table   string    // the row's table
	rows    int
}

// NewPostgresStore returns the store of database db, reached at dsn by
// the nodes; adminDSN reaches another database of the same server (such as
// "postgres"), whose data directory is data.
func NewPostgresStore(ctx context.Context, dsn, db, adminDSN, data string) (*PostgresStore, error) {
	cfg, err := pgx.ParseConfig(adminDSN)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = harnessApp
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	// Autovacuum visits a database once a minute, at a phase of its own:
	// a row it visits mid-window reuses the purged rows' space from then
	// on and holds less, so which rows read low depended on their place
	// in the grid (one read 5.2 MiB in every grid, and 6.5 to 7.5 alone).
	// Off, every row's tables hold what they wrote before any vacuum, as
	// the formula says; docs/operations.md says what a vacuum does later.
	for _, q := range []string{"ALTER SYSTEM SET autovacuum = off", "SELECT pg_reload_conf()"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			admin.Close(ctx)
			return nil, fmt.Errorf("turning autovacuum off: %w", err)
		}
	}
	return &PostgresStore{dsn: dsn, db: db, data: data, admin: admin}, nil
}

// Name implements Store.
func (s *PostgresStore) Name() string { return "postgres" }

// Title implements Store.
func (s *PostgresStore) Title() string { return "PostgreSQL" }

// Prepare implements Store: each row has tables of its own, so that their
// size is the row's.
func (s *PostgresStore) Prepare(_ context.Context, _ Row) (json.RawMessage, error) {
	s.rows++
	s.table = fmt.Sprintf("sizing_%d", s.rows)
	return json.Marshal(map[string]any{"module": "postgres", "dsn": s.dsn, "table": s.table})
}

// Read implements Store.
func (s *PostgresStore) Read(ctx context.Context) (Reading, error) {
	r := Reading{At: time.Now()}
	if _, err := s.admin.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
		return r, err
	}
	err := s.admin.QueryRow(ctx, `SELECT xact_commit + xact_rollback, tup_inserted + tup_updated + tup_deleted
		FROM pg_stat_database WHERE datname = $1`, s.db).Scan(&r.Commands, &r.Rows)
	if err != nil {
		return r, fmt.Errorf("reading pg_stat_database: %w", err)
	}
	r.Trips = r.Commands
	err = s.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = $1 AND backend_type = 'client backend' AND application_name IS DISTINCT FROM $2`,
		s.db, harnessApp).Scan(&r.Conns)
	if err != nil {
		return r, fmt.Errorf("reading pg_stat_activity: %w", err)
	}
	if r.Memory, err = s.size(ctx); err != nil {
		return r, err
	}
	r.CPU, err = s.cpu()
	return r, err
}

// size returns the size of the row's tables, their indexes and TOAST
// included, read from the nodes' database by a connection of its own
// (its transaction is counted between no two readings that matter: it
// runs after the counts are read).
func (s *PostgresStore) size(ctx context.Context) (int64, error) {
	cfg, err := pgx.ParseConfig(s.dsn)
	if err != nil {
		return 0, err
	}
	cfg.RuntimeParams["application_name"] = harnessApp
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("connecting to %s: %w", s.db, err)
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
		WHERE c.relkind = 'r' AND c.relname IN ($1, $2)`, s.table, s.table+"_ids").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reading the tables' size: %w", err)
	}
	return n, nil
}

// cpu returns the CPU time of the server: its postmaster's, its children's
// that have exited, and its live children's (the backends).
func (s *PostgresStore) cpu() (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return 0, fmt.Errorf("postmaster.pid: %v", err)
	}
	return TreeCPU(pid)
}

// TreeCPU returns the CPU time of process pid, user and system, that of
// its children it has waited for, and that of its live children.
func TreeCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	total, err := benchhttp.ParseProcStatTree(string(stat))
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	want := strconv.Itoa(pid)
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		st := string(b)
		fields := strings.Fields(st[strings.LastIndexByte(st, ')')+1:])
		if len(fields) > 1 && fields[1] == want {
			d, err := benchhttp.ParseProcStat(st)
			if err != nil {
				return 0, err
			}
			total += d
		}
	}
	return total, nil
}

// Close implements Store.
func (s *PostgresStore) Close() error { return s.admin.Close(context.Background()) }
