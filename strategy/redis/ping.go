package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Ping sends PING to the server, or on a Cluster to every master, so that
// a master that failed over fails it until its replica is promoted (see
// strategy.Pinger).
func (s *Store) Ping(ctx context.Context) (err error) {
	defer errs.Ping(&err)
	if err := s.checkOpen(); err != nil {
		return err
	}
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		return notSent(cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return c.Ping(ctx).Err()
		}))
	}
	return notSent(s.client.Ping(ctx).Err())
}

var _ strategy.Pinger = (*Store)(nil)
