package redis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"

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
var pushScript = newScript(tatSource + feedSource + `
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
		now = now or serverNow()
		local tat = tats[KEYS[i]]
		if not tat then
			if held then tat = held[i - 1 + h] else tat = redis.call('GET', KEYS[i]) end
			tat = tonumber(tat or '0') or 0
		end
		tat = arrival(tat, now, tonumber(string.sub(v, 2)))
		tats[KEYS[i]] = tat
		storeTAT(KEYS[i], tat, now)
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
// marks to a namespace's near feed (see strategy.NearFeed), and needs
// serverNowSource: feed is the
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
// marksPerEntry marks, whose ID is "<version of its last mark>-0" and whose fields
// and values are the marks' keys and ends, so that a reader after version
// v reads from ID v+1 (XRANGE) up to streamed. Each XADD drops, exactly
// (MINID), the entries that hold only marks older than the newest
// maxNearMarks, so that the feed never holds more than that many, and
// the stream expires with the latest end when it is written. A push that
// marks costs the SET of the string, and one XADD per marksPerEntry marks
// and a PEXPIREAT once the string is full.
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
		v, last, streamed, held = serverNow(), 0, 0, ''
	end
	local expire = last
	local add = {}
	for j = 1, #marks, 2 do
		expire = math.max(expire, tonumber(marks[j + 1]))
		add[#add + 1] = ' ' .. marks[j + 1] .. ' ' .. #marks[j] .. ' ' .. marks[j]
	end
	held = held .. table.concat(add)
	v = v + #marks / 2
	if #held > $maxInlineMarkBytes then
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
		for c = 1, #all, 2 * $marksPerEntry do
			local args = {'XADD', feed, 'MINID', string.format('%.0f', v - $maxNearMarks + $marksPerEntry), false}
			local upto = math.min(#all, c + 2 * $marksPerEntry - 1)
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

const (
	// maxInlineMarkBytes is the most bytes of marks that the string of a
	// feed's version holds (see feedSource): every fetch reads them, and
	// a reader up to date takes its new marks from there.
	maxInlineMarkBytes = 512
	// marksPerEntry is the most marks one entry of a feed's stream holds.
	marksPerEntry = 256
)

// nearScript writes a Cluster push's marks to
// its namespace's feed, whose slot the push's runs do not share (see
// feedSource): KEYS[1] is the stream, KEYS[2] the version, and ARGV a key
// and an end per mark. It replies 1.
var nearScript = newScript(serverNowSource + feedSource + `
writeFeed(KEYS[1], KEYS[2], redis.call('GET', KEYS[2]), ARGV)
return 1
`)

// script is a Lua script, sent by its SHA1 digest (EVALSHA), and by its
// source (EVAL) to a server that does not hold it yet. Its source's
// $names are Go's constants (see luaConstants), filled in once.
type script struct{ src, sha string }

func newScript(src string) *script {
	src = luaConstants.Replace(src)
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// luaConstants fills in the constants that the scripts share with Go.
var luaConstants = strings.NewReplacer(
	"$maxInlineMarkBytes", strconv.Itoa(maxInlineMarkBytes),
	"$marksPerEntry", strconv.Itoa(marksPerEntry),
	"$maxNearMarks", strconv.Itoa(maxNearMarks),
	"$banEpochFactor", strconv.Itoa(1<<strategy.BanEpochShift),
	"$maxPackedCountByte", strconv.Itoa(maxPackedCount>>40),
	"$maxExact", "9007199254740992", // 2^53: Lua's numbers hold the integers below it exactly
)

// serverNowSource and tatSource are the Lua helpers that the scripts
// which read the server's clock or move a rate's TAT share: serverNow()
// is the server's time (TIME) in Unix microseconds, which a Lua number
// holds exactly; arrival(tat, now, inc) is where a turn of inc
// microseconds taken at now moves a TAT (GCRA); and storeTAT writes a
// TAT, living until it passes.
const (
	serverNowSource = `
local function serverNow()
	local t = redis.call('TIME')
	return t[1] * 1000000 + t[2]
end
`
	tatSource = serverNowSource + `
local function arrival(tat, now, inc)
	return math.max(tat, now) + inc
end
local function storeTAT(key, tat, now)
	redis.call('SET', key, string.format('%.0f', tat), 'PX', math.floor((tat - now) / 1000) + 1)
end
`
)

// scriptRun is one run of a script. Its command is two slots that
// sendRuns fills (EVALSHA or EVAL, and the digest or the source), the
// number of keys, the keys, the first a string, then the arguments.
type scriptRun struct {
	script *script
	cmd    []any
	// bucket is the bucket of a Cluster run's keys (0 on a standalone
	// server), which its failure names (see Store.partial).
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

// newRun returns a run of sc on keys with args.
func newRun(sc *script, keys []string, args ...any) scriptRun {
	cmd := make([]any, 3, 3+len(keys)+len(args))
	cmd[2] = len(keys)
	for _, k := range keys {
		cmd = append(cmd, k)
	}
	return scriptRun{script: sc, cmd: append(cmd, args...)}
}

// resend says what may send a script run again after a network error,
// when the first attempt may have been applied with its reply lost.
type resend int

const (
	// sendOnce runs are sent at most once: a hit applied twice counts
	// twice. On a Cluster, one that surely was not sent (see notSent) is
	// sent to a master that took over its slot (see resendable).
	sendOnce resend = iota
	// resendOnCluster runs are harmless to apply twice, but go-redis
	// sends them once, so that an error that wraps strategy.ErrNotSent
	// says the truth; on a Cluster any that failed on a connection
	// failure is sent to a master that took over its slot.
	resendOnCluster
	// resendAlways runs are guarded by an ID, or harmless twice: go-redis
	// resends them as it does any command, and so does a Cluster.
	resendAlways
)

// noRetryCmd is a command that go-redis does not send again after a
// network error: its NoRetry overrides the embedded command's. Dialing is
// retried by the pool itself (DialerRetries), before anything is sent, so
// that retry is kept.
type noRetryCmd struct{ *goredis.Cmd }

// NoRetry reports that the command must be sent at most once.
func (noRetryCmd) NoRetry() bool { return true }

// sendRuns sends runs by EVALSHA, and once more by EVAL those that a
// server refused for lack of their script: a NOSCRIPT reply means that
// the EVALSHA did nothing, so the EVAL is no resend. Several runs are
// sent in a pipeline: one round trip, or one per node on a Cluster, sent
// in parallel. It returns the runs' commands, in order.
func sendRuns(ctx context.Context, c goredis.UniversalClient, runs []scriptRun, how resend) []*goredis.Cmd {
	cmds := make([]*goredis.Cmd, len(runs))
	for eval := false; ; eval = true {
		var pipe goredis.Pipeliner
		// One run needs no pipeline, which costs more, but one that
		// go-redis may resend keeps to the pipelines' connections, as
		// pushes and renewals of any size do.
		if len(runs) > 1 || how == resendAlways {
			pipe = c.Pipeline()
		}
		for i := range runs {
			r := &runs[i]
			if eval && !noScript(cmds[i]) {
				continue
			}
			r.cmd[0], r.cmd[1] = "evalsha", r.script.sha
			if eval {
				r.cmd[0], r.cmd[1] = "eval", r.script.src
			}
			cmds[i] = goredis.NewCmd(ctx, r.cmd...)
			cmds[i].SetFirstKeyPos(3) // route by the first key on a Cluster
			var cmd goredis.Cmder = cmds[i]
			if how != resendAlways {
				cmd = noRetryCmd{cmds[i]}
			}
			if pipe != nil {
				_ = pipe.Process(ctx, cmd)
			} else {
				_ = c.Process(ctx, cmd)
			}
		}
		if pipe != nil {
			_, _ = pipe.Exec(ctx)
		}
		if eval || !slices.ContainsFunc(cmds, noScript) {
			return cmds
		}
	}
}

// noScript reports whether cmd failed for lack of its script.
func noScript(cmd *goredis.Cmd) bool { return goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") }

// runScripts runs runs as sendRuns does, and on a Cluster once more, the
// same way, those that how lets it send again and that failed on a
// connection failure, if their slots are served by another master by
// then (see resendable). It returns the runs' commands, in order.
func (s *Store) runScripts(ctx context.Context, runs []scriptRun, how resend) []*goredis.Cmd {
	ctx, failed := s.watch(ctx)
	cmds := sendRuns(ctx, s.client, runs, how)
	if failed == nil {
		return cmds
	}
	var maybe []int
	var maybeCmds []goredis.Cmder
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && (how != sendOnce || errors.Is(notSent(err), strategy.ErrNotSent)) {
			maybe, maybeCmds = append(maybe, i), append(maybeCmds, cmd)
		}
	}
	again := s.resendable(ctx, failed, maybeCmds, func(x int) string {
		key, _ := runs[maybe[x]].cmd[3].(string)
		return key
	})
	if len(again) == 0 {
		return cmds
	}
	retry := make([]scriptRun, len(again))
	for y, x := range again {
		retry[y] = runs[maybe[x]]
	}
	for y, cmd := range sendRuns(ctx, s.client, retry, how) {
		cmds[maybe[again[y]]] = cmd
	}
	return cmds
}

// runScript runs one script as runScripts does.
func (s *Store) runScript(ctx context.Context, r scriptRun, how resend) *goredis.Cmd {
	return s.runScripts(ctx, []scriptRun{r}, how)[0]
}

// runPipeline runs runs that are harmless to apply twice (resendAlways)
// in one pipeline, and returns their commands and, on a standalone
// server, the first error. On a Cluster, where the other masters' runs
// go on (strategy.Parted), it adds the failure to parts, with the bucket
// of each run that failed.
func (s *Store) runPipeline(ctx context.Context, runs []scriptRun, parts *partFailures) ([]*goredis.Cmd, error) {
	cmds := s.runScripts(ctx, runs, resendAlways)
	err := firstErr(cmds)
	if err != nil && s.cluster {
		addFailed(parts, err, cmds, func(i int) int { return runs[i].bucket })
		return cmds, nil
	}
	return cmds, err
}

// firstErr returns the first error of cmds.
func firstErr(cmds []*goredis.Cmd) error {
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return err
		}
	}
	return nil
}
