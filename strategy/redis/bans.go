package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// setBansScript records bans. A namespace's bans are the sorted set KEYS[1]: member the key, score
// the ban's end in Unix milliseconds; KEYS[2] holds their version. ARGV
// holds pairs of a key and its ban's end, 0 to lift it. The script drops
// the bans that ended (by the server's clock), sets each ban unless the
// set holds a later end (ZSCORE, ZADD) or lifts it (ZSCORE, ZREM), and,
// when anything changed, sets a new version: one more than the last
// (INCR, exact in 64 bits), or at version 0 a new epoch (see
// strategy.BanEpoch), the server's time in milliseconds shifted by
// strategy.BanEpochShift (a power of two times a number of 41 bits,
// exact in Lua's numbers; $banEpochFactor is 1 << BanEpochShift), so that no two states share one but for
// epochs started and ended within one millisecond. The set expires a second
// after its last ban ends, the version a second after the last ban it
// held or lifted would have ended (PTTL keeps a later expiry), so a
// namespace whose bans all ended holds nothing, and reads as version 0,
// while one whose last ban was lifted keeps a version until then. It
// replies 1 if anything changed.
var setBansScript = newScript(serverNowSource + `
local nowMs = math.floor(serverNow() / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', nowMs)
local changed = 0
local held = 0
for i = 1, #ARGV, 2 do
	local u = tonumber(ARGV[i + 1])
	local old = redis.call('ZSCORE', KEYS[1], ARGV[i])
	if u == 0 then
		if old then
			redis.call('ZREM', KEYS[1], ARGV[i])
			held = math.max(held, tonumber(old))
			changed = 1
		end
	elseif u > nowMs and (not old or tonumber(old) < u) then
		redis.call('ZADD', KEYS[1], u, ARGV[i])
		changed = 1
	end
end
if changed == 0 then
	return 0
end
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #last > 0 then
	held = math.max(held, tonumber(last[2]))
	redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
end
local ttl = redis.call('PTTL', KEYS[2])
if ttl == -2 then
	redis.call('SET', KEYS[2], string.format('%.0f', nowMs * $banEpochFactor))
else
	redis.call('INCR', KEYS[2])
end
local exp = held + 1000
if ttl > 0 then
	exp = math.max(exp, nowMs + ttl)
end
redis.call('PEXPIREAT', KEYS[2], exp)
return 1
`)

// getBansScript replies with the version of the bans (KEYS[2], see
// setBansScript), and, unless it is
// ARGV[1], the key and end of every ban of KEYS[1] that ends after
// ARGV[2] (Unix milliseconds).
var getBansScript = newScript(`
local v = redis.call('GET', KEYS[2]) or '0'
if v == ARGV[1] then
	return {v}
end
local r = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf', 'WITHSCORES')
table.insert(r, 1, v)
return r
`)

// SetBans records bans of a namespace (see strategy.Banner) with one
// script run: one round trip. A namespace's bans are one sorted set and
// its version one string, in one bucket (one Cluster slot); a call costs
// Redis, besides the EVALSHA, TIME, ZREMRANGEBYSCORE, a ZSCORE per ban
// and a ZADD per ban set or a ZREM per ban lifted, then, when anything
// changed, ZRANGE, GET, PTTL, SET and two PEXPIREAT. Ends are kept in
// whole milliseconds.
//
// go-redis sends it at most once; setting the same bans again is
// harmless, so on a Cluster it is sent once more after a connection
// failure if a promoted replica serves its slot by then. An
// error wraps strategy.ErrNotSent when the call surely never reached
// Redis, and strategy.ErrRejected for an end more than
// strategy.MaxBanLength away.
func (s *Store) SetBans(ctx context.Context, namespace string, bans []strategy.Ban) (err error) {
	defer errs.SetBans(&err, namespace, len(bans))
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := strategy.CheckBans(bans, time.Now()); err != nil {
		return err
	}
	if len(bans) == 0 {
		return nil
	}
	set, version := s.layout.bansKeys(namespace)
	args := make([]any, 0, 2*len(bans))
	for _, b := range bans {
		var until int64
		if !b.Until.IsZero() {
			until = b.Until.UnixMilli()
		}
		args = append(args, b.Key, until)
	}
	if err := s.runScript(ctx, newRun(setBansScript, []string{set, version}, args...), resendOnCluster).Err(); err != nil {
		return s.partial(notSent(err), bucketOf(namespace, ""))
	}
	return nil
}

// GetBans returns the version of a namespace's bans and, unless it is
// known, every ban that ends after now (see strategy.Banner), with one
// script run: one round trip, whose cost is a GET when the version is
// known, and otherwise a ZRANGEBYSCORE of the bans.
func (s *Store) GetBans(ctx context.Context, namespace string, known int64, now time.Time) (_ []strategy.Ban, _ int64, err error) {
	defer errs.GetBans(&err, namespace)
	if err := s.checkOpen(); err != nil {
		return nil, 0, err
	}
	set, version := s.layout.bansKeys(namespace)
	run := newRun(getBansScript, []string{set, version}, known, now.UnixMilli())
	reply, err := s.runScript(ctx, run, resendOnCluster).StringSlice()
	if err != nil {
		return nil, 0, s.partial(notSent(err), bucketOf(namespace, ""))
	}
	if len(reply)%2 != 1 {
		return nil, 0, fmt.Errorf("the bans script replied %d values, not a version and pairs", len(reply))
	}
	v, err := strconv.ParseInt(reply[0], 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("the bans' version %q: %w", reply[0], err)
	}
	var bans []strategy.Ban
	for i := 1; i < len(reply); i += 2 {
		ms, err := strconv.ParseFloat(reply[i+1], 64)
		if err != nil {
			return nil, 0, fmt.Errorf("the end %q of a ban: %w", reply[i+1], err)
		}
		bans = append(bans, strategy.Ban{Key: reply[i], Until: time.UnixMilli(int64(ms))})
	}
	return bans, v, nil
}
