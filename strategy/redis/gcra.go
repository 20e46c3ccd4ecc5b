package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// rateScript decides one request under a rate (see strategy.Rater), or
// gives one back, by the server's clock (TIME), in Unix microseconds.
// KEYS[1] is the key's TAT, a string of microseconds that lives until the
// TAT, since a key whose TAT has passed has its whole burst, as one never
// seen does. KEYS[2], when the request has an ID, is the ID's record:
// "t<increment>" when it took a turn, "r" when it was refused, "g" when it
// was given back.
//
// To decide, ARGV[1] is the increment, ARGV[2] the tolerance
// (microseconds), ARGV[3] 1 to force, ARGV[4] the record's life in
// milliseconds. A recorded ID answers what it did, without a change,
// unless it was refused and this call forces. Otherwise the request is
// admitted when max(TAT, now) + increment - now <= tolerance, or forced,
// and the TAT moves. It replies {admitted (1 or 0), TAT, now}.
//
// To give back, ARGV[1] is "g" and ARGV[2] the record's life: it records
// the ID as given back and, when the ID took a turn, moves the TAT back
// by its increment, dropping the key once that is no later than now. It
// replies 1 when it gave a turn back, else 0.
var rateScript = newScript(tatSource + `
local rec = KEYS[2] and redis.call('GET', KEYS[2])
local back = ARGV[1] == 'g'
if back then
	if rec == 'g' then return 0 end
	redis.call('SET', KEYS[2], 'g', 'PX', ARGV[2])
	if not rec or string.sub(rec, 1, 1) ~= 't' then return 0 end
end
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if back then
	if tat == 0 then return 0 end
	local now = serverNow()
	tat = tat - tonumber(string.sub(rec, 2))
	if tat <= now then
		redis.call('DEL', KEYS[1])
	else
		storeTAT(KEYS[1], tat, now)
	end
	return 1
end
local now = serverNow()
local force = ARGV[3] == '1'
if rec and (not force or rec ~= 'r') then
	local ok = 0
	if string.sub(rec, 1, 1) == 't' then ok = 1 end
	return {ok, tat, now}
end
local due = arrival(tat, now, tonumber(ARGV[1]))
if not force and due - now > tonumber(ARGV[2]) then
	if KEYS[2] then redis.call('SET', KEYS[2], 'r', 'PX', ARGV[4]) end
	return {0, tat, now}
end
storeTAT(KEYS[1], due, now)
if KEYS[2] then redis.call('SET', KEYS[2], 't' .. ARGV[1], 'PX', ARGV[4]) end
return {1, due, now}
`)

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
	keys, how := []string{s.layout.rateKey(bucket, r.Window.Milliseconds(), nsp, key)}, sendOnce
	if id != "" {
		keys, how = append(keys, s.layout.rateIDKey(bucket, nsp, id)), resendOnCluster
	}
	run := newRun(rateScript, keys, r.Increment.Microseconds(), r.Tolerance.Microseconds(), force, strategy.RateIDLife.Milliseconds())
	reply, err := s.runScript(ctx, run, how).Int64Slice()
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
	run := newRun(rateScript, []string{s.layout.rateKey(bucket, window.Milliseconds(), nsp, key), s.layout.rateIDKey(bucket, nsp, id)},
		"g", strategy.RateIDLife.Milliseconds())
	return s.partial(notSent(s.runScript(ctx, run, resendOnCluster).Err()), bucket)
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher: its
// batch script decides hits' rates (see HitBatch), and its push script
// takes a Batch's rates.
func (*Store) DecidesRatesInBatches() {}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
