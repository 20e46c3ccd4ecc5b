package redis

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// maxPipelineSlotKeys is the most keys whose slots one release or renewal
// pipeline carries: one command per key, so that a huge call neither
// holds a large reply nor blocks Redis for long.
const maxPipelineSlotKeys = 1024

// acquireSlotScript takes concurrency slots, one after the other, each of one
// (namespace, key), whose slots are the sorted set KEYS[i]: member the
// slot's id, score when it expires, in Unix microseconds by the server's
// clock (TIME, read once), so that the nodes' clocks do not matter. A
// score of about 1.7e15 is an integer that a double, hence a Lua number
// and a sorted set's score, holds exactly. ARGV[3i-2] is slot i's id,
// ARGV[3i-1] the most slots of its key, ARGV[3i] its lease in
// milliseconds. A batch's slots go in one run (of each Cluster slot), so
// that Redis runs one script and reads its clock once for all of them.
//
// For each slot it drops the expired slots of the key (ZREMRANGEBYSCORE,
// which deletes the set if it empties), counts the others (ZCARD), and
// takes the slot (ZADD, which renews an id held already) if fewer than the
// most are held or the id is one of them (ZSCORE, asked only when the set
// is full). The set lives as long as its latest slot: PEXPIRE when its
// time to live is shorter than the lease (PTTL; a new set has none), so a
// key nobody renews vanishes and a key in use never holds slots that
// expired long ago. The script is atomic, so concurrent acquisitions of a
// key take turns, and slots of one key in one run are taken in order.
//
// It replies, for each slot in order, the number of its key's slots held
// after it and 1 if it was taken, 0 if not.
var acquireSlotScript = newScript(serverNowSource + `
local now = serverNow()
local past = string.format('%d', now) -- formatted once, not on every call
local reply = {}
for i = 1, #KEYS do
	local set, id, lease = KEYS[i], ARGV[3 * i - 2], tonumber(ARGV[3 * i])
	redis.call('ZREMRANGEBYSCORE', set, '-inf', past)
	local held, took = redis.call('ZCARD', set), 0
	if held < tonumber(ARGV[3 * i - 1]) or redis.call('ZSCORE', set, id) then
		held, took = held + redis.call('ZADD', set, now + lease * 1000, id), 1
		if redis.call('PTTL', set) <= lease then
			redis.call('PEXPIRE', set, lease + 1)
		end
	end
	reply[2 * i - 1], reply[2 * i] = held, took
end
return reply
`)

// renewSlotsScript extends the slots ARGV[2..] of the sorted set KEYS[1]
// (see acquireSlotScript) that have not expired to ARGV[1] milliseconds
// after the server's now: a ZSCORE and a ZADD XX per slot still held, and
// the set's time to live as for an acquisition. An expired slot is left
// as it is, for the next acquisition of the key to drop. It replies with
// the number of slots renewed.
var renewSlotsScript = newScript(serverNowSource + `
local now = serverNow()
local lease = tonumber(ARGV[1])
local renewed = 0
for i = 2, #ARGV do
	local exp = redis.call('ZSCORE', KEYS[1], ARGV[i])
	if exp and tonumber(exp) > now then
		redis.call('ZADD', KEYS[1], 'XX', now + lease * 1000, ARGV[i])
		renewed = renewed + 1
	end
end
if renewed > 0 and redis.call('PTTL', KEYS[1]) <= lease then
	redis.call('PEXPIRE', KEYS[1], lease + 1)
end
return renewed
`)

// AcquireSlot takes a concurrency slot of key, named id, when fewer than
// max slots of key are held and unexpired, with one script run: one round
// trip (see strategy.Slotter). Taking an id that is held renews it. The
// slot expires lease (in whole milliseconds) after the Redis server's
// clock's now. A key's slots are one sorted set in the key's bucket (one
// Cluster slot); in steady state an acquisition costs Redis 7 commands
// (EVALSHA, TIME, ZREMRANGEBYSCORE, ZCARD, ZADD, PTTL, PEXPIRE) and one
// refused because the key is full 5 (EVALSHA, TIME, ZREMRANGEBYSCORE,
// ZCARD, ZSCORE).
//
// An id of 1 to 256 bytes, a max of at least 1 and a lease from 1ms to an
// hour are taken; other input is refused, before anything is sent, with
// an error that wraps strategy.ErrRejected.
//
// It is sent at most once, as a hit is, and an error wraps
// strategy.ErrNotSent when it surely never reached Redis (it could not be
// dialed, no pooled connection freed up, the store is closed). Any other
// error leaves the caller not knowing whether the slot was taken;
// acquiring or releasing the id again settles it, or the lease runs out.
func (s *Store) AcquireSlot(ctx context.Context, namespace, key, id string, max int, lease time.Duration) (_ int, _ bool, err error) {
	defer errs.AcquireSlot(&err, namespace)
	if err := s.checkOpen(); err != nil {
		return 0, false, err
	}
	if err := strategy.CheckAcquire(id, max, lease); err != nil {
		return 0, false, err
	}
	var run slotRun
	k := bucketOf(namespace, key)
	run.add(s.layout, 0, k, nsPart(namespace), key, strategy.SlotRequest{ID: id, Max: max, Lease: lease})
	replies, err := run.replies(s.runScript(ctx, run.script(), sendOnce))
	if err != nil {
		return 0, false, s.partial(err, k)
	}
	return replies[0].Held, replies[0].OK, nil
}

// slotRun gathers the slots that one run of acquireSlotScript takes: those
// of one Cluster slot, or any on a standalone server.
type slotRun struct {
	hits []int // the indexes of the slots' hits in their batch
	keys []string
	args []any // each slot's id, most and lease
}

// add adds slot of key, of bucket k, the slot of hit i of a batch, to the
// run.
func (r *slotRun) add(l *layout, i, k int, nsp, key string, slot strategy.SlotRequest) {
	r.hits = append(r.hits, i)
	r.keys = append(r.keys, l.slotsKey(k, nsp, key))
	r.args = append(r.args, slot.ID, slot.Max, strategy.LeaseMs(slot.Lease))
}

// script is the run, as runScripts sends it.
func (r *slotRun) script() scriptRun { return newRun(acquireSlotScript, r.keys, r.args...) }

// replies reads the run's reply: each slot's in order.
func (r *slotRun) replies(cmd *goredis.Cmd) ([]strategy.SlotReply, error) {
	reply, err := cmd.Int64Slice()
	if err != nil {
		return nil, notSent(err)
	}
	if len(reply) != 2*len(r.keys) {
		return nil, fmt.Errorf("the slot script replied %d values for %d slots", len(reply), len(r.keys))
	}
	replies := make([]strategy.SlotReply, len(r.keys))
	for i := range replies {
		held, took := reply[2*i], reply[2*i+1]
		if held < 0 || took != 0 && took != 1 {
			return nil, fmt.Errorf("the slot script replied %v, not counts and flags", reply)
		}
		replies[i] = strategy.SlotReply{Held: int(held), OK: took == 1}
	}
	return replies, nil
}

// TakesSlotsInBatches marks the store as a strategy.SlotBatcher: its
// HitBatch sends each slot's script run in the pipeline of the batch's
// runs.
func (*Store) TakesSlotsInBatches() {}

var _ strategy.SlotBatcher = (*Store)(nil)

// ReleaseSlots frees the given slots of a namespace: one ZREM per key,
// pipelined, in one round trip for up to 1,024 keys (on a Cluster, one per
// node involved, sent in parallel). Slots that are not held are skipped.
// An ID that no slot can have (empty, or longer than 256 bytes) is
// refused, before anything is sent, with an error that wraps
// strategy.ErrRejected.
//
// go-redis resends a pipeline after a network error, which is harmless
// here (freeing a slot twice frees it once), but means that a failure
// after an attempt may have been applied: so an error wraps
// strategy.ErrNotSent only after Close, as PushDiffs' do. On a Cluster,
// what failed on a master whose slots a promoted replica serves by then is
// sent to it once more (see the package documentation).
func (s *Store) ReleaseSlots(ctx context.Context, namespace string, slots []strategy.Slot) (err error) {
	defer errs.ReleaseSlots(&err, namespace, len(slots))
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := strategy.CheckSlots(slots); err != nil {
		return err
	}
	sets, ids, buckets := s.slotSets(namespace, slots)
	ctx, failed := s.watch(ctx)
	var parts partFailures // on a Cluster, the other masters' go on
	for len(sets) > 0 {
		n := min(len(sets), maxPipelineSlotKeys)
		pipe := s.client.Pipeline()
		cmds := make([]goredis.Cmder, n)
		for i := range n {
			cmds[i] = pipe.ZRem(ctx, sets[i], ids[i]...)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			// Freeing a slot twice frees it once: send again, on a
			// Cluster, what failed on a master since replaced.
			err := s.sendAgain(ctx, failed, cmds, func(i int) goredis.Cmder {
				return goredis.NewIntCmd(ctx, cmds[i].Args()...)
			})
			if err != nil {
				if !s.cluster {
					return err
				}
				addFailed(&parts, err, cmds, func(i int) int { return buckets[i] })
			}
		}
		sets, ids, buckets = sets[n:], ids[n:], buckets[n:]
	}
	return s.partial(parts.first, parts.buckets...)
}

// RenewSlots extends the given slots of a namespace that are still held
// to lease after the Redis server's now: one script run per key,
// pipelined, in one round trip for up to 1,024 keys (on a Cluster, one per
// node involved, sent in parallel). A slot that expired is not taken
// again. Each run costs the EVALSHA, TIME, a ZSCORE per slot, a ZADD per
// slot still held, and PTTL (and PEXPIRE when the set's life grows). Bad
// input is refused as by AcquireSlot and ReleaseSlots; errors are those
// of ReleaseSlots (renewing twice is harmless too).
func (s *Store) RenewSlots(ctx context.Context, namespace string, slots []strategy.Slot, lease time.Duration) (err error) {
	defer errs.RenewSlots(&err, namespace, len(slots))
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := strategy.CheckRenew(slots, lease); err != nil {
		return err
	}
	sets, ids, buckets := s.slotSets(namespace, slots)
	leaseArg := strategy.LeaseMs(lease)
	runs := make([]scriptRun, len(sets))
	for i, set := range sets {
		runs[i] = newRun(renewSlotsScript, []string{set}, append([]any{leaseArg}, ids[i]...)...)
		runs[i].bucket = buckets[i]
	}
	var parts partFailures // on a Cluster, the other masters' go on
	for len(runs) > 0 {
		n := min(len(runs), maxPipelineSlotKeys)
		if _, err := s.runPipeline(ctx, runs[:n], &parts); err != nil {
			return err
		}
		runs = runs[n:]
	}
	return s.partial(parts.first, parts.buckets...)
}

// slotSets groups slots by key: the sorted set of each key, in the order
// first given, the ids of its slots, each once, and its bucket.
func (s *Store) slotSets(namespace string, slots []strategy.Slot) (sets []string, ids [][]any, buckets []int) {
	if len(slots) == 0 {
		return nil, nil, nil
	}
	nsp := nsPart(namespace)
	index := make(map[string]int, len(slots))
	seen := make(map[strategy.Slot]bool, len(slots))
	for _, sl := range slots {
		if seen[sl] {
			continue
		}
		seen[sl] = true
		i, ok := index[sl.Key]
		if !ok {
			i = len(sets)
			index[sl.Key] = i
			b := bucketOf(namespace, sl.Key)
			sets = append(sets, s.layout.slotsKey(b, nsp, sl.Key))
			ids = append(ids, nil)
			buckets = append(buckets, b)
		}
		ids[i] = append(ids[i], sl.ID)
	}
	return sets, ids, buckets
}
