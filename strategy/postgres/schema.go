package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// part is a part of the schema: objects that the first call that needs
// them creates when they are missing, and the statements that purge their
// expired rows. The parts that not every store needs (all but the
// counters') are apart, so that a role that may not create objects keeps
// its counters when it upgrades, until its DBA creates the new ones; and
// a store that never used a part leaves its rows to the stores that do
// (its role may not even see their tables).
type part struct {
	what   string // what it creates, for errors
	sql    string // creates what is missing (see ddl)
	purges []purgeStatement
	ready  atomic.Bool // made or found by this store
}

// purgeStatement deletes up to $1 expired rows of a table, found through
// an index and deleted by their physical address, and, when nodeClock,
// takes the node's now in Unix milliseconds as $2 (those that do not read
// the server's clock).
type purgeStatement struct {
	sql       string
	nodeClock bool
}

// purgeOf returns the purge of table's rows that match where, which ends
// with the statement's LIMIT $1 (and its locking clause).
func purgeOf(table, where string) purgeStatement {
	return purgeStatement{
		sql:       "DELETE FROM " + table + " WHERE ctid = ANY(ARRAY(SELECT ctid FROM " + table + " WHERE " + where + "))",
		nodeClock: strings.Contains(where, "$2"),
	}
}

// newParts makes the parts of the schema of the table n names (see
// docs/stores.md for the tables), in the order the purge goes through
// them: the feed's last, as its purge never waits for a row lock while
// the purge holds rows of the feed. Counters' expires_at never changes
// once a row is written, so updates of a value leave the indexes alone
// and, with the free space fillfactor keeps, stay on their page (HOT
// updates); the same goes for TATs. Purges skip the rows that a call
// holds, so that a purge never waits for a row lock and no call waits for
// it for long, but those of counters and IDs, which calls hold briefly.
func (s *Store) newParts(n *names, r *strings.Replacer) []*part {
	return []*part{
		s.core.define(r, "the tables", n.ddl(
			n.table("", `namespace bytea NOT NULL, key bytea NOT NULL, size_ms bigint NOT NULL, start_ms bigint NOT NULL,
			value double precision NOT NULL, expires_at bigint NOT NULL,
			PRIMARY KEY (namespace, key, size_ms, start_ms)`, " WITH (fillfactor = 80)")+
				n.index("_exp", "", "expires_at")+
				n.table("_ids", `namespace bytea NOT NULL, id bytea NOT NULL, expires_at bigint NOT NULL,
			PRIMARY KEY (namespace, id)`, "")+
				n.index("_ids_exp", "_ids", "expires_at")),
			purgeOf("{counters}", "expires_at < $2 LIMIT $1"),
			purgeOf("{ids}", "expires_at < $2 LIMIT $1")),
		s.ratePart.define(r, "the rates tables", n.ddl(
			n.table("_rates", `namespace bytea NOT NULL, key bytea NOT NULL, window_ms bigint NOT NULL, tat_us bigint NOT NULL,
			PRIMARY KEY (namespace, key, window_ms)`, " WITH (fillfactor = 80)")+
				n.index("_rates_tat", "_rates", "tat_us")),
			purgeOf("{rates}", "tat_us <= "+serverMicros+" LIMIT $1 FOR UPDATE SKIP LOCKED")),
		s.slotPart.define(r, "the slots table", n.ddl(
			n.table("_slots", `namespace bytea NOT NULL, key bytea NOT NULL, id bytea NOT NULL,
			expires_at timestamptz NOT NULL, PRIMARY KEY (namespace, key, id)`, "")+
				n.index("_slotexp", "_slots", "expires_at")+
				n.function("_acquire", `p_namespace bytea, p_key bytea, p_id bytea, p_max bigint, p_lease_ms bigint, p_lock bigint,
			OUT held bigint, OUT ok boolean`, "", acquireBodySQL)+
				n.function("_renew", `p_namespace bytea, p_keys bytea[], p_ids bytea[], p_lease_ms bigint, p_locks bigint[],
			OUT renewed bigint`, "", renewBodySQL)+
				n.function("_release", `p_namespace bytea, p_keys bytea[], p_ids bytea[], p_locks bigint[],
			OUT released bigint`, "", releaseBodySQL)),
			purgeOf("{slots}", "expires_at <= clock_timestamp() LIMIT $1 FOR UPDATE SKIP LOCKED")),
		// A <table>_banver of an older version gains lifted_until_ms.
		s.banPart.define(r, "the bans tables", n.ddl(
			n.table("_bans", `namespace bytea NOT NULL, key_id bytea NOT NULL, key bytea NOT NULL, until_ms bigint NOT NULL,
			PRIMARY KEY (namespace, key_id)`, "")+`
	IF to_regclass('{banver}') IS NULL THEN
		CREATE TABLE {banver} (namespace bytea PRIMARY KEY, version bigint NOT NULL, lifted_until_ms bigint NOT NULL DEFAULT 0);
	ELSIF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass('{banver}')
		AND attname = 'lifted_until_ms' AND NOT attisdropped) THEN
		ALTER TABLE {banver} ADD COLUMN lifted_until_ms bigint NOT NULL DEFAULT 0;
	END IF;`+
				n.function("_set_bans", `p_namespace bytea, p_key_ids bytea[], p_keys bytea[], p_until bigint[], p_lock bigint,
			OUT changed boolean`, "", setBansBodySQL)),
			purgeOf("{bans}", "until_ms < $2 LIMIT $1 FOR UPDATE SKIP LOCKED")),
		s.nearPart.define(r, "the near marks tables", n.ddl(
			n.table("_near", `namespace bytea NOT NULL, n bigint NOT NULL, key bytea NOT NULL, until_ms bigint NOT NULL,
			PRIMARY KEY (namespace, n)`, "")+
				n.index("_nearexp", "_near", "until_ms")+
				n.table("_nearver", `namespace bytea PRIMARY KEY, version bigint NOT NULL, until_ms bigint NOT NULL`, "")),
			purgeOf("{near}", "until_ms < $2::bigint - {margin} LIMIT $1 FOR UPDATE SKIP LOCKED"),
			purgeOf("{nearver}", "until_ms < $2::bigint - {margin} LIMIT $1 FOR UPDATE SKIP LOCKED")),
		s.batchPart.define(r, "the batch hit function", n.ddl(
			n.function("_hits", `p_namespace bytea, p_id bytea, p_id_expires bigint,
			p_ckeys bytea[], p_csizes bigint[], p_cstarts bigint[], p_cwrite boolean[],
			p_undo boolean[], p_nwin integer[],
			p_cur integer[], p_prev integer[], p_values double precision[],
			p_maxes double precision[], p_weights double precision[],
			p_rkeys bytea[], p_rwins bigint[], p_hrate integer[], p_hinc bigint[], p_htol bigint[],
			OUT rejected integer[], OUT currents double precision[], OUT previouses double precision[],
			OUT rate_ok boolean[], OUT rate_tats bigint[], OUT now_us bigint`, "", hitsBodySQL))),
		s.fleetPart.define(r, "the members' table", n.ddl(
			n.table("_fleet", `namespace bytea NOT NULL, node bytea NOT NULL, until_ms bigint NOT NULL,
			PRIMARY KEY (namespace, node)`, ""))),
	}
}

// define sets p up, its statements' placeholders replaced by r.
func (p *part) define(r *strings.Replacer, what, ddl string, purges ...purgeStatement) *part {
	p.what, p.sql = what, r.Replace(ddl)
	for _, q := range purges {
		q.sql = r.Replace(q.sql)
		p.purges = append(p.purges, q)
	}
	return p
}

// serverMicros is the server's clock in Unix microseconds, in SQL.
const serverMicros = "floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"

// ddl returns the statement that creates the objects (made by table,
// index and function) that are missing, in one implicit transaction (it
// is sent as one simple query) that first takes the schema's advisory
// lock, so that nodes starting together take turns. It checks for each
// object before it creates it, so that once they exist it takes no lock
// on the tables: CREATE ... IF NOT EXISTS would lock a table that exists
// (CREATE INDEX takes a share lock on it), and deadlock with pushes under
// way.
func (n *names) ddl(objects string) string {
	return fmt.Sprintf("\nSELECT pg_advisory_xact_lock(%d);\nDO $do$\nBEGIN%s\nEND\n$do$;\n", n.schemaLock, objects)
}

// table creates the table <table><suffix> of those columns.
func (n *names) table(suffix, columns, with string) string {
	name := n.qualified(suffix)
	return fmt.Sprintf("\n\tIF to_regclass('%s') IS NULL THEN\n\t\tCREATE TABLE %s (\n\t\t\t%s\n\t\t)%s;\n\tEND IF;", name, name, columns, with)
}

// index creates the index <table><suffix> on a column of <table><of>, in
// the table's schema.
func (n *names) index(suffix, of, column string) string {
	return fmt.Sprintf("\n\tIF to_regclass('%s') IS NULL THEN\n\t\tCREATE INDEX %s ON %s (%s);\n\tEND IF;",
		n.qualified(suffix), pgx.Identifier{n.base + suffix}.Sanitize(), n.qualified(of), column)
}

// function creates the PL/pgSQL function <table><suffix>(params) with
// body, or replaces one of its input types whose body is not this one
// (which needs the right to: a role without it uses the function a DBA
// made, as long as its body is this one).
func (n *names) function(suffix, params, returns, body string) string {
	var types []string
	for _, p := range strings.Split(params, ",") {
		if f := strings.Fields(p); f[0] != "OUT" {
			types = append(types, strings.Join(f[1:], " "))
		}
	}
	name := n.qualified(suffix)
	return fmt.Sprintf("\n\tIF NOT EXISTS (SELECT FROM pg_proc WHERE oid = to_regprocedure('%s(%s)')\n\t\tAND prosrc = $body$%s$body$) THEN"+
		"\n\t\tCREATE OR REPLACE FUNCTION %s(\n\t\t\t%s)%s\n\t\tLANGUAGE plpgsql AS $fn$%s$fn$;\n\tEND IF;",
		name, strings.Join(types, ", "), body, name, params, returns, body)
}

// ensure makes the parts given that the store has not made yet, in one
// query (one transaction, one round trip), and records them. Nodes that
// start together may do it at the same time: the advisory lock makes
// them take turns, and a unique violation (from a node that does not take
// the lock) means that another node created an object first, so it
// tries again, finding it there. Its errors wrap strategy.ErrNotSent.
func (s *Store) ensure(ctx context.Context, parts ...*part) error {
	if !slices.ContainsFunc(parts, func(p *part) bool { return !p.ready.Load() }) {
		return nil
	}
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
	var missing []*part
	var sql, what []string
	for _, p := range parts {
		if !p.ready.Load() {
			missing, sql, what = append(missing, p), append(sql, p.sql), append(what, p.what)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	pool, err := s.getPool()
	if err != nil {
		return err
	}
	for range 3 {
		// One simple-protocol query: its statements run in one implicit
		// transaction, which holds the advisory lock until it ends.
		if _, err = pool.Exec(ctx, strings.Join(sql, "")); err == nil {
			for _, p := range missing {
				p.ready.Store(true)
			}
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" { // unique_violation
			break
		}
	}
	return errs.NotSent(fmt.Errorf("creating %s: %w", strings.Join(what, " and "), err))
}
