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
	if err := s.check(ctx); err != nil {
		return 0, err
	}
	if err := strategy.CheckAttend(node, ttl); err != nil {
		return 0, err
	}
	now := s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fleets == nil {
		d.fleets = make(map[string]map[string]int64)
	}
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
	return len(fleet), nil
}

var _ strategy.Roster = (*Store)(nil)
