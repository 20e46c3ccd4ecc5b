package postgres

import (
	"fmt"
	"strings"
)

// statements are the SQL texts of a store, made once per store from its
// table's names. Names are quoted identifiers that the table setting's
// check (checkTable) allows; every value, client keys first, travels as a
// bound parameter.
type statements struct {
	schema        string
	push          string
	fetch         string
	reset         string
	hit           string
	purgeCounters string
	purgeIDs      string
}

// expiryMarginMs keeps a counter a little past the end of its life as a
// previous window (start + 2*size), so that clock skew between nodes does
// not purge it while a node still reads it. Redis keeps the same margin.
const expiryMarginMs = 1000

func newStatements(n *names) *statements {
	r := strings.NewReplacer(
		"{counters}", n.counters,
		"{ids}", n.ids,
		"{hit}", n.hit,
		"{counters_exp}", n.countersExpIdx,
		"{ids_exp}", n.idsExpIdx,
		"{counters_exp_ref}", n.countersExpRef,
		"{ids_exp_ref}", n.idsExpRef,
		"{schema_lock}", fmt.Sprint(n.schemaLock),
		"{margin}", fmt.Sprint(expiryMarginMs),
	)
	return &statements{
		// The body goes in twice: to compare with the function's, and to
		// create it.
		schema:        strings.ReplaceAll(r.Replace(schemaSQL), "{hit_body}", r.Replace(hitBodySQL)),
		push:          r.Replace(pushSQL),
		fetch:         r.Replace(fetchSQL),
		reset:         r.Replace(resetSQL),
		hit:           r.Replace(hitSQL),
		purgeCounters: r.Replace(purgeCountersSQL),
		purgeIDs:      r.Replace(purgeIDsSQL),
	}
}

// schemaSQL creates what the store needs, when missing, in one implicit
// transaction (it is sent as one simple query) that first takes the
// schema's advisory lock, so that nodes starting together take turns. It
// checks for each object before it creates it, so that once they exist it
// takes no lock on the tables: CREATE ... IF NOT EXISTS would lock a table
// that exists (CREATE INDEX takes a share lock on it), and deadlock with
// pushes under way. It replaces the hit function only when its body is
// not this one, so that a role that does not own the objects (a DBA made
// them) can use them as they are.
//
// Counters: one row per (namespace, key, window size, window start), in
// milliseconds, keyed by all four, with its value and when it expires
// (Unix milliseconds). Namespaces and keys are bytea: any bytes, with no
// encoding to get wrong. expires_at never changes once a row is written
// (it depends on the window only), so updates of a value leave the
// indexes alone and, with the free space fillfactor keeps, stay on their
// page (HOT updates).
//
// IDs: one row per batch or hit ID applied, per namespace, until it
// expires.
//
// The hit function applies one synchronous hit (see hitBodySQL).
const schemaSQL = `
SELECT pg_advisory_xact_lock({schema_lock});
DO $do$
BEGIN
	IF to_regclass('{counters}') IS NULL THEN
		CREATE TABLE {counters} (
			namespace bytea NOT NULL,
			key bytea NOT NULL,
			size_ms bigint NOT NULL,
			start_ms bigint NOT NULL,
			value double precision NOT NULL,
			expires_at bigint NOT NULL,
			PRIMARY KEY (namespace, key, size_ms, start_ms)
		) WITH (fillfactor = 80);
	END IF;
	IF to_regclass('{counters_exp_ref}') IS NULL THEN
		CREATE INDEX {counters_exp} ON {counters} (expires_at);
	END IF;
	IF to_regclass('{ids}') IS NULL THEN
		CREATE TABLE {ids} (
			namespace bytea NOT NULL,
			id bytea NOT NULL,
			expires_at bigint NOT NULL,
			PRIMARY KEY (namespace, id)
		);
	END IF;
	IF to_regclass('{ids_exp_ref}') IS NULL THEN
		CREATE INDEX {ids_exp} ON {ids} (expires_at);
	END IF;
	IF NOT EXISTS (SELECT FROM pg_proc WHERE oid = to_regprocedure('{hit}(bytea, bytea, bytea, bigint, boolean,
		bigint[], bigint[], double precision[], double precision[], double precision[])') AND prosrc = $body${hit_body}$body$) THEN
		CREATE OR REPLACE FUNCTION {hit}(
			p_namespace bytea, p_key bytea, p_id bytea, p_id_expires bigint, p_undo boolean,
			p_sizes bigint[], p_starts bigint[], p_values double precision[],
			p_maxes double precision[], p_weights double precision[],
			OUT rejected integer, OUT currents double precision[], OUT previouses double precision[])
		LANGUAGE plpgsql AS $fn${hit_body}$fn$;
	END IF;
END
$do$;
`

// hitBodySQL is the body of the function that applies one synchronous hit
// to up to 16 windows of one (namespace, key), atomically, as the Redis hit
// script does, in the rate limiter's order (Kong's).
//
// With an ID (p_id not NULL), it first records the ID, as a batch of that
// ID and namespace does; if the ID was there already (the same hit sent
// twice, or its diffs pushed as a batch first), it applies nothing: it
// reads the counts and decides on them as they are, and undoes nothing.
//
// Then, window by window in the order given, while no window has rejected
// the hit, it adds the window's value to its current counter (an upsert,
// which also locks the row until the hit ends, so that concurrent hits of
// a key take turns); once one has, or for a value of 0, it only reads. It
// reads the previous counter, and the first window whose rate, current +
// previous * weight, exceeds its limit rejects the hit: a limit of
// +Infinity never does, one of -Infinity always does. With p_undo, the
// increments of a rejected hit are taken back before the function returns,
// in the same transaction, so no other client ever sees them. A missing
// counter counts 0.
//
// It returns the 0-based index of the window that rejected the hit, or -1,
// and each window's current and previous counts, in order.
const hitBodySQL = `
#variable_conflict use_column
DECLARE
	n integer := cardinality(p_sizes);
	apply boolean := true;
	rej integer := 0;
	c double precision;
	p double precision;
	m double precision;
BEGIN
	IF p_id IS NOT NULL THEN
		INSERT INTO {ids} (namespace, id, expires_at) VALUES (p_namespace, p_id, p_id_expires)
		ON CONFLICT DO NOTHING;
		apply := FOUND;
	END IF;
	currents := array_fill(0::double precision, ARRAY[n]);
	previouses := array_fill(0::double precision, ARRAY[n]);
	FOR i IN 1..n LOOP
		c := NULL;
		IF apply AND rej = 0 AND p_values[i] <> 0 THEN
			INSERT INTO {counters} AS t (namespace, key, size_ms, start_ms, value, expires_at)
			VALUES (p_namespace, p_key, p_sizes[i], p_starts[i], p_values[i], p_starts[i] + 2 * p_sizes[i] + {margin})
			ON CONFLICT (namespace, key, size_ms, start_ms) DO UPDATE SET value = t.value + excluded.value
			RETURNING t.value INTO c;
		ELSE
			SELECT t.value INTO c FROM {counters} t
			WHERE t.namespace = p_namespace AND t.key = p_key AND t.size_ms = p_sizes[i] AND t.start_ms = p_starts[i];
		END IF;
		p := NULL;
		SELECT t.value INTO p FROM {counters} t
		WHERE t.namespace = p_namespace AND t.key = p_key AND t.size_ms = p_sizes[i] AND t.start_ms = p_starts[i] - p_sizes[i];
		c := coalesce(c, 0);
		p := coalesce(p, 0);
		currents[i] := c;
		previouses[i] := p;
		m := p_maxes[i];
		IF rej = 0 AND m <> 'Infinity' AND (m = '-Infinity' OR c + p * p_weights[i] > m) THEN
			rej := i;
		END IF;
	END LOOP;
	IF apply AND p_undo AND rej > 0 THEN
		-- Every window up to the one that rejected was incremented.
		FOR i IN 1..rej LOOP
			IF p_values[i] <> 0 THEN
				UPDATE {counters} t SET value = t.value - p_values[i]
				WHERE t.namespace = p_namespace AND t.key = p_key AND t.size_ms = p_sizes[i] AND t.start_ms = p_starts[i]
				RETURNING t.value INTO c;
				currents[i] := c;
			END IF;
		END LOOP;
	END IF;
	rejected := rej - 1;
END
`

// pushSQL applies one batch, at most once per (namespace, batch ID), in
// one statement, so atomically: the first CTE records the ID, and only if
// that inserted a row do the diffs reach the counters. A retry of a batch
// that was applied finds the ID and applies nothing; a retry of one that
// failed finds nothing, as the failed statement recorded nothing either.
// A concurrent push of the same ID waits for the first to end, then finds
// its ID (or records it, if the first failed).
//
// The diffs come as four arrays ($4 keys, $5 sizes and $6 starts in
// milliseconds, $7 values), one counter each: PushDiffs sums the diffs of
// one counter first (an upsert may not touch a row twice), and sorts them
// in key order, which the upsert follows, so that concurrent pushes lock
// the rows they share in the same order rather than deadlock. (Sorting
// and summing on the client keeps that work off the shared server.) $1 is
// the namespace, $2 the batch ID, $3 when the ID expires.
const pushSQL = `
WITH marker AS (
	INSERT INTO {ids} (namespace, id, expires_at) VALUES ($1, $2, $3)
	ON CONFLICT DO NOTHING
	RETURNING 1
)
INSERT INTO {counters} AS t (namespace, key, size_ms, start_ms, value, expires_at)
SELECT $1, d.key, d.size_ms, d.start_ms, d.value, d.start_ms + 2 * d.size_ms + {margin}
FROM unnest($4::bytea[], $5::bigint[], $6::bigint[], $7::double precision[]) AS d(key, size_ms, start_ms, value)
WHERE EXISTS (SELECT FROM marker)
ON CONFLICT (namespace, key, size_ms, start_ms) DO UPDATE SET value = t.value + excluded.value`

// fetchSQL reads the counters of every key asked ($2) in the windows
// asked ($3 sizes and $4 starts, in milliseconds: the current and the
// previous window of each size), with one primary key lookup per key,
// which reads only that key's rows: its cost grows with the number of
// keys asked, never with the size of the table. The lookup is a LATERAL
// subquery with OFFSET 0, which the planner cannot merge into a join, so
// that no statistics (stale ones after the table grew fast, say) can turn
// it into a scan of a whole namespace or window. A size and a start of
// different windows may match a counter that was not asked for: the caller
// drops it. It returns, for each counter found, the 1-based index of its
// key in the array, its window and its value.
const fetchSQL = `
SELECT k.i, c.size_ms, c.start_ms, c.value
FROM unnest($2::bytea[]) WITH ORDINALITY AS k(key, i)
CROSS JOIN LATERAL (
	SELECT t.size_ms, t.start_ms, t.value FROM {counters} t
	WHERE t.namespace = $1 AND t.key = k.key AND t.size_ms = ANY($3::bigint[]) AND t.start_ms = ANY($4::bigint[])
	OFFSET 0
) c`

// resetSQL sets the counters of one key ($2) of the windows given ($3
// sizes and $4 starts, in milliseconds, each once) to 0, creating the
// missing ones, so that every node that fetches them takes the reset.
const resetSQL = `
INSERT INTO {counters} AS t (namespace, key, size_ms, start_ms, value, expires_at)
SELECT $1, $2, w.size_ms, w.start_ms, 0, w.start_ms + 2 * w.size_ms + {margin}
FROM unnest($3::bigint[], $4::bigint[]) AS w(size_ms, start_ms)
ORDER BY w.size_ms, w.start_ms
ON CONFLICT (namespace, key, size_ms, start_ms) DO UPDATE SET value = 0`

// hitSQL calls the hit function.
const hitSQL = `SELECT rejected, currents, previouses FROM {hit}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

// purgeCountersSQL and purgeIDsSQL delete up to $2 rows that expired
// before $1 (Unix milliseconds), found through the expires_at index and
// deleted by their physical address.
const (
	purgeCountersSQL = `
DELETE FROM {counters} WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM {counters} WHERE expires_at < $1 LIMIT $2))`
	purgeIDsSQL = `
DELETE FROM {ids} WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM {ids} WHERE expires_at < $1 LIMIT $2))`
)
