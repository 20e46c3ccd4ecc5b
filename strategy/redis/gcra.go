package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// rateSource is the source of rateScript, kept to send with EVAL when a
// server does not hold the script.
//
// It decides one request under a rate (see strategy.Rater) by the
// server's clock (TIME), in Unix microseconds, which a Lua number holds
// exactly. KEYS[1] is the key's TAT, a string of microseconds that lives
// until the TAT (PEXPIRE), since a key whose TAT has passed has its whole
// burst, as one never seen does. KEYS[2], when the request has an ID, is
// the ID's record: "t<increment>" when it took a turn, "r" when it was
// refused, "g" when it was given back. ARGV[1] is the increment, ARGV[2]
// the tolerance (microseconds), ARGV[3] 1 to force, ARGV[4] the record's
// life in milliseconds.
//
// A recorded ID answers what it did, without a change, unless it was
// refused and this call forces. Otherwise the request is admitted when
// max(TAT, now) + increment - now <= tolerance, or forced, and the TAT
// moves. It replies {admitted (1 or 0), TAT, now}.
const rateSource = `
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local force = ARGV[3] == '1'
if KEYS[2] then
	local rec = redis.call('GET', KEYS[2])
	if rec and (not force or rec ~= 'r') then
		local ok = 0
		if string.sub(rec, 1, 1) == 't' then ok = 1 end
		return {ok, tat, now}
	end
end
local inc = tonumber(ARGV[1])
local due = math.max(tat, now) + inc
if not force and due - now > tonumber(ARGV[2]) then
	if KEYS[2] then redis.call('SET', KEYS[2], 'r', 'PX', ARGV[4]) end
	return {0, tat, now}
end
redis.call('SET', KEYS[1], string.format('%.0f', due), 'PX', math.floor((due - now) / 1000) + 1)
if KEYS[2] then redis.call('SET', KEYS[2], 't' .. ARGV[1], 'PX', ARGV[4]) end
return {1, due, now}
`

// rateScript is rateSource, run by its SHA1 digest.
var rateScript = goredis.NewScript(rateSource)

// giveBackSource is the source of giveBackScript: it records the ID of
// KEYS[2] as given back (for ARGV[1] milliseconds) and, when the ID took
// a turn ("t<increment>", see rateSource), moves the TAT of KEYS[1] back
// by its increment, dropping the key once that is no later than the
// server's now. It replies 1 when it gave a turn back, else 0.
const giveBackSource = `
local rec = redis.call('GET', KEYS[2])
if rec == 'g' then return 0 end
redis.call('SET', KEYS[2], 'g', 'PX', ARGV[1])
if not rec or string.sub(rec, 1, 1) ~= 't' then return 0 end
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat == 0 then return 0 end
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local back = tat - tonumber(string.sub(rec, 2))
if back <= now then
	redis.call('DEL', KEYS[1])
else
	redis.call('SET', KEYS[1], string.format('%.0f', back), 'PX', math.floor((back - now) / 1000) + 1)
end
return 1
`

// giveBackScript is giveBackSource, run by its SHA1 digest.
var giveBackScript = goredis.NewScript(giveBackSource)

// rateKey returns the key of a key's TAT under the rates of one window:
// <prefix>:{<bucket>}:rate:<window ms>:<len(ns)>:<ns>:<key>, in the
// bucket, and so the Cluster slot, of the key's counters. "rate" is no
// number, "push", "slots" or "bans", so it never reads as another kind
// of key.
func (l *layout) rateKey(bucket int, windowMs int64, nsp, key string) string {
	return l.tags[bucket] + "rate:" + strconv.FormatInt(windowMs, 10) + ":" + nsp + key
}

// rateIDKey returns the key of the record of a rate's ID:
// <prefix>:{<bucket>}:rateid:<len(ns)>:<ns>:<id>, in the bucket of the
// request's key, so that one script reaches both.
func (l *layout) rateIDKey(bucket int, nsp, id string) string {
	return l.tags[bucket] + "rateid:" + nsp + id
}

// Rate decides one request of key under a rate, by the Redis server's
// clock, with one script run: one round trip (see strategy.Rater). A
// request costs Redis the EVALSHA, TIME and GET, a GET of its ID's record
// and a SET of it (with an ID), and a SET of the TAT when admitted. The
// TAT and the record live in the key's bucket (one Cluster slot).
//
// Bad input is refused, before anything is sent, with an error that
// wraps strategy.ErrRejected (see strategy.CheckRate). An error wraps
// strategy.ErrNotSent when the request surely never reached Redis. With
// an ID the call is applied at most once, so on a Cluster it is sent once
// more to a master that took over the key's slot; without one it is sent
// once.
func (s *Store) Rate(ctx context.Context, namespace, key, id string, r strategy.RateRequest) (_ strategy.RateReply, err error) {
	defer errs.Rate(&err, namespace)
	if err := s.checkOpen(); err != nil {
		return strategy.RateReply{}, err
	}
	if err := strategy.CheckRate(id, false, r); err != nil {
		return strategy.RateReply{}, err
	}
	bucket, nsp := bucketOf(namespace, key), nsPart(namespace)
	force := 0
	if r.Force {
		force = 1
	}
	tatKey := s.layout.rateKey(bucket, r.Window.Milliseconds(), nsp, key)
	cmdArgs := []any{nil, nil, 1, tatKey}
	if id != "" {
		cmdArgs[2] = 2
		cmdArgs = append(cmdArgs, s.layout.rateIDKey(bucket, nsp, id))
	}
	cmdArgs = append(cmdArgs, r.Increment.Microseconds(), r.Tolerance.Microseconds(), force, strategy.RateIDLife.Milliseconds())
	reply, err := s.runOnce(ctx, rateScript, rateSource, cmdArgs, id != "").Int64Slice()
	if err != nil {
		return strategy.RateReply{}, s.partial(notSent(err), bucket)
	}
	if len(reply) != 3 || reply[0] != 0 && reply[0] != 1 || reply[2] <= 0 {
		return strategy.RateReply{}, fmt.Errorf("the rate script replied %v, not a flag, a TAT and a time", reply)
	}
	return strategy.RateReply{OK: reply[0] == 1, TAT: reply[1] * 1e3, Now: reply[2] * 1e3}, nil
}

// GiveBack takes back the turn that the Rate named id took, with one
// script run (see strategy.Rater). Bad input is refused as by Rate, an
// empty id included. Giving back twice gives back once, so it may be sent
// again after any failure.
func (s *Store) GiveBack(ctx context.Context, namespace, key, id string, window time.Duration) (err error) {
	defer errs.GiveBack(&err, namespace)
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := strategy.CheckRate(id, true, strategy.RateRequest{Window: window}); err != nil {
		return err
	}
	bucket, nsp := bucketOf(namespace, key), nsPart(namespace)
	cmdArgs := []any{nil, nil, 2, s.layout.rateKey(bucket, window.Milliseconds(), nsp, key),
		s.layout.rateIDKey(bucket, nsp, id), strategy.RateIDLife.Milliseconds()}
	return s.partial(notSent(s.runOnce(ctx, giveBackScript, giveBackSource, cmdArgs, true).Err()), bucket)
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher: its
// batch script decides hits' rates (see HitBatch), and its push script
// takes a Batch's rates.
func (*Store) DecidesRatesInBatches() {}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
