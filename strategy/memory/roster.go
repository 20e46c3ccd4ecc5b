package memory

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// Attend records node as a member of namespace's fleet until ttl from now
// and returns how many members have not expired, node included (see
// strategy.Roster). Expired members are dropped as the namespace's
// members are counted.
func (s *Store) Attend(ctx context.Context, namespace, node string, ttl time.Duration) (members int, err error) {
	defer errs.Attend(&err, namespace)
	err = s.run(ctx, strategy.CheckAttend(node, ttl), func(d *data, now int64) {
		fleet := d.fleets[namespace]
		if fleet == nil {
			fleet = make(map[string]int64)
			d.fleets[namespace] = fleet
		}
		for n, until := range fleet {
			if until <= now {
				delete(fleet, n)
			}
		}
		fleet[node] = now + int64(ttl)
		members = len(fleet)
	})
	return members, err
}

var _ strategy.Roster = (*Store)(nil)
