package redis

import (
	"cmp"
	"context"
	"errors"
	"sync"

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

// PingParts sends PING to the master of each given bucket's slot, once
// per master, in parallel (see strategy.Parted). A master that fails it
// has the slot map reloaded in the background, so that a later call
// finds the replica promoted in its place. On a standalone server, one
// part, it is Ping.
func (s *Store) PingParts(ctx context.Context, parts []int) (err error) {
	defer errs.Ping(&err)
	if err := s.checkOpen(); err != nil {
		return err
	}
	cc, ok := s.client.(*goredis.ClusterClient)
	if !ok {
		return s.Ping(ctx)
	}
	byMaster := make(map[*goredis.Client][]int)
	var failed []int
	for _, b := range parts {
		if b < 0 || b >= buckets {
			continue
		}
		c, err := cc.MasterForKey(ctx, s.layout.tags[b])
		if err != nil {
			failed = append(failed, b)
			continue
		}
		byMaster[c] = append(byMaster[c], b)
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		failure error
	)
	for c, bs := range byMaster {
		wg.Go(func() {
			if err := c.Ping(ctx).Err(); err != nil {
				mu.Lock()
				failure = cmp.Or(failure, notSent(err))
				failed = append(failed, bs...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(failed) == 0 {
		return nil
	}
	if s.topo != nil {
		s.topo.refreshSoon()
	}
	return strategy.Partial(cmp.Or(failure, errors.New("no master serves the slot")), failed...)
}

var _ strategy.Pinger = (*Store)(nil)
