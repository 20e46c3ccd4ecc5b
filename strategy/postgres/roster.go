package postgres

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Attend records node as a member of namespace's fleet until ttl from now,
// by the server's clock, and returns how many members have not expired
// (see strategy.Roster): one statement, one round trip (plus, once per
// store, the creation of the members' table when missing). The members
// that expired are deleted as the namespace's are counted, so the table
// holds about one row per node and namespace.
func (s *Store) Attend(ctx context.Context, namespace, node string, ttl time.Duration) (members int, err error) {
	defer errs.Attend(&err, namespace)
	if err := strategy.CheckAttend(node, ttl); err != nil {
		return 0, err
	}
	conn, err := s.acquire(ctx, &s.fleetPart)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	var n int64
	err = conn.QueryRow(ctx, s.sql.attend, stored(namespace, maxStoredNamespace), []byte(node), ttl.Milliseconds()).Scan(&n)
	if err != nil {
		return 0, s.sent(err)
	}
	return int(n), nil
}
