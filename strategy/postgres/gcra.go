package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

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
	conn, err := s.acquire(ctx, &s.ratePart)
	if err != nil {
		return strategy.RateReply{}, err
	}
	defer conn.Release()
	var idArg []byte // NULL without an ID
	if id != "" {
		idArg = stored(id, maxStoredID)
	}
	var rep strategy.RateReply
	err = conn.QueryRow(ctx, s.sql.rate,
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
	conn, err := s.acquire(ctx, &s.ratePart)
	if err != nil {
		return err
	}
	defer conn.Release()
	_, err = conn.Exec(ctx, s.sql.giveBack,
		stored(namespace, maxStoredNamespace), stored(key, maxStoredKey), window.Milliseconds(),
		stored(id, maxStoredID), strategy.RateIDLife.Microseconds())
	return s.sent(err)
}

// RateKeys returns how many keys' TATs of a namespace the table holds,
// passed or not (a purge drops those that passed), for tests and tools.
func (s *Store) RateKeys(ctx context.Context, namespace string) (int, error) {
	n, err := s.countRows(ctx, &s.ratePart, "_rates", namespace)
	if err != nil {
		return 0, fmt.Errorf("counting rate keys: %w", err)
	}
	return n, nil
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher: its
// batch hit function decides hits' rates (see hitsBodySQL), and its push
// takes a Batch's rates (see ratedSQL).
func (*Store) DecidesRatesInBatches() {}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
