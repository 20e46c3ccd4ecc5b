package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// rateStatements are the SQL texts of a store's rates (see
// strategy.Rater): their part of the schema, made by the first rate call
// as the slots' part is, the calls of the rate and give-back functions,
// and the purge of what has passed.
type rateStatements struct {
	schema, rate, giveBack, purgeTATs, purgeIDs string
}

// newRateStatements makes the rates' statements from the names of the
// table: <table>_rates, <table>_rate_ids, and the functions <table>_rate
// and <table>_give_back.
func newRateStatements(n *names) *rateStatements {
	r := strings.NewReplacer(
		"{rates}", n.qualified(n.base+"_rates"),
		"{rate_ids}", n.qualified(n.base+"_rate_ids"),
		"{rate}", n.qualified(n.base+"_rate"),
		"{give_back}", n.qualified(n.base+"_give_back"),
		"{rates_tat}", pgx.Identifier{n.base + "_rates_tat"}.Sanitize(),
		"{rates_tat_ref}", n.qualified(n.base+"_rates_tat"),
		"{rate_ids_exp}", pgx.Identifier{n.base + "_rate_ids_exp"}.Sanitize(),
		"{rate_ids_exp_ref}", n.qualified(n.base+"_rate_ids_exp"),
		"{schema_lock}", fmt.Sprint(n.schemaLock),
	)
	return &rateStatements{
		schema: strings.NewReplacer(
			"{rate_body}", r.Replace(rateBodySQL),
			"{give_back_body}", r.Replace(giveBackBodySQL),
		).Replace(r.Replace(rateSchemaSQL)),
		rate:      r.Replace(`SELECT ok, tat, now_us FROM {rate}($1, $2, $3, $4, $5, $6, $7, $8)`),
		giveBack:  r.Replace(`SELECT {give_back}($1, $2, $3, $4, $5)`),
		purgeTATs: r.Replace(purgeTATsSQL),
		purgeIDs:  r.Replace(purgeRateIDsSQL),
	}
}

// rateSchemaSQL creates what rates need, when missing, as slotSchemaSQL
// does, under the schema's lock, by the first rate call only.
//
// TATs: one row per (namespace, key, window), the TAT in Unix
// microseconds by the server's clock, until a purge finds it has passed
// (the key then has its whole burst, as a key without a row does). ID
// records: one row per ID of a namespace, what it did ('t' took a turn
// of inc_us, 'r' was refused, 'g' gave it back), until it expires.
const rateSchemaSQL = `
SELECT pg_advisory_xact_lock({schema_lock});
DO $do$
BEGIN
	IF to_regclass('{rates}') IS NULL THEN
		CREATE TABLE {rates} (
			namespace bytea NOT NULL,
			key bytea NOT NULL,
			window_ms bigint NOT NULL,
			tat_us bigint NOT NULL,
			PRIMARY KEY (namespace, key, window_ms)
		) WITH (fillfactor = 80);
	END IF;
	IF to_regclass('{rates_tat_ref}') IS NULL THEN
		CREATE INDEX {rates_tat} ON {rates} (tat_us);
	END IF;
	IF to_regclass('{rate_ids}') IS NULL THEN
		CREATE TABLE {rate_ids} (
			namespace bytea NOT NULL,
			id bytea NOT NULL,
			state "char" NOT NULL,
			inc_us bigint NOT NULL,
			expires_us bigint NOT NULL,
			PRIMARY KEY (namespace, id)
		);
	END IF;
	IF to_regclass('{rate_ids_exp_ref}') IS NULL THEN
		CREATE INDEX {rate_ids_exp} ON {rate_ids} (expires_us);
	END IF;
	IF NOT EXISTS (SELECT FROM pg_proc WHERE oid = to_regprocedure('{rate}(bytea, bytea, bigint, bytea, bigint, bigint, boolean, bigint)')
		AND prosrc = $body${rate_body}$body$) THEN
		CREATE OR REPLACE FUNCTION {rate}(
			p_namespace bytea, p_key bytea, p_window_ms bigint, p_id bytea,
			p_inc bigint, p_tol bigint, p_force boolean, p_id_life bigint,
			OUT ok boolean, OUT tat bigint, OUT now_us bigint)
		LANGUAGE plpgsql AS $fn${rate_body}$fn$;
	END IF;
	IF NOT EXISTS (SELECT FROM pg_proc WHERE oid = to_regprocedure('{give_back}(bytea, bytea, bigint, bytea, bigint)')
		AND prosrc = $body${give_back_body}$body$) THEN
		CREATE OR REPLACE FUNCTION {give_back}(
			p_namespace bytea, p_key bytea, p_window_ms bigint, p_id bytea, p_id_life bigint)
		RETURNS boolean
		LANGUAGE plpgsql AS $fn${give_back_body}$fn$;
	END IF;
END
$do$;
`

// rateBodySQL is the body of the function that decides one request under
// a rate (see strategy.Rater), as the Redis script does. The upsert of the
// key's row, which creates it or locks it, makes the requests of a key
// take turns, even with a purge deleting the row meanwhile (the upsert
// then inserts it again); the clock is read once the row is held, so the
// turns' clocks are in their order. An ID's record (p_id, unless NULL)
// answers what the ID did, as in the Redis script. The TAT and the clock
// are Unix microseconds.
const rateBodySQL = `
#variable_conflict use_column
DECLARE
	rec_state "char";
	rec_found boolean;
	due bigint;
BEGIN
	INSERT INTO {rates} AS t (namespace, key, window_ms, tat_us)
	VALUES (p_namespace, p_key, p_window_ms, 0)
	ON CONFLICT (namespace, key, window_ms) DO UPDATE SET tat_us = t.tat_us
	RETURNING t.tat_us INTO tat;
	now_us := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	IF p_id IS NOT NULL THEN
		SELECT r.state INTO rec_state FROM {rate_ids} r
		WHERE r.namespace = p_namespace AND r.id = p_id AND r.expires_us > now_us;
		rec_found := FOUND;
		IF rec_found AND (NOT p_force OR rec_state <> 'r') THEN
			ok := rec_state = 't';
			RETURN;
		END IF;
	END IF;
	due := greatest(tat, now_us) + p_inc;
	ok := p_force OR due - now_us <= p_tol;
	IF ok THEN
		UPDATE {rates} t SET tat_us = due
		WHERE t.namespace = p_namespace AND t.key = p_key AND t.window_ms = p_window_ms;
		tat := due;
	END IF;
	IF p_id IS NOT NULL THEN
		INSERT INTO {rate_ids} AS r (namespace, id, state, inc_us, expires_us)
		VALUES (p_namespace, p_id, CASE WHEN ok THEN 't' ELSE 'r' END, p_inc, now_us + p_id_life)
		ON CONFLICT (namespace, id) DO UPDATE
		SET state = excluded.state, inc_us = excluded.inc_us, expires_us = excluded.expires_us;
	END IF;
END
`

// giveBackBodySQL is the body of the function that takes back the turn
// that the ID p_id took: it holds the key's row as the rate function
// does, records the ID as given back, and when it had taken a turn moves
// the TAT back by its increment. It returns whether it gave a turn back.
const giveBackBodySQL = `
#variable_conflict use_column
DECLARE
	v_tat bigint;
	now_us bigint;
	rec_state "char";
	rec_inc bigint;
BEGIN
	INSERT INTO {rates} AS t (namespace, key, window_ms, tat_us)
	VALUES (p_namespace, p_key, p_window_ms, 0)
	ON CONFLICT (namespace, key, window_ms) DO UPDATE SET tat_us = t.tat_us
	RETURNING t.tat_us INTO v_tat;
	now_us := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
	SELECT r.state, r.inc_us INTO rec_state, rec_inc FROM {rate_ids} r
	WHERE r.namespace = p_namespace AND r.id = p_id AND r.expires_us > now_us;
	IF FOUND AND rec_state = 'g' THEN
		RETURN false;
	END IF;
	INSERT INTO {rate_ids} AS r (namespace, id, state, inc_us, expires_us)
	VALUES (p_namespace, p_id, 'g', 0, now_us + p_id_life)
	ON CONFLICT (namespace, id) DO UPDATE SET state = 'g', inc_us = 0, expires_us = excluded.expires_us;
	IF rec_state IS DISTINCT FROM 't' THEN
		RETURN false;
	END IF;
	UPDATE {rates} t SET tat_us = v_tat - rec_inc
	WHERE t.namespace = p_namespace AND t.key = p_key AND t.window_ms = p_window_ms;
	RETURN true;
END
`

// purgeTATsSQL deletes up to $1 TATs that have passed by the server's
// clock, skipping those a rate call holds; purgeRateIDsSQL up to $1 ID
// records that expired.
const (
	purgeTATsSQL = `
DELETE FROM {rates} WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM {rates}
	WHERE tat_us <= floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint
	LIMIT $1 FOR UPDATE SKIP LOCKED))`
	purgeRateIDsSQL = `
DELETE FROM {rate_ids} WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM {rate_ids}
	WHERE expires_us <= floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint
	LIMIT $1 FOR UPDATE SKIP LOCKED))`
)

// acquireRates returns a connection as acquire does, with the rates'
// part of the schema in place too.
func (s *Store) acquireRates(ctx context.Context) (*pgxpool.Conn, error) {
	return s.acquirePart(ctx, s.rateSQL.schema, &s.ratesReady, "the rates tables")
}

// Rate decides one request of key under a rate, by the server's clock, in
// one call of the table's rate function: one round trip (see
// strategy.Rater and rateBodySQL). Bad input is refused, before anything
// is sent, with an error that wraps strategy.ErrRejected. pgx never
// resends a query; an error wraps strategy.ErrNotSent when the call
// surely never reached the server.
func (s *Store) Rate(ctx context.Context, namespace, key, id string, r strategy.RateRequest) (_ strategy.RateReply, err error) {
	defer errs.Rate(&err, namespace)
	if err := strategy.CheckRate(id, false, r); err != nil {
		return strategy.RateReply{}, err
	}
	conn, err := s.acquireRates(ctx)
	if err != nil {
		return strategy.RateReply{}, err
	}
	defer conn.Release()
	var idArg []byte // NULL without an ID
	if id != "" {
		idArg = stored(id, maxStoredID)
	}
	var rep strategy.RateReply
	err = conn.QueryRow(ctx, s.rateSQL.rate,
		stored(namespace, maxStoredNamespace), stored(key, maxStoredKey), r.Window.Milliseconds(), idArg,
		r.Increment.Microseconds(), r.Tolerance.Microseconds(), r.Force, strategy.RateIDLife.Microseconds(),
	).Scan(&rep.OK, &rep.TAT, &rep.Now)
	if err != nil {
		return strategy.RateReply{}, s.sent(err)
	}
	rep.TAT *= 1e3
	rep.Now *= 1e3
	return rep, nil
}

// GiveBack takes back the turn that the Rate named id took, in one call
// of the table's give-back function (see strategy.Rater). Bad input is
// refused as by Rate, an empty id included. Giving back twice gives back
// once, so it may be sent again after any failure.
func (s *Store) GiveBack(ctx context.Context, namespace, key, id string, window time.Duration) (err error) {
	defer errs.GiveBack(&err, namespace)
	if err := strategy.CheckRate(id, true, strategy.RateRequest{Window: window}); err != nil {
		return err
	}
	conn, err := s.acquireRates(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, s.rateSQL.giveBack,
		stored(namespace, maxStoredNamespace), stored(key, maxStoredKey), window.Milliseconds(),
		stored(id, maxStoredID), strategy.RateIDLife.Microseconds())
	return s.sent(err)
}

// purgeRates deletes, in the purge's transaction, up to purgeChunk TATs
// that have passed and as many expired ID records, and returns the larger
// count, by which the purge knows whether more are left. A store that
// never decided a rate leaves them to the stores that do.
func (s *Store) purgeRates(ctx context.Context, tx pgx.Tx) (int64, error) {
	if !s.ratesReady.Load() {
		return 0, nil
	}
	var most int64
	for _, q := range []string{s.rateSQL.purgeTATs, s.rateSQL.purgeIDs} {
		tag, err := tx.Exec(ctx, q, purgeChunk)
		if err != nil {
			return most, err
		}
		most = max(most, tag.RowsAffected())
	}
	return most, nil
}

// RateKeys returns how many keys' TATs of a namespace the table holds,
// passed or not (a purge drops those that passed), for tests and tools.
func (s *Store) RateKeys(ctx context.Context, namespace string) (int, error) {
	conn, err := s.acquireRates(ctx)
	if err != nil {
		return 0, fmt.Errorf("counting rate keys: %w", err)
	}
	defer conn.Release()
	var n int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM "+s.names.qualified(s.names.base+"_rates")+" WHERE namespace = $1",
		stored(namespace, maxStoredNamespace)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting rate keys: %w", s.sent(err))
	}
	return n, nil
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher: its
// batch hit function decides hits' rates (see hitsBodySQL), and its push
// takes a Batch's rates (see pushRatesSQL).
func (*Store) DecidesRatesInBatches() {}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
