package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// maxNearMarks is the most marks of a namespace that the store keeps and
// a reader reads: the newest (see strategy.NearFeed).
const maxNearMarks = 1 << 16

// markingPush returns a push statement (pushSQL, or it with ratedSQL, whose
// last part is the upsert of the counters) that marks the keys its diffs
// bring near their limits too: the upsert becomes the CTE upserted, which
// returns the counters' new values, and markSQL follows it, its
// parameters numbered from first on.
func markingPush(push string, first int, n *names, r *strings.Replacer) string {
	at := strings.LastIndex(push, "\nINSERT INTO "+n.counters+" AS t")
	if at < 0 || !strings.HasPrefix(push, "\nWITH ") {
		panic("postgres: a push statement without the counters' upsert to mark from")
	}
	args := make([]string, 0, 12)
	for i := range 6 {
		args = append(args, fmt.Sprintf("$n%d", i+1), fmt.Sprintf("$%d", first+i))
	}
	return push[:at] + ", upserted AS (" + push[at:] + "\n\tRETURNING t.key, t.size_ms, t.start_ms, t.value\n)" +
		strings.NewReplacer(args...).Replace(r.Replace(markSQL))
}

// nearRetry is how long a store whose role was refused the feed's tables
// goes without the feed before it tries to make them again.
const nearRetry = time.Minute

// nearOn makes the feed's part of the schema when it is missing, and
// reports whether the feed can be used. A role that may not create the
// tables (an upgrade whose DBA has not made them yet: insufficient
// privilege) leaves the store without a feed rather than failing every
// periodic push and fetch: it marks nothing and reads no marks, as a store
// without a feed, says so in a warning, and tries again nearRetry later.
// Any other failure is the call's.
func (s *Store) nearOn(ctx context.Context) (bool, error) {
	if s.nearPart.ready.Load() {
		return true, nil
	}
	if time.Now().UnixNano() < s.nearOffUntil.Load() {
		return false, nil
	}
	// A store's first push or fetch makes the counters' part and the
	// feed's in one transaction, one round trip: a node's start costs the
	// store no more than without the feed.
	err := s.ensure(ctx, &s.core, &s.nearPart)
	if !s.nearPart.ready.Load() && refused(err) {
		// A role refused the feed's tables may still make or use the
		// counters': the feed's part alone tells.
		err = s.ensure(ctx, &s.nearPart)
	}
	if err == nil || !refused(err) {
		return err == nil, err
	}
	s.nearOffUntil.Store(time.Now().Add(nearRetry).UnixNano())
	s.logger.Warn("the role may not create the tables of the feed of keys near their limits: periodic nodes decide keys they see seldom on their own counts until they exist (see the rights in the docs of the postgres strategy)",
		zap.Error(err), zap.Duration("retry_in", nearRetry))
	return false, nil
}

// refused reports whether err is PostgreSQL's refusal of a statement the
// role may not run.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501" // insufficient_privilege
}

// markSQL follows the counters' upsert of a push that may mark. The
// candidates come as six arrays ($n1 to $n6): the 1-based index of the
// diff's counter in the push's arrays ($4 to $6), the whole key, what the
// batch adds to the counter after this diff (0 for the last diff of a
// counter, so that the count after it is the upserted value exactly), the
// diff's value (above 0), the count at which it marks (strategy.NearAt,
// above 0) and the mark's end. Only diffs that may cross are sent.
//
// crossed finds the candidates whose count went from below their mark's
// count to it or more (strategy.Crosses). It is a left join from
// upserted, which so reads every row the upsert returns: the push holds
// every counter it writes before it locks the namespace's version row,
// as every marking push does, so that pushes never wait for each other in
// a circle. A batch whose ID was applied before upserts nothing, so marks
// nothing.
//
// versioned numbers the marks, when there are any: the upsert of the
// version row locks it until the push commits, so the marking pushes of a
// namespace take turns, and each numbers its marks after those of the
// push before it, which has committed; a reader that read up to a number
// never meets a smaller one later (a sequence could not promise that:
// its numbers commit out of order). A namespace without a row starts past
// the server's clock in nanoseconds and any number of its that a purge
// left: numbers are never used twice, so a reader whose version the
// store lost reads the new marks as new.
//
// trimmed deletes the marks before the newest maxNearMarks, skipping
// rows a purge holds (it deletes them anyway); the insert keeps the newest
// maxNearMarks of the push's own. Marks of a push that committed while
// this one waited for the row are not in its snapshot, so not trimmed:
// the next marking push trims them, and readers never read past the
// bound anyway (readNearSQL).
const markSQL = `, crossed AS (
	SELECT coalesce(array_agg(c.key ORDER BY c.j) FILTER (WHERE c.j IS NOT NULL), '{}') AS keys,
		coalesce(array_agg(c.until_ms ORDER BY c.j) FILTER (WHERE c.j IS NOT NULL), '{}') AS untils,
		coalesce(max(c.until_ms), 0) AS last
	FROM upserted u
	LEFT JOIN unnest($n1::integer[], $n2::bytea[], $n3::double precision[], $n4::double precision[],
		$n5::double precision[], $n6::bigint[]) WITH ORDINALITY AS c(i, key, after, value, at, until_ms, j)
	ON u.key = $4[c.i] AND u.size_ms = $5[c.i] AND u.start_ms = $6[c.i]
		AND u.value - c.after >= c.at AND u.value - c.after - c.value < c.at
), versioned AS (
	INSERT INTO {nearver} AS v (namespace, version, until_ms)
	SELECT $1, greatest(floor(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint,
			(SELECT max(m.n) FROM {near} m WHERE m.namespace = $1)) + cardinality(x.keys), x.last
	FROM crossed x
	WHERE cardinality(x.keys) > 0
	ON CONFLICT (namespace) DO UPDATE
	SET version = v.version + (SELECT cardinality(keys) FROM crossed), until_ms = greatest(v.until_ms, excluded.until_ms)
	RETURNING v.version
), trimmed AS (
	DELETE FROM {near} m WHERE m.ctid = ANY(ARRAY(
		SELECT o.ctid FROM {near} o, versioned w
		WHERE o.namespace = $1 AND o.n <= w.version - {bound}
		FOR UPDATE OF o SKIP LOCKED))
)
INSERT INTO {near} (namespace, n, key, until_ms)
SELECT $1, w.version - cardinality(x.keys) + k.j, k.key, k.until_ms
FROM versioned w, crossed x, unnest(x.keys, x.untils) WITH ORDINALITY AS k(key, until_ms, j)
WHERE k.j > cardinality(x.keys) - {bound}`

// markOnlySQL returns the statement of MarkNear: markSQL's numbering,
// trim and insert, of the marks given as $2 (the keys) and $3 (their
// ends), all of them marks, for namespace $1.
func markOnlySQL() string {
	at := strings.Index(markSQL, "\n), versioned AS (")
	if at < 0 {
		panic("postgres: markSQL without its versioned part")
	}
	return `
WITH crossed AS (
	SELECT $2::bytea[] AS keys, $3::bigint[] AS untils,
		coalesce((SELECT max(u) FROM unnest($3::bigint[]) AS u), 0) AS last` + markSQL[at:]
}

// readNearSQL reads a namespace's version ($1): the number of its newest
// mark while any of its marks has not ended by $3 (Unix milliseconds), 0
// otherwise; and, unless that is $2, the key and end of every mark after
// $2 (after 0 when $2 is ahead of the version) among the newest
// maxNearMarks that has not ended, in the order made: one row with NULLs when there
// are none to return. The marks are one range of the primary key.
const readNearSQL = `
SELECT v.version, m.key, m.until_ms
FROM (SELECT coalesce((SELECT r.version FROM {nearver} r WHERE r.namespace = $1 AND r.until_ms > $3), 0) AS version) v
LEFT JOIN LATERAL (
	SELECT t.n, t.key, t.until_ms FROM {near} t
	WHERE v.version <> $2 AND t.namespace = $1
		AND t.n > greatest(CASE WHEN $2 > v.version THEN 0 ELSE $2 END, v.version - {bound}) AND t.n <= v.version
		AND t.until_ms > $3
	OFFSET 0
) m ON true
ORDER BY m.n`

// nearArgs are the candidates of a push that may mark, as markSQL takes
// them.
type nearArgs struct {
	counters []int32
	keys     [][]byte
	after    []float64
	values   []float64
	at       []float64
	until    []int64
}

// add records diff d, the last added to the counter of 1-based index c,
// as a candidate when it may mark: prefix is what the batch added to the
// counter up to d, included (set right by settle).
func (a *nearArgs) add(near float64, d *window.Diff, c int, prefix float64) {
	at := strategy.NearAt(near, d)
	if at == 0 || !(d.Value > 0) {
		return
	}
	a.counters = append(a.counters, int32(c))
	a.keys = append(a.keys, append([]byte{}, d.Key...)) // never nil: NULL
	a.after = append(a.after, prefix)
	a.values = append(a.values, d.Value)
	a.at = append(a.at, at)
	a.until = append(a.until, strategy.NearUntil(d).UnixMilli())
}

// settle turns each candidate's prefix into what the batch adds to its
// counter after it, given the counters' sums.
func (a *nearArgs) settle(sums []float64) {
	for i, c := range a.counters {
		a.after[i] = sums[c-1] - a.after[i]
	}
}

// MarkNear makes marks (see strategy.NearFeed): one statement, which
// numbers them after the namespace's newest, as a marking push does.
func (s *Store) MarkNear(ctx context.Context, namespace string, marks []strategy.NearMark) (err error) {
	defer errs.MarkNear(&err, namespace, len(marks))
	if len(marks) == 0 {
		return nil
	}
	on, err := s.nearOn(ctx)
	if err != nil || !on {
		return err // without the feed's tables, a store without a feed
	}
	keys, untils := markArgs(marks)
	conn, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, s.sql.mark, stored(namespace, maxStoredNamespace), keys, untils)
	return s.sent(err)
}

// markArgs returns the keys and ends of marks, as the mark statement
// takes them.
func markArgs(marks []strategy.NearMark) (keys [][]byte, untils []int64) {
	keys = make([][]byte, len(marks))
	untils = make([]int64, len(marks))
	for i, m := range marks {
		keys[i] = append([]byte{}, m.Key...) // never nil: NULL
		untils[i] = m.Until.UnixMilli()
	}
	return keys, untils
}

// GetCountersNear is GetCounters, and the namespace's marks made after
// version known that have not ended by now, with its version (see
// strategy.NearFeed): one pipeline of the fetch and the read of the
// marks, so one round trip (plus, once per pooled connection, one to
// prepare them), whatever known is; only the read when no counter is
// asked. The marks of mark are made by MarkNear's statement at the end of
// the same pipeline, so in the same transaction. The store keeps the
// newest 65,536 marks of a namespace.
func (s *Store) GetCountersNear(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, known int64, mark []strategy.NearMark) (_ []window.Count, _ []strategy.NearMark, _ int64, err error) {
	defer errs.GetCounters(&err, namespace, len(keys))
	if err := strategy.CheckSizes(sizes); err != nil {
		return nil, nil, 0, err
	}
	on, err := s.nearOn(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	if !on { // the role may not make the feed: the counts, and no marks
		counts, err := s.GetCounters(ctx, namespace, keys, sizes, now)
		return counts, nil, 0, err
	}
	conn, err := s.acquire(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	defer conn.Release()
	ns := stored(namespace, maxStoredNamespace)
	var (
		b     pgx.Batch
		fetch *fetchArgs
	)
	if len(keys) > 0 && len(sizes) > 0 {
		fetch = newFetchArgs(keys, sizes, now)
		b.Queue(s.sql.fetch, ns, fetch.keys, fetch.sizes, fetch.starts)
	}
	b.Queue(s.sql.readNear, ns, known, now.UnixMilli())
	if len(mark) > 0 {
		markKeys, untils := markArgs(mark)
		b.Queue(s.sql.mark, ns, markKeys, untils)
	}
	br := conn.SendBatch(ctx, &b)
	defer br.Close()
	var counts []window.Count
	if fetch != nil {
		counts, err = fetch.scan(br.Query())
	}
	var marks []strategy.NearMark
	var version int64
	if err == nil {
		marks, version, err = readVersioned[strategy.NearMark](br.Query())
	}
	if err == nil && len(mark) > 0 {
		_, err = br.Exec()
	}
	if err != nil {
		return nil, nil, 0, s.sent(err)
	}
	return counts, marks, version, nil
}

// readVersioned reads the reply of the read of the marks, or of the
// bans: rows of a version and a key with its end in Unix milliseconds,
// or one row of the version with NULLs when there are none.
func readVersioned[T ~struct {
	Key   string
	Until time.Time
}](rows pgx.Rows, err error) (list []T, version int64, _ error) {
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var key []byte
		var until *int64
		if err := rows.Scan(&version, &key, &until); err != nil {
			return nil, 0, err
		}
		if until != nil {
			list = append(list, T{Key: string(key), Until: time.UnixMilli(*until)})
		}
	}
	return list, version, rows.Err()
}
