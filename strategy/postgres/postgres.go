package postgres

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

func init() {
	caddy.RegisterModule(Postgres{})
}

// defaultTable is the table of the counters when none is configured.
const defaultTable = "rate_limit_counters"

// applicationName is the application_name the store's connections report
// to the server (pg_stat_activity), unless the DSN sets one.
const applicationName = "caddy-ratelimit"

// defaultParams are the session settings of the store's connections,
// unless the DSN sets them. JIT compilation is off: the store's queries
// are many short lookups, which the planner may cost high enough to
// compile for longer than they run (a fetch of 10,000 keys is 20,000
// lookups).
var defaultParams = map[string]string{
	"application_name": applicationName,
	"jit":              "off",
	// Taking a concurrency slot counts the slots of a key after waiting
	// for its lock, which sees the slots taken meanwhile only under read
	// committed, PostgreSQL's default: a server, database or role default
	// of another level must not apply (see acquireBodySQL).
	"default_transaction_isolation": "read committed",
}

// Postgres is a rate-limit strategy that keeps the shared counters of a
// namespace in a PostgreSQL table (PostgreSQL 13 or later), through a
// pgx connection pool.
//
// The table, and a second one that remembers the IDs of the batches and
// hits applied, are created when the store is first used. A periodic sync
// pushes the diffs of a batch in one statement, never applies a retried
// batch twice, and fetches only the counters of the keys asked for,
// through the primary key; a synchronous hit is one call of a PL/pgSQL
// function, and so is taking a concurrency slot (max_concurrent), whose
// rows expire by the server's clock. Expired rows are deleted in bounded
// chunks by one node at a time. Connections are made when first needed: loading or validating a
// configuration never connects to PostgreSQL.
//
// The dsn may hold global placeholders such as {env.DATABASE_URL},
// replaced when the configuration loads.
type Postgres struct {
	// DSN is the connection string of the database, as a URL
	// (postgres://user:password@host:5432/dbname?sslmode=verify-full) or
	// as keyword/value pairs (host=... dbname=... sslmode=...), with
	// everything libpq and pgx accept there, including the pgxpool
	// settings (pool_max_conns, ...). TLS is chosen with sslmode (disable,
	// prefer, require, verify-ca, verify-full) and the files sslrootcert,
	// sslcert and sslkey; use verify-full with a server that is not on a
	// trusted network. Use a placeholder such as {env.DATABASE_URL} to
	// keep the password out of the configuration. The role needs the
	// right to create the tables and the function in the schema the first
	// time, or to own them. Required.
	DSN string `json:"dsn,omitempty"`

	// Table is the name of the table of the counters, a plain SQL
	// identifier (letters, digits and underscores, not starting with a
	// digit, at most 55 bytes), optionally qualified by a schema
	// (schema.table). As in SQL, letters are folded to lower case. The
	// table <table>_ids, which remembers applied batch and hit IDs, is
	// created next to it, the function <table>_hits when the first
	// synchronous hit is sent, and, when max_concurrent first takes a
	// slot, the table <table>_slots and the functions <table>_acquire,
	// <table>_renew and <table>_release.
	// Default: rate_limit_counters.
	Table string `json:"table,omitempty"`

	// MaxConns is the most connections the store keeps open to the
	// database. Default: 0, which means pool_max_conns from the DSN, or
	// else pgxpool's default, the greater of 4 and the number of CPUs.
	MaxConns int32 `json:"max_conns,omitempty"`

	// The checked settings, made by Provision or Open, and Provision's
	// logger (nil after Open: the store then logs nothing).
	poolConfig *pgxpool.Config
	names      *names
	logger     *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Postgres) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rate_limit.strategies.postgres",
		New: func() caddy.Module { return new(Postgres) },
	}
}

// Provision replaces placeholders, applies defaults and checks the result
// (as Validate does). It holds nothing and connects to nothing: the
// rate_limit app opens the store (OpenStore), which connects when first
// used.
func (p *Postgres) Provision(ctx caddy.Context) error {
	p.logger = ctx.Logger()
	if err := p.setup(); err != nil {
		return err
	}
	cc := p.poolConfig.ConnConfig
	p.logger.Debug("postgres strategy configured", zap.String("host", cc.Host), zap.Uint16("port", cc.Port),
		zap.String("database", cc.Database), zap.String("user", cc.User), zap.String("table", p.Table),
		zap.Int32("max_conns", p.poolConfig.MaxConns))
	return nil
}

// Open prepares p's settings and opens a store of them for use outside
// Caddy, from Go code or tests: it does what Provision and Validate do
// (placeholders, defaults, checks), then what OpenStore does, without
// connecting to the database. Fill in the configuration fields first, and
// close the store when done:
//
//	p := &postgres.Postgres{DSN: "postgres://rl:secret@10.0.0.5/ratelimit"}
//	s, err := p.Open()
//	if err != nil { ... }
//	defer s.Close()
func (p *Postgres) Open() (*Store, error) {
	if err := p.setup(); err != nil {
		return nil, err
	}
	return p.openStore()
}

// setup is the part of Provision that needs no Caddy context.
func (p *Postgres) setup() error {
	repl := caddy.NewReplacer()
	// ReplaceKnown, not ReplaceAll: a password may contain braces that are
	// not a placeholder, and they must survive.
	p.DSN = repl.ReplaceKnown(p.DSN, "")
	p.Table = repl.ReplaceKnown(p.Table, "")
	if p.Table == "" {
		p.Table = defaultTable
	}
	if err := p.Validate(); err != nil {
		return err
	}
	p.Table = strings.ToLower(p.Table)
	cfg, err := pgxpool.ParseConfig(p.DSN)
	if err != nil { // Validate parsed it: only if the environment changed
		return errs.Settings(dsnError(p.DSN, err))
	}
	if p.MaxConns > 0 {
		cfg.MaxConns = p.MaxConns
	}
	for name, value := range defaultParams {
		if _, ok := cfg.ConnConfig.RuntimeParams[name]; !ok {
			cfg.ConnConfig.RuntimeParams[name] = value
		}
	}
	p.poolConfig = cfg
	p.names = newNames(p.Table)
	return nil
}

// Validate checks the configuration, with errors that name the field and
// the value (never the password). It parses the DSN but never connects.
// Provision runs it too.
func (p *Postgres) Validate() error {
	var dsn, maxConns error
	if p.DSN == "" {
		dsn = errors.New("dsn: required (a placeholder such as {env.DATABASE_URL} may have been empty)")
	} else if _, err := pgxpool.ParseConfig(p.DSN); err != nil {
		dsn = dsnError(p.DSN, err)
	}
	if p.MaxConns < 0 {
		maxConns = fmt.Errorf("max_conns: must not be negative, got %d", p.MaxConns)
	}
	return errs.Settings(dsn, checkTable(p.Table), maxConns)
}

// OpenStore returns a new store for p's settings (see strategy.Strategy),
// with a connection pool of its own, which the caller closes with Close.
// It neither connects nor starts a goroutine: the pool is made when the
// store is first used. p must be provisioned (or opened).
func (p *Postgres) OpenStore() (strategy.Store, error) {
	return strategy.OpenStore(p.openStore)
}

func (p *Postgres) openStore() (*Store, error) {
	if p.poolConfig == nil {
		return nil, errs.Settings(errors.New("opening a store of settings that were not provisioned"))
	}
	return newStore(p.poolConfig.Copy(), p.names, p.logger), nil
}

// StoreKey identifies the store that p's settings open (see
// strategy.Strategy): the DSN, after placeholders, the table and
// max_conns. It holds the password.
func (p *Postgres) StoreKey() string {
	return fmt.Sprintf("dsn=%q table=%q max_conns=%d", p.DSN, p.Table, p.MaxConns)
}

// ValidateWindow refuses a window size that the table cannot hold: one
// that is not a positive whole number of milliseconds. The error names the
// size and wraps ErrInvalidWindow.
func (p *Postgres) ValidateWindow(size time.Duration) error {
	return errs.Settings(strategy.CheckSize(size))
}

// tableName and schemaName match the parts of the table setting: plain
// SQL identifiers, the table's short enough for the store's suffixes
// (_ids_exp, _slotexp, _acquire and _release, the longest, have 8 bytes)
// within PostgreSQL's 63 bytes.
var (
	tableName  = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,54}$`)
	schemaName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
)

// checkTable checks the table setting: a plain identifier, optionally
// qualified by a schema.
func checkTable(table string) error {
	schema, name, qualified := strings.Cut(table, ".")
	if !qualified {
		schema, name = "", schema
	}
	if !tableName.MatchString(name) || qualified && !schemaName.MatchString(schema) {
		return fmt.Errorf("table: %q is not a plain SQL identifier of at most 55 bytes (letters, digits and underscores, not starting with a digit), optionally qualified by a schema (schema.table)", table)
	}
	return nil
}

// names are what the store's objects in the database are named after:
// the table, and the keys of its advisory locks.
type names struct {
	counters              string // the table, qualified and quoted
	base                  string // its name, unqualified
	schema                []string
	schemaLock, purgeLock int64
	// slotSeed is the FNV-1a state after "caddy-ratelimit slot <table> ",
	// where the keys of the advisory locks of slots start (see slotLock).
	slotSeed uint64
}

func newNames(table string) *names {
	parts := strings.Split(table, ".")
	n := &names{
		base:       parts[len(parts)-1],
		schema:     parts[:len(parts)-1],
		schemaLock: lockKey("schema", table),
		purgeLock:  lockKey("purge", table),
		slotSeed:   fnv1a(fnvOffset, "caddy-ratelimit slot "+table+" "),
	}
	n.counters = n.qualified("")
	return n
}

// qualified returns the name <table><suffix> in the table's schema,
// qualified and quoted.
func (n *names) qualified(suffix string) string {
	return append(append(pgx.Identifier{}, n.schema...), n.base+suffix).Sanitize()
}

// lockKey returns the key of an advisory lock of the store's table: FNV-1a
// 64 of "caddy-ratelimit <what> <table>", the same on every node.
func lockKey(what, table string) int64 {
	return int64(fnv1a(fnvOffset, "caddy-ratelimit "+what+" "+table))
}

// FNV-1a 64 parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnv1a returns the FNV-1a 64 state h after the bytes of s.
func fnv1a(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

// dsnError describes a DSN that does not parse, naming the field, without
// the password: the DSN is shown with its password redacted, and any
// password the DSN may hold is removed from the driver's message too.
func dsnError(dsn string, err error) error {
	redacted, secrets := redactDSN(dsn)
	msg := err.Error()
	// pgx says "cannot parse `<its redaction of the DSN>`: <why>": keep why.
	if rest, ok := strings.CutPrefix(msg, "cannot parse `"); ok {
		if i := strings.LastIndex(rest, "`: "); i >= 0 {
			msg = rest[i+3:]
		}
	}
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return fmt.Errorf("dsn: %q does not parse: %s", redacted, msg)
}

// kvPassword matches a password keyword of a keyword/value DSN, or a
// password parameter of a URL, with its value.
var kvPassword = regexp.MustCompile(`(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&]*)`)

// redactDSN returns dsn with every password it may hold replaced by
// xxxxx, and those passwords (as written, and URL-decoded). It errs on the
// side of hiding too much: a DSN that does not parse is ambiguous.
func redactDSN(dsn string) (string, []string) {
	var secrets []string
	if i := strings.Index(dsn, "://"); i >= 0 {
		rest := dsn[i+3:]
		// The userinfo ends at the last '@': a password may hold an '@'
		// that should have been escaped.
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if colon := strings.Index(rest[:at], ":"); colon >= 0 {
				pw := rest[colon+1 : at]
				secrets = append(secrets, pw)
				dsn = dsn[:i+3] + rest[:colon+1] + "xxxxx" + rest[at:]
			}
		}
	}
	for _, m := range kvPassword.FindAllStringSubmatch(dsn, -1) {
		if m[2] != "xxxxx" {
			secrets = append(secrets, strings.Trim(m[2], "'"), m[2])
		}
	}
	dsn = kvPassword.ReplaceAllString(dsn, "${1}xxxxx")
	for _, s := range secrets {
		if u, err := url.PathUnescape(s); err == nil && u != s {
			secrets = append(secrets, u)
		}
	}
	// Longest first, so that a password is not half-replaced by a shorter
	// one it contains.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	return dsn, secrets
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Postgres)(nil)
	_ caddy.Validator       = (*Postgres)(nil)
	_ caddyfile.Unmarshaler = (*Postgres)(nil)
	_ strategy.Strategy     = (*Postgres)(nil)
)
