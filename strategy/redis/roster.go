package redis

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// attendScript records a node's attendance. A namespace's members are
// the sorted set KEYS[1]: member a node's ID, score when its attendance
// expires, in Unix milliseconds by the server's clock. The script drops
// the members that expired, sets ARGV[1]'s expiry ARGV[2] milliseconds
// from now, has the set expire with its latest member, and replies with
// the number of members.
var attendScript = newScript(serverNowSource + `
local nowMs = math.floor(serverNow() / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nowMs)
redis.call('ZADD', KEYS[1], nowMs + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], last[2])
return redis.call('ZCARD', KEYS[1])
`)

// Attend records node as a member of namespace's fleet until ttl from now,
// by the server's clock, and returns how many members have not expired
// (see strategy.Roster): one script run, which costs Redis, besides the
// EVALSHA, TIME, ZREMRANGEBYSCORE, ZADD, ZRANGE, PEXPIREAT and ZCARD on a
// set of one member per node. Attending again is harmless, so on a
// Cluster it is sent once more after a connection failure if a promoted
// replica serves its slot by then.
func (s *Store) Attend(ctx context.Context, namespace, node string, ttl time.Duration) (members int, err error) {
	defer errs.Attend(&err, namespace)
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	if err := strategy.CheckAttend(node, ttl); err != nil {
		return 0, err
	}
	run := newRun(attendScript, []string{s.layout.fleetKey(namespace)}, node, ttl.Milliseconds())
	n, err := s.runScript(ctx, run, resendOnCluster).Int()
	if err != nil {
		return 0, s.partial(notSent(err), bucketOf(namespace, ""))
	}
	return n, nil
}

var _ strategy.Roster = (*Store)(nil)
