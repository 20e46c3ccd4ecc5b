package postgres

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// SetBans records bans of a namespace (see strategy.Banner) in one call of
// the table's set_bans function: one round trip (plus, once per store, the
// creation of the bans' tables when missing; see newParts). The calls
// of one namespace take turns under a transaction advisory lock of it.
// Ends are kept in whole milliseconds; a key given twice takes its last
// ban.
//
// pgx never resends a query; setting the same bans again is harmless. An
// error wraps strategy.ErrNotSent when the call surely never reached the
// server, and strategy.ErrRejected for an end more than
// strategy.MaxBanLength away.
func (s *Store) SetBans(ctx context.Context, namespace string, bans []strategy.Ban) (err error) {
	defer errs.SetBans(&err, namespace, len(bans))
	if err := strategy.CheckBans(bans, time.Now()); err != nil {
		return err
	}
	if len(bans) == 0 {
		return nil
	}
	last := make(map[string]int, len(bans))
	for i, b := range bans {
		last[b.Key] = i
	}
	var ids, keys [][]byte
	var until []int64
	for i, b := range bans {
		if last[b.Key] != i {
			continue
		}
		ids = append(ids, stored(b.Key, maxStoredKey))
		keys = append(keys, append([]byte{}, b.Key...))
		var ms int64
		if !b.Until.IsZero() {
			ms = b.Until.UnixMilli()
		}
		until = append(until, ms)
	}
	conn, err := s.acquire(ctx, &s.banPart)
	if err != nil {
		return err
	}
	defer conn.Release()
	ns := stored(namespace, maxStoredNamespace)
	lock := int64(fnv1a(fnv1a(fnvOffset, "caddy-ratelimit bans "), string(ns)))
	_, err = conn.Exec(ctx, s.sql.setBans, ns, ids, keys, until, lock)
	return s.sent(err)
}

// GetBans returns the version of a namespace's bans and, unless it is
// known, every ban that ends after now (see strategy.Banner), in one
// query: one round trip, which reads the namespace's version and one of
// its bans when the version is known.
func (s *Store) GetBans(ctx context.Context, namespace string, known int64, now time.Time) (_ []strategy.Ban, _ int64, err error) {
	defer errs.GetBans(&err, namespace)
	conn, err := s.acquire(ctx, &s.banPart)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Release()
	bans, version, err := readVersioned[strategy.Ban](conn.Query(ctx, s.sql.getBans, stored(namespace, maxStoredNamespace), known, now.UnixMilli()))
	if err != nil {
		return nil, 0, s.sent(err)
	}
	return bans, version, nil
}
