package postgres

import (
	"fmt"
	"strings"
)

// statements are the SQL texts of a store's calls, made once per store
// from its table's names. Names are quoted identifiers that the table
// setting's check (checkTable) allows; every value, client keys first,
// travels as a bound parameter.
type statements struct {
	push, pushRates, nearPush, nearPushRates, fetch, reset string
	hitBatch, acquire, renew, release                      string
	setBans, getBans, attend, mark, readNear               string
}

// expiryMarginMs keeps a counter a little past the end of its life as a
// previous window (start + 2*size), so that clock skew between nodes does
// not purge it while a node still reads it. Redis keeps the same margin.
const expiryMarginMs = 1000

// placeholders replaces the placeholders of the SQL texts: {counters},
// the table, and {<suffix>}, the object <table>_<suffix> in its schema;
// {margin} is expiryMarginMs, {bound} maxNearMarks.
func (n *names) placeholders() *strings.Replacer {
	args := []string{"{counters}", n.counters, "{margin}", fmt.Sprint(expiryMarginMs), "{bound}", fmt.Sprint(maxNearMarks)}
	for _, suffix := range []string{"ids", "hits", "slots", "acquire", "renew", "release", "bans", "banver", "set_bans",
		"fleet", "rates", "near", "nearver"} {
		args = append(args, "{"+suffix+"}", n.qualified("_"+suffix))
	}
	return strings.NewReplacer(args...)
}

func newStatements(n *names, r *strings.Replacer) *statements {
	s := &statements{
		push:      r.Replace(pushSQL),
		pushRates: r.Replace(strings.Replace(pushSQL, "\n)\n", ratedSQL+"\n", 1)),
		fetch:     r.Replace(fetchSQL),
		reset:     r.Replace(resetSQL),
		hitBatch: r.Replace(`SELECT rejected, currents, previouses, rate_ok, rate_tats, now_us
FROM {hits}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)`),
		acquire:  r.Replace(`SELECT held, ok FROM {acquire}($1, $2, $3, $4, $5, $6)`),
		renew:    r.Replace(`SELECT {renew}($1, $2, $3, $4, $5)`),
		release:  r.Replace(`SELECT {release}($1, $2, $3, $4)`),
		setBans:  r.Replace(`SELECT {set_bans}($1, $2, $3, $4, $5)`),
		getBans:  r.Replace(getBansSQL),
		attend:   r.Replace(attendSQL),
		mark:     r.Replace(markOnlySQL()),
		readNear: r.Replace(readNearSQL),
	}
	s.nearPush = markingPush(s.push, 8, n, r)
	s.nearPushRates = markingPush(s.pushRates, 11, n, r)
	return s
}

// hitsBodySQL is the body of the function that applies a batch of
// synchronous hits of one namespace, atomically and in order, each
// deciding as if the hits were sent one after the
// other, at the cost of two writes and a read per counter, however many
// hits share it.
//
// With an ID (p_id not NULL), it first records it, as a batch of diffs of
// that ID and namespace does; if the ID was there already (the same batch
// sent twice, or its diffs pushed as a batch first), it applies nothing: it
// reads the counts and decides every hit on them as they are.
//
// The counters come once each, in arrays sorted by key, size and start
// (p_ckeys, p_csizes, p_cstarts in milliseconds; p_cwrite marks those that
// some hit increments), and the hits' windows, flattened, refer to them by
// 1-based index (p_cur, p_prev), with their increments, limits and
// weights; p_nwin gives each hit's number of windows and p_undo whether to
// take a rejected hit's increments back. When it applies the batch, one
// upsert first locks the counters that may be written, creating the
// missing ones at 0, in the arrays' order (so concurrent batches and
// pushes lock shared rows in one order, and hits of a key take turns);
// then one query reads every counter, each by its primary key; the hits
// are decided on running counts in the arrays, in Kong's order (a rejected
// hit with undo has the counts it found restored at once); and one upsert
// writes the final count of every counter that changed. A counter the
// first upsert made that no hit incremented is deleted, so that a window
// after the one that rejected is never made.
//
// Hits with a rate (see strategy.RateBatcher) are decided by the server's
// clock, once their keys' TAT rows (p_rkeys and p_rwins, each once, in
// the order of key and window, locked after the counters) are held, as the
// rate function holds them: the rate first (p_hrate gives each hit's
// 1-based TAT, or 0, with p_hinc and p_htol its increment and tolerance
// in microseconds); a hit it refuses touches no counter; one a window
// then rejects leaves the TAT as it was; each TAT that moved is written
// once at the end.
//
// It returns each hit's rejecting window (0-based) or -1, and each window's
// current and previous counts, flattened as the windows came, and with
// rates whether each hit's rate admitted it, its TAT after the hit, and
// the server's now.
const hitsBodySQL = `
#variable_conflict use_column
DECLARE
	nh integer := cardinality(p_undo);
	nw integer := cardinality(p_cur);
	apply boolean := true;
	val double precision[];
	delta double precision[];
	saved_val double precision[];
	saved_delta double precision[];
	w integer := 0;
	first integer;
	rej integer;
	cidx integer;
	pidx integer;
	v double precision;
	m double precision;
	tat bigint[];
	moved boolean[];
	ri integer;
	due bigint;
	admit boolean;
	made_keys bytea[];
	made_sizes bigint[];
	made_starts bigint[];
BEGIN
	IF p_id IS NOT NULL THEN
		INSERT INTO {ids} (namespace, id, expires_at) VALUES (p_namespace, p_id, p_id_expires)
		ON CONFLICT DO NOTHING;
		apply := FOUND;
	END IF;
	IF apply THEN
		WITH locked AS (
			INSERT INTO {counters} AS t (namespace, key, size_ms, start_ms, value, expires_at)
			SELECT p_namespace, p_ckeys[j], p_csizes[j], p_cstarts[j], 0, p_cstarts[j] + 2 * p_csizes[j] + {margin}
			FROM generate_subscripts(p_csizes, 1) AS j
			WHERE p_cwrite[j]
			ORDER BY j
			ON CONFLICT (namespace, key, size_ms, start_ms) DO UPDATE SET value = t.value
			RETURNING t.key, t.size_ms, t.start_ms, t.xmax = 0 AS made
		)
		SELECT array_agg(key) FILTER (WHERE made), array_agg(size_ms) FILTER (WHERE made),
			array_agg(start_ms) FILTER (WHERE made)
		INTO made_keys, made_sizes, made_starts FROM locked;
	END IF;
	IF cardinality(p_rkeys) > 0 THEN
		INSERT INTO {rates} AS t (namespace, key, window_ms, tat_us)
		SELECT p_namespace, p_rkeys[j], p_rwins[j], 0
		FROM generate_subscripts(p_rkeys, 1) AS j
		ORDER BY j
		ON CONFLICT (namespace, key, window_ms) DO UPDATE SET tat_us = t.tat_us;
		now_us := floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
		SELECT array_agg(t.tat_us ORDER BY k.j) INTO tat
		FROM unnest(p_rkeys, p_rwins) WITH ORDINALITY AS k(key, window_ms, j)
		JOIN {rates} t ON t.namespace = p_namespace AND t.key = k.key AND t.window_ms = k.window_ms;
		moved := array_fill(false, ARRAY[cardinality(p_rkeys)]);
		rate_ok := array_fill(false, ARRAY[nh]);
		rate_tats := array_fill(0::bigint, ARRAY[nh]);
	END IF;
	SELECT array_agg(coalesce(r.value, 0) ORDER BY k.j) INTO val
	FROM unnest(p_ckeys, p_csizes, p_cstarts) WITH ORDINALITY AS k(key, size_ms, start_ms, j)
	LEFT JOIN LATERAL (
		SELECT t.value FROM {counters} t
		WHERE t.namespace = p_namespace AND t.key = k.key AND t.size_ms = k.size_ms AND t.start_ms = k.start_ms
		OFFSET 0
	) r ON true;
	delta := array_fill(0::double precision, ARRAY[cardinality(p_csizes)]);
	rejected := array_fill(-1, ARRAY[nh]);
	currents := array_fill(0::double precision, ARRAY[nw]);
	previouses := array_fill(0::double precision, ARRAY[nw]);
	FOR h IN 1..nh LOOP
		rej := 0;
		first := w;
		ri := coalesce(p_hrate[h], 0);
		admit := true;
		IF ri > 0 THEN
			due := greatest(tat[ri], now_us) + p_hinc[h];
			admit := due - now_us <= p_htol[h];
		END IF;
		FOR i IN 1..p_nwin[h] LOOP
			w := w + 1;
			cidx := p_cur[w];
			pidx := p_prev[w];
			v := p_values[w];
			saved_val[i] := val[cidx];
			saved_delta[i] := delta[cidx];
			IF apply AND admit AND rej = 0 AND v <> 0 THEN
				val[cidx] := val[cidx] + v;
				delta[cidx] := delta[cidx] + v;
			END IF;
			currents[w] := val[cidx];
			previouses[w] := val[pidx];
			m := p_maxes[w];
			IF admit AND rej = 0 AND m <> 'Infinity' AND (m = '-Infinity' OR val[cidx] + val[pidx] * p_weights[w] > m) THEN
				rej := i;
			END IF;
		END LOOP;
		IF apply AND p_undo[h] AND rej > 0 THEN
			FOR i IN REVERSE rej..1 LOOP
				cidx := p_cur[first + i];
				val[cidx] := saved_val[i];
				delta[cidx] := saved_delta[i];
			END LOOP;
			FOR i IN 1..rej LOOP
				currents[first + i] := val[p_cur[first + i]];
			END LOOP;
		END IF;
		IF ri > 0 THEN
			IF admit AND apply AND rej = 0 THEN
				tat[ri] := due;
				moved[ri] := true;
			END IF;
			rate_ok[h] := admit;
			rate_tats[h] := tat[ri];
		END IF;
		rejected[h] := rej - 1;
	END LOOP;
	IF apply AND cardinality(p_rkeys) > 0 THEN
		UPDATE {rates} t SET tat_us = tat[k.j]
		FROM generate_subscripts(p_rkeys, 1) AS k(j)
		WHERE moved[k.j] AND t.namespace = p_namespace AND t.key = p_rkeys[k.j] AND t.window_ms = p_rwins[k.j];
	END IF;
	IF apply THEN
		INSERT INTO {counters} AS t (namespace, key, size_ms, start_ms, value, expires_at)
		SELECT p_namespace, p_ckeys[j], p_csizes[j], p_cstarts[j], val[j], p_cstarts[j] + 2 * p_csizes[j] + {margin}
		FROM generate_subscripts(p_csizes, 1) AS j
		WHERE delta[j] <> 0
		ORDER BY j
		ON CONFLICT (namespace, key, size_ms, start_ms) DO UPDATE SET value = excluded.value;
		-- A counter made to be locked that no hit incremented (a window
		-- after the one that rejected) is not kept: no hit made it.
		IF made_keys IS NOT NULL AND EXISTS (SELECT FROM generate_subscripts(p_csizes, 1) AS j WHERE p_cwrite[j] AND delta[j] = 0) THEN
			DELETE FROM {counters} t
			USING unnest(made_keys, made_sizes, made_starts) AS k(key, size_ms, start_ms)
			WHERE t.namespace = p_namespace AND t.key = k.key AND t.size_ms = k.size_ms
				AND t.start_ms = k.start_ms AND t.value = 0;
		END IF;
	END IF;
END
`

// acquireBodySQL is the body of the function that takes a concurrency
// slot of one (namespace, key), named p_id, when fewer than p_max
// unexpired slots of the key are held, for p_lease_ms milliseconds by the
// server's clock. It returns how many slots of the key are held after it
// and whether it took the slot.
//
// It is atomic because every call for a key first takes a transaction
// advisory lock of the key (p_lock, a hash of the namespace and the key
// that the client computes: see slotLock), held until the call's
// transaction ends, so the acquisitions of a key take turns; and because
// under read committed each statement of a PL/pgSQL function reads a
// snapshot of its own, taken when it starts, so the count, made after the
// lock was granted, sees every slot that the calls before it committed (a
// transaction's commit is visible before its locks are released). A single
// SQL statement could not do it: its one snapshot would be taken before
// it waited for the lock. Under repeatable read or serializable the
// snapshot is the transaction's first, so the function refuses to run
// (the store's connections ask for read committed: see defaultParams).
// The renewals and releases of a key take its lock too, so a slot is
// never renewed after an acquisition found it expired and gave its place
// away.
//
// It deletes the key's expired slots, skipping rows that another
// transaction holds (a purge, say), so that it never waits for a row lock
// but its own: it counts only the unexpired slots anyway. A slot of p_id
// that is held is renewed, whatever the count; one that expired is taken
// anew like any other. clock_timestamp() is read once the lock is
// granted, so a call that waited for it dates its slot from when it runs.
const acquireBodySQL = `
#variable_conflict use_column
DECLARE
	now_at timestamptz;
	mine boolean;
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RAISE EXCEPTION 'taking a concurrency slot needs the read committed isolation level, not %',
			current_setting('transaction_isolation') USING ERRCODE = 'feature_not_supported';
	END IF;
	PERFORM pg_advisory_xact_lock(p_lock);
	now_at := clock_timestamp();
	DELETE FROM {slots} t WHERE t.ctid = ANY(ARRAY(
		SELECT e.ctid FROM {slots} e
		WHERE e.namespace = p_namespace AND e.key = p_key AND e.expires_at <= now_at
		FOR UPDATE SKIP LOCKED));
	SELECT count(*), coalesce(bool_or(t.id = p_id), false) INTO held, mine FROM {slots} t
	WHERE t.namespace = p_namespace AND t.key = p_key AND t.expires_at > now_at;
	IF NOT mine AND held >= p_max THEN
		ok := false;
		RETURN;
	END IF;
	INSERT INTO {slots} AS t (namespace, key, id, expires_at)
	VALUES (p_namespace, p_key, p_id, now_at + p_lease_ms * interval '1 millisecond')
	ON CONFLICT (namespace, key, id) DO UPDATE SET expires_at = excluded.expires_at;
	IF NOT mine THEN
		held := held + 1;
	END IF;
	ok := true;
END
`

// renewBodySQL is the body of the function that extends to p_lease_ms
// after the server's now the slots (p_keys[i], p_ids[i]) of a namespace
// that have not expired, and returns how many it renewed. It first takes
// the advisory locks of their keys (p_locks, sorted and each once, so that
// calls of several keys take them in one order and never deadlock), so
// that it runs between the acquisitions of those keys: a slot that an
// acquisition found expired is never renewed after it.
const renewBodySQL = `
#variable_conflict use_column
DECLARE
	l bigint;
	now_at timestamptz;
BEGIN
	FOREACH l IN ARRAY p_locks LOOP
		PERFORM pg_advisory_xact_lock(l);
	END LOOP;
	now_at := clock_timestamp();
	UPDATE {slots} t SET expires_at = now_at + p_lease_ms * interval '1 millisecond'
	FROM unnest(p_keys, p_ids) AS s(key, id)
	WHERE t.namespace = p_namespace AND t.key = s.key AND t.id = s.id AND t.expires_at > now_at;
	GET DIAGNOSTICS renewed = ROW_COUNT;
END
`

// releaseBodySQL is the body of the function that deletes the slots
// (p_keys[i], p_ids[i]) of a namespace, and returns how many it deleted.
// It takes the advisory locks of their keys first, as renewBodySQL does:
// not for the count's sake (a release only frees places) but so that the
// writers of slots all lock in one order, keys first, and a release and a
// renewal of the same slots never deadlock on their rows.
const releaseBodySQL = `
#variable_conflict use_column
DECLARE
	l bigint;
BEGIN
	FOREACH l IN ARRAY p_locks LOOP
		PERFORM pg_advisory_xact_lock(l);
	END LOOP;
	DELETE FROM {slots} t USING unnest(p_keys, p_ids) AS s(key, id)
	WHERE t.namespace = p_namespace AND t.key = s.key AND t.id = s.id;
	GET DIAGNOSTICS released = ROW_COUNT;
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

// ratedSQL turns pushSQL into the push of a batch with rates (see
// strategy.RateBatcher): a CTE after the record of the ID that, only if
// the ID was recorded, moves each TAT of $8 keys and $9 windows
// (milliseconds, each once, sorted) by $10 microseconds, the sum of the
// batch's turns of it, as forced requests do: to greatest(TAT, now) +
// increment, by the server's clock.
const ratedSQL = `
), clock AS (
	SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS now_us
), rated AS (
	INSERT INTO {rates} AS t (namespace, key, window_ms, tat_us)
	SELECT $1, r.key, r.window_ms, c.now_us + r.inc
	FROM unnest($8::bytea[], $9::bigint[], $10::bigint[]) AS r(key, window_ms, inc), clock c
	WHERE EXISTS (SELECT FROM marker)
	ON CONFLICT (namespace, key, window_ms) DO UPDATE
	SET tat_us = greatest(t.tat_us, (SELECT now_us FROM clock)) + excluded.tat_us - (SELECT now_us FROM clock)
)`

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

// setBansBodySQL is the body of the set_bans function: under a
// transaction advisory lock of the namespace (p_lock), so that the calls
// of one namespace take turns, it deletes the namespace's bans that ended
// by the server's clock, lifts the bans whose end is 0, and sets the
// others unless the table holds a later end. When anything changed it
// gives the namespace's bans a new version: one more than the last, or,
// when the namespace was at version 0 (no ban left, no lifted one that
// would not have ended; see getBansSQL), a new epoch (strategy.BanEpoch):
// the server's time in milliseconds shifted by strategy.BanEpochShift (20);
// and keeps when the latest ban it lifted would have ended; a namespace
// left without bans, and whose lifted bans would have ended, loses its
// version row.
const setBansBodySQL = `
DECLARE
	now_ms bigint;
	n bigint;
	lifted bigint;
	at_zero boolean;
BEGIN
	PERFORM pg_advisory_xact_lock(p_lock);
	now_ms := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
	DELETE FROM {bans} b WHERE b.namespace = p_namespace AND b.until_ms <= now_ms;
	at_zero := NOT EXISTS (SELECT FROM {bans} b WHERE b.namespace = p_namespace)
		AND NOT EXISTS (SELECT FROM {banver} v WHERE v.namespace = p_namespace AND v.lifted_until_ms > now_ms);
	WITH d AS (
		DELETE FROM {bans} b USING unnest(p_key_ids, p_until) AS i(key_id, until_ms)
			WHERE i.until_ms = 0 AND b.namespace = p_namespace AND b.key_id = i.key_id
			RETURNING b.until_ms)
	SELECT count(*), coalesce(max(d.until_ms), 0) INTO n, lifted FROM d;
	changed := n > 0;
	INSERT INTO {bans} AS b (namespace, key_id, key, until_ms)
		SELECT p_namespace, i.key_id, i.key, i.until_ms
		FROM unnest(p_key_ids, p_keys, p_until) AS i(key_id, key, until_ms)
		WHERE i.until_ms > now_ms
		ON CONFLICT (namespace, key_id) DO UPDATE SET until_ms = excluded.until_ms
		WHERE b.until_ms < excluded.until_ms;
	GET DIAGNOSTICS n = ROW_COUNT;
	changed := changed OR n > 0;
	IF changed THEN
		INSERT INTO {banver} AS v (namespace, version, lifted_until_ms)
			VALUES (p_namespace, now_ms << 20, lifted)
			ON CONFLICT (namespace) DO UPDATE SET
				version = CASE WHEN at_zero THEN greatest(v.version + 1, excluded.version) ELSE v.version + 1 END,
				lifted_until_ms = greatest(v.lifted_until_ms, excluded.lifted_until_ms);
	ELSIF NOT EXISTS (SELECT FROM {bans} b WHERE b.namespace = p_namespace) THEN
		DELETE FROM {banver} v WHERE v.namespace = p_namespace AND v.lifted_until_ms <= now_ms;
	END IF;
END
`

// getBansSQL reads the version of a namespace's bans ($1), 0 when none
// has not ended by the server's clock and no ban lifted would not have
// either, and, unless that version is $2, the key and end of every ban
// that ends after $3 (Unix milliseconds): one row with NULLs when there
// are none to return.
const getBansSQL = `
SELECT v.version, b.key, b.until_ms
FROM (SELECT CASE WHEN EXISTS (
		SELECT FROM {bans} WHERE namespace = $1 AND until_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
	OR EXISTS (
		SELECT FROM {banver} WHERE namespace = $1 AND lifted_until_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint)
	THEN coalesce((SELECT version FROM {banver} WHERE namespace = $1), 0) ELSE 0 END AS version) v
LEFT JOIN {bans} b ON v.version <> $2 AND b.namespace = $1 AND b.until_ms > $3`

// attendSQL records node $2 of namespace $1 until $3 milliseconds from
// now, deletes the namespace's other members that expired, and counts the
// members: the node itself and the others that have not expired. The
// statement's parts see the table as it was before it, so the node is
// counted apart, and the expired rows it deletes are never its own.
const attendSQL = `
WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
up AS (
	INSERT INTO {fleet} AS f (namespace, node, until_ms)
		SELECT $1, $2, now.ms + $3 FROM now
		ON CONFLICT (namespace, node) DO UPDATE SET until_ms = excluded.until_ms
),
gone AS (
	DELETE FROM {fleet} f USING now
		WHERE f.namespace = $1 AND f.node <> $2 AND f.until_ms <= now.ms
)
SELECT 1 + count(*) FROM {fleet} f, now
	WHERE f.namespace = $1 AND f.node <> $2 AND f.until_ms > now.ms`
