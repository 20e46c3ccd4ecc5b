package redis

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// pushScript applies one run of diffs, at most once per batch.
//
// KEYS[1] is the run's dedupe marker and KEYS[2..n+1] its n counters, all
// in one slot on a Cluster, in any buckets on a standalone server. ARGV[1]
// is the marker's time to live in milliseconds; the counter KEYS[i] gets
// the increment ARGV[2i-2] and expires at ARGV[2i-1] (Unix milliseconds).
//
// A rate's turn (see strategy.RateBatcher), a TAT key among the counters
// whose increment is "r" and the microseconds to move it by, moves the
// TAT as a forced rate request does, by the server's clock (TIME), to
// max(TAT, now) + increment, living until it passes.
//
// A counter's expiry depends only on its window, so it is set once, when
// the counter is made: SET ... PXAT ... NX makes a new counter, its value
// and its expiry in one command, and INCRBYFLOAT, which keeps the expiry,
// adds to one that exists. One MGET first tells which exist, so that each
// counter costs one command either way; a run of one counter skips it and
// tries the SET NX first, which costs one command for a new counter and
// two for an existing one, never more than the MGET would. A SET NX that
// finds the counter anyway (a counter twice in one run, or a key that is
// not a string) falls back to INCRBYFLOAT.
//
// A run of a batch with a Near (see strategy.NearFeed) that may mark a key
// has more arguments, so that other runs cost what they did before:
// ARGV[2n+2] is the length of the counters' namespace part (nsPart), which
// takes the client key out of a counter's name, and ARGV[2n+2i-1] and
// ARGV[2n+2i] are the count at which KEYS[i] marks its key (0 for none)
// and the mark's end, in Unix milliseconds. The new count of a counter is
// the reply of its INCRBYFLOAT, or its increment when SET NX made it. On a
// standalone server KEYS[n+2] and KEYS[n+3] are the namespace's near keys
// (see layout.nearKeys), read by the MGET with the counters, and the
// script writes its marks there itself (see feedSource); on a Cluster,
// where they are in another slot, it replies with the 0-based positions
// among the counters of those that marked, for the caller to write.
//
// It replies 1 when it applied the run (or its marks) and 0 when the
// marker was already set, that is when this run of this batch was applied
// before, which then marks nothing. A counter that refuses its increment
// (a value the store cannot add) does not stop the others; the script
// then replies with an error naming how many failed.
var pushScript = goredis.NewScript(feedSource + `
local n, near, feed = #KEYS - 1, #ARGV ~= 2 * #KEYS - 1, false
if near then
	n = (#ARGV - 2) / 4
	feed = #KEYS > n + 1
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
	return 0
end
-- held[i - 1 + h] tells whether KEYS[i] exists; with a feed, held[1] is
-- the version of the namespace's marks.
local held, h = false, 0
if n > 1 then
	if feed then
		held, h = redis.call('MGET', KEYS[n + 3], unpack(KEYS, 2, n + 1)), 1
	else
		held = redis.call('MGET', unpack(KEYS, 2, n + 1))
	end
end
local failed, first, now, tats, marks = 0, nil, nil, {}, {}
for i = 2, n + 1 do
	local r, v = nil, ARGV[2*i-2]
	if string.byte(v) == 114 then
		-- "r<increment>": a rate's turn, forced, by the server's clock.
		if not now then
			local t = redis.call('TIME')
			now = t[1] * 1000000 + t[2]
		end
		local tat = tats[KEYS[i]]
		if not tat then
			if held then tat = held[i - 1 + h] else tat = redis.call('GET', KEYS[i]) end
			tat = tonumber(tat or '0') or 0
		end
		tat = math.max(tat, now) + tonumber(string.sub(v, 2))
		tats[KEYS[i]] = tat
		redis.call('SET', KEYS[i], string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1)
	elseif (held and held[i - 1 + h]) or not redis.call('SET', KEYS[i], v, 'PXAT', ARGV[2*i-1], 'NX') then
		r = redis.pcall('INCRBYFLOAT', KEYS[i], v)
	elseif near then
		r = v -- a new counter: its count is the increment
	end
	if type(r) == 'table' and r.err then
		failed = failed + 1
		first = first or r.err
	elseif r and near then
		local at = tonumber(ARGV[2*n + 2*i - 1])
		local count, inc = tonumber(r), tonumber(v)
		if at > 0 and inc > 0 and count >= at and count - inc < at then
			if feed then
				-- The client key follows the tag, the size, the start
				-- and the namespace part.
				local k = KEYS[i]
				local p = string.find(k, '}:', 1, true) + 2
				p = string.find(k, ':', p, true) + 1
				p = string.find(k, ':', p, true) + 1
				marks[#marks + 1] = string.sub(k, p + tonumber(ARGV[2*n + 2]))
				marks[#marks + 1] = ARGV[2*n + 2*i]
			else
				marks[#marks + 1] = i - 2
			end
		end
	end
end
if #marks > 0 and feed then
	local version
	if held then version = held[1] else version = redis.call('GET', KEYS[n + 3]) end
	writeFeed(KEYS[n + 2], KEYS[n + 3], version, marks)
end
if failed > 0 then
	return redis.error_reply(failed .. ' counters refused their increment: ' .. first)
end
if #marks > 0 and not feed then
	return marks
end
return 1
`)

// feedSource defines writeFeed(feed, vkey, raw, marks), which appends
// marks to a namespace's near feed (see strategy.NearFeed): feed is the
// stream of the marks and vkey the string of their version, which holds
// raw (false when it does not exist); marks holds a key and its end (Unix
// milliseconds) for each mark, in the order made.
//
// The string holds "<version> <end> <streamed>" and then the newest
// marks, each " <end> <length of the key> <key>": the version of the
// newest mark, the latest end of a mark, at which both keys expire (so
// that a namespace whose marks all ended holds nothing and reads as
// version 0), and the version of the newest mark in the stream (0 for
// none). Each mark takes the next version, so a version counts the marks
// made since the feed was made, from the server's time in microseconds
// then (TIME), as bans' versions do, so that a reader of an older feed is
// never taken to be current. The marks the string holds are the newest
// ones, the versions after streamed; a reader whose version is among them
// or after streamed reads its marks from the string, which the fetch's
// MGET reads anyway. When the string would hold more than
// maxInlineMarkBytes of marks, they all go to the stream: one entry per
// 256 marks, whose ID is "<version of its last mark>-0" and whose fields
// and values are the marks' keys and ends, so that a reader after version
// v reads from ID v+1 (XRANGE) up to streamed. Each XADD drops, exactly
// (MINID), the entries that hold only marks older than the newest
// maxNearMarks, so that the feed never holds more than that many, and
// the stream expires with the latest end when it is written. A push that
// marks costs the SET of the string, and one XADD per 256 marks and a
// PEXPIREAT once the string is full.
const feedSource = `
local function writeFeed(feed, vkey, raw, marks)
	local v, last, streamed, held = 0, 0, 0, ''
	if raw then
		local a = string.find(raw, ' ', 1, true)
		local b = a and string.find(raw, ' ', a + 1, true)
		if b then
			local c = string.find(raw, ' ', b + 1, true) or (#raw + 1)
			v = tonumber(string.sub(raw, 1, a - 1)) or 0
			last = tonumber(string.sub(raw, a + 1, b - 1)) or 0
			streamed = tonumber(string.sub(raw, b + 1, c - 1)) or 0
			held = string.sub(raw, c)
		end
	end
	if v == 0 then
		local t = redis.call('TIME')
		v, last, streamed, held = t[1] * 1000000 + t[2], 0, 0, ''
	end
	local expire = last
	local add = {}
	for j = 1, #marks, 2 do
		expire = math.max(expire, tonumber(marks[j + 1]))
		add[#add + 1] = ' ' .. marks[j + 1] .. ' ' .. #marks[j] .. ' ' .. marks[j]
	end
	held = held .. table.concat(add)
	v = v + #marks / 2
	if #held > 512 then
		-- Every mark the string holds goes to the stream, in order.
		local all, p = {}, 1
		while p <= #held do
			local a = string.find(held, ' ', p + 1, true)
			local b = string.find(held, ' ', a + 1, true)
			local n = tonumber(string.sub(held, a + 1, b - 1))
			all[#all + 1] = string.sub(held, b + 1, b + n)
			all[#all + 1] = string.sub(held, p + 1, a - 1)
			p = b + n + 1
		end
		local first = v - #all / 2 -- the version before the first
		for c = 1, #all, 512 do
			local args = {'XADD', feed, 'MINID', string.format('%.0f', v - 65536 + 256), false}
			local upto = math.min(#all, c + 511)
			args[5] = string.format('%.0f-0', first + (upto / 2))
			for j = c, upto do
				args[#args + 1] = all[j]
			end
			local r = redis.pcall(unpack(args))
			if type(r) == 'table' and r.err then
				-- A stream left by a feed whose version was lost (evicted,
				-- say) may hold later IDs, or the key be no stream: drop it.
				redis.call('DEL', feed)
				redis.call(unpack(args))
			end
		end
		redis.call('PEXPIREAT', feed, string.format('%.0f', expire))
		streamed, held = v, ''
	end
	redis.call('SET', vkey, string.format('%.0f %.0f %.0f', v, expire, streamed) .. held, 'PXAT', string.format('%.0f', expire))
end
`

// maxInlineMarkBytes is the most bytes of marks that the string of a
// feed's version holds (see feedSource): every fetch reads them, and a
// reader up to date takes its new marks from there. feedSource holds the
// number itself.
const maxInlineMarkBytes = 512

// nearSource is the source of nearScript, kept to send with EVAL when a
// server does not hold the script. It writes a Cluster push's marks to
// its namespace's feed, whose slot the push's runs do not share (see
// feedSource): KEYS[1] is the stream, KEYS[2] the version, and ARGV a key
// and an end per mark. It replies 1.
const nearSource = feedSource + `
writeFeed(KEYS[1], KEYS[2], redis.call('GET', KEYS[2]), ARGV)
return 1
`

// nearScript is nearSource, run by its SHA1 digest.
var nearScript = goredis.NewScript(nearSource)

// noRetryCmd is a command that go-redis does not send again after a
// network error: its NoRetry overrides the embedded command's. go-redis
// resends other commands after a read timeout, an EOF or a reset, when the
// first attempt may have been applied with its reply lost, and a hit
// applied twice counts twice. Dialing is retried by the pool itself
// (DialerRetries), before anything is sent, so that retry is kept.
type noRetryCmd struct{ *goredis.Cmd }

// NoRetry reports that the command must be sent at most once.
func (noRetryCmd) NoRetry() bool { return true }

// runOnce runs a script the way Script.Run does, EVALSHA then EVAL when the
// server does not hold it, but never resends either command after a
// network error. A NOSCRIPT reply means that the EVALSHA did nothing, so
// the EVAL that follows it is not a resend. cmdArgs is the whole command:
// two slots that runOnce fills (the command's name and the script), the
// number of keys, the keys, then the script's arguments.
func runOnce(ctx context.Context, c goredis.UniversalClient, s *goredis.Script, src string, cmdArgs []any) *goredis.Cmd {
	cmdArgs[0], cmdArgs[1] = "evalsha", s.Hash()
	cmd := goredis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3) // route by the first key on a Cluster
	_ = c.Process(ctx, noRetryCmd{cmd})
	if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmdArgs[0], cmdArgs[1] = "eval", src
		cmd = goredis.NewCmd(ctx, cmdArgs...)
		cmd.SetFirstKeyPos(3)
		_ = c.Process(ctx, noRetryCmd{cmd})
	}
	return cmd
}

// scriptRun is one run of a script: the script, its source (for EVAL)
// and the whole command as runOnce takes it.
type scriptRun struct {
	script *goredis.Script
	src    string
	args   []any
}

// runOncePipelined runs each of runs in one pipeline: one round trip, or
// one per node on a Cluster, sent in parallel. Like runOnce it never
// resends a command after a network error, and runs with EVAL, in a
// second pipeline, the commands that a server refused for lack of their
// script. It returns the commands, in the order of runs.
func runOncePipelined(ctx context.Context, c goredis.UniversalClient, runs []scriptRun) []*goredis.Cmd {
	cmds := make([]*goredis.Cmd, len(runs))
	send := func(which []int, eval bool) {
		pipe := c.Pipeline()
		for _, i := range which {
			r := &runs[i]
			if eval {
				r.args[0], r.args[1] = "eval", r.src
			} else {
				r.args[0], r.args[1] = "evalsha", r.script.Hash()
			}
			cmds[i] = goredis.NewCmd(ctx, r.args...)
			cmds[i].SetFirstKeyPos(3) // route by the first key on a Cluster
			_ = pipe.Process(ctx, noRetryCmd{cmds[i]})
		}
		_, _ = pipe.Exec(ctx)
	}
	all := make([]int, len(runs))
	for i := range all {
		all[i] = i
	}
	send(all, false)
	var again []int
	for i, cmd := range cmds {
		if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		send(again, true)
	}
	return cmds
}

// scriptBuckets returns the bucket of each of calls, by index.
func scriptBuckets(calls []scriptCall) func(i int) int {
	return func(i int) int { return calls[i].bucket }
}

// scriptCall is the keys and arguments of one run of a script.
type scriptCall struct {
	keys []string
	args []any
	// bucket is the bucket of a Cluster run's counters (0 on a
	// standalone server), which its failure names (see Store.partial).
	bucket int
	// counters is how many counters a run of pushScript writes, which
	// bounds the diffs a pipeline carries.
	counters int
	// diffs is, for a run of pushScript that may mark keys near their
	// limits, the index in the batch of each counter's diff, -1 for a
	// rate's turn: a Cluster run replies the positions of the counters
	// that marked.
	diffs []int32
}

// evalPipelined runs every call of s with EVALSHA, in one pipeline: one
// round trip, or one per node on a Cluster, sent in parallel. When a server
// does not hold the script (it is new, restarted or flushed its scripts),
// the script is loaded on every primary and the refused calls run again:
// that costs two more round trips, once per server start. It returns the
// calls' commands, in order, and the first error.
func evalPipelined(ctx context.Context, c goredis.UniversalClient, s *goredis.Script, calls []scriptCall) ([]*goredis.Cmd, error) {
	cmds := make([]*goredis.Cmd, len(calls))
	pipe := c.Pipeline()
	for i, call := range calls {
		cmds[i] = s.EvalSha(ctx, pipe, call.keys, call.args...)
	}
	_, err := pipe.Exec(ctx)
	if err == nil {
		return cmds, nil
	}
	var again []int
	for i, cmd := range cmds {
		if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return cmds, err
	}
	// A Cluster loads the script on every master: one that is down
	// fails the load, not the calls of the others.
	loadErr := s.Load(ctx, c).Err()
	pipe = c.Pipeline()
	for _, i := range again {
		cmds[i] = s.EvalSha(ctx, pipe, calls[i].keys, calls[i].args...)
	}
	_, _ = pipe.Exec(ctx)
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			if loadErr != nil {
				err = fmt.Errorf("%w (loading the script: %v)", err, loadErr)
			}
			return cmds, err
		}
	}
	return cmds, nil
}

// evalPipelined runs every call of script as the function evalPipelined
// does, and on a Cluster, once more those that failed on a node whose
// slots another master serves by then (see resendable), such as a
// replica promoted after its master died. A call sent again is applied
// at most once all the same: a push's runs are guarded by their
// markers, and renewing slots twice renews them once. It returns the
// calls' commands, in order, and the first error of a call that did not
// succeed in the end.
func (s *Store) evalPipelined(ctx context.Context, script *goredis.Script, calls []scriptCall) ([]*goredis.Cmd, error) {
	ctx, failed := s.watch(ctx)
	cmds, err := evalPipelined(ctx, s.client, script, calls)
	if err == nil || failed == nil {
		return cmds, err
	}
	cmders := make([]goredis.Cmder, len(cmds))
	for i, cmd := range cmds {
		cmders[i] = cmd
	}
	again := s.resendable(ctx, failed, cmders, func(i int) string { return calls[i].keys[0] })
	if len(again) == 0 {
		return cmds, err
	}
	retry := make([]scriptCall, len(again))
	for j, i := range again {
		retry[j] = calls[i]
	}
	retried, _ := evalPipelined(ctx, s.client, script, retry)
	for j, i := range again {
		cmds[i] = retried[j]
	}
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return cmds, err
		}
	}
	return cmds, nil
}

// runOncePipelined runs scripts as the function runOncePipelined does,
// and on a Cluster runs once more, the same way, the commands that failed
// on a connection failure and surely were not sent (see notSent), if their
// slots are served by another master by then (see resendable).
func (s *Store) runOncePipelined(ctx context.Context, runs []scriptRun) []*goredis.Cmd {
	if len(runs) == 1 { // one command needs no pipeline, which costs more
		r := runs[0]
		return []*goredis.Cmd{s.runOnce(ctx, r.script, r.src, r.args, false)}
	}
	ctx, failed := s.watch(ctx)
	cmds := runOncePipelined(ctx, s.client, runs)
	if failed == nil {
		return cmds
	}
	var unsent []int
	var unsentCmds []goredis.Cmder
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && errors.Is(notSent(err), strategy.ErrNotSent) {
			unsent, unsentCmds = append(unsent, i), append(unsentCmds, cmd)
		}
	}
	if len(unsent) == 0 {
		return cmds
	}
	again := s.resendable(ctx, failed, unsentCmds, func(x int) string {
		key, _ := runs[unsent[x]].args[3].(string)
		return key
	})
	if len(again) == 0 {
		return cmds
	}
	retry := make([]scriptRun, len(again))
	for y, x := range again {
		retry[y] = runs[unsent[x]]
	}
	for y, cmd := range runOncePipelined(ctx, s.client, retry) {
		cmds[unsent[again[y]]] = cmd
	}
	return cmds
}

// runOnce runs a script as the function runOnce does, on the node of its
// first key, cmdArgs[3]. On a Cluster, a run that failed on a connection
// failure and surely was not sent (see notSent), or any run that failed on
// one if resend is set (for scripts that only read, or that are
// harmless when applied twice), is run once more if the key's slot is
// served by another master by then (see resendable).
func (s *Store) runOnce(ctx context.Context, script *goredis.Script, src string, cmdArgs []any, resend bool) *goredis.Cmd {
	ctx, failed := s.watch(ctx)
	cmd := runOnce(ctx, s.client, script, src, cmdArgs)
	if failed == nil || cmd.Err() == nil || !resend && !errors.Is(notSent(cmd.Err()), strategy.ErrNotSent) {
		return cmd
	}
	key, _ := cmdArgs[3].(string)
	if len(s.resendable(ctx, failed, []goredis.Cmder{cmd}, func(int) string { return key })) == 0 {
		return cmd
	}
	return runOnce(ctx, s.client, script, src, cmdArgs)
}
