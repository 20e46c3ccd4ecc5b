package redis

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// batchSource is the source of batchScript, kept to send with EVAL when a
// server does not hold it.
//
// It applies a batch of synchronous hits of one slot (of any slots on a
// standalone server) in order, each deciding as hitSource would if the
// hits ran one after the other, at the cost of one read and one write per
// counter, however many hits share it: one MGET reads every counter whose
// count the caller did not send, the hits are decided in Lua on running
// counts, and each counter that changed is written once at the end, with
// SET ... PXAT ... NX if it did not exist (its value and its fixed expiry)
// and INCRBYFLOAT of the sum of its increments otherwise (which keeps its
// expiry). Kong's order holds for each hit: window by window, while no
// window has rejected it, the increment is added to the current count;
// the first window whose rate, current + previous * weight, exceeds its
// limit rejects it, and the windows after it are only read. With undo, a
// rejected hit's increments are taken back at once, restoring the counts
// it found exactly. A counter that a hit writes and a later hit reads as
// its previous window's (hits of one key on both sides of a window's end)
// is one running count, so the later hit sees the earlier one.
//
// The batch's markers (see Store.HitBatch) come first: with one, SET NX
// PX checks and sets it in one command; with several, one EXISTS checks
// them all, and one SET PX per marker sets them only if none exists. If
// any existed, the batch (or its diffs, pushed as a Batch of its ID) was
// applied before: every hit only reads, and is decided on the counts as
// they are, as a hit whose increments are all "0" would.
//
// Hits with a rate (see strategy.RateBatcher) are decided by the
// server's clock (TIME, read once, in Unix microseconds) on their keys'
// TATs, read with the counters: the rate first; a hit it refuses touches
// no counter; one a window then rejects leaves the TAT as it was; each
// TAT that moved is written once at the end, living until it passes.
//
// KEYS[1..M] are the markers, KEYS[M+1..M+C] the counters and the last R
// keys the TATs, each once, all in one slot on a Cluster. ARGV[1] is M,
// ARGV[2] the markers' time to live in milliseconds and ARGV[3] R; then,
// for counter j (KEYS[M+j]), ARGV[2j+2] is its expiry in Unix
// milliseconds and ARGV[2j+3] its count, or "" to read it (only previous
// windows' counts are sent: see prevCache). Then come the forms of the
// hits: their number, then for each, "1" to undo a rejected hit (or "0"),
// its number of windows, the index r of its TAT (0 for no rate) and, with
// one, the rate's increment and tolerance in microseconds, and four
// arguments per window: the indexes j of its current and previous
// counters, its increment ("0" only reads) and its limit ("" for none,
// "-" for one that every rate exceeds). The hits of a batch mostly share
// a form (one key, one set of limits), so each hit, in order, is only the
// index of its form and each window's previous weight.
//
// It replies 1 if the hits applied (0 if a marker existed), each counter's
// count before the hits, with TATs the server's now and each TAT before
// the hits, then, for each hit in order, the 0-based index of the window
// that rejected it or -1: what the caller needs to compute, in doubles as
// the script does, every hit's counts and rates (see batchRun.answer),
// in a reply a fifth the size of every hit's counts. A count that is a
// whole number is replied as an integer, any other as a string of 17
// significant digits (Redis would truncate a Lua number), which reads back
// as the same double; formatting those cost more than the rest of a hit.
const batchSource = `
local m, nr = tonumber(ARGV[1]), tonumber(ARGV[3])
local nc = #KEYS - m - nr
local apply = true
if m == 1 then
	if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) then
		apply = false
	end
elseif m > 1 then
	local found = 0
	for i = 1, m, 1000 do
		found = found + redis.call('EXISTS', unpack(KEYS, i, math.min(m, i + 999)))
	end
	if found > 0 then
		apply = false
	else
		for i = 1, m do
			redis.call('SET', KEYS[i], '1', 'PX', ARGV[2])
		end
	end
end
-- val[j] is counter j's running count; held[j] whether it exists; tat[r]
-- is TAT r's running value (0 for none).
local val, held, tat, toread, at = {}, {}, {}, {}, {}
for j = 1, nc do
	local c = ARGV[2 * j + 3]
	if c == '' then
		toread[#toread + 1], at[#at + 1] = KEYS[m + j], j
	else
		val[j] = tonumber(c)
	end
end
for r = 1, nr do
	toread[#toread + 1], at[#at + 1] = KEYS[m + nc + r], -r
end
for i = 1, #toread, 1000 do
	local last = math.min(#toread, i + 999)
	local got = redis.call('MGET', unpack(toread, i, last))
	for x = i, last do
		local v, j = got[x - i + 1], at[x]
		local n = tonumber(v or '0')
		if not n then
			return redis.error_reply('a counter holds ' .. v .. ', not a number')
		end
		if j < 0 then
			tat[-j] = n
		else
			held[j], val[j] = v ~= false, n
		end
	end
end
local reply = {apply and 1 or 0}
for j = 1, nc do
	reply[j + 1] = val[j]
end
local now = 0
if nr > 0 then
	local t = redis.call('TIME')
	now = t[1] * 1000000 + t[2]
	reply[nc + 2] = now
	for r = 1, nr do
		reply[nc + 2 + r] = tat[r]
	end
end
-- The forms' windows, one after the other: form f's window i is window
-- fo[f] + i, with counters wc and wp, increment winc and limit wlim (false
-- for none, true for one that every rate exceeds). frate[f] is the index
-- of the form's TAT (0 for none), with its increment and tolerance.
local p = 2 * nc + 4
local nf = tonumber(ARGV[p])
p = p + 1
local fundo, fnw, fo, frate, finc, ftol, wc, wp, winc, wlim = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
local k = 0
for f = 1, nf do
	local nw, ri = tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
	fundo[f], fnw[f], fo[f], frate[f] = ARGV[p] == '1', nw, k, ri
	p = p + 3
	if ri > 0 then
		finc[f], ftol[f] = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
		p = p + 2
	end
	for i = 1, nw do
		local a = p + 4 * i - 4
		k = k + 1
		wc[k], wp[k], winc[k] = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
		local l = ARGV[a + 3]
		if l == '' then
			wlim[k] = false
		elseif l == '-' then
			wlim[k] = true
		else
			wlim[k] = tonumber(l)
		end
	end
	p = p + 4 * nw
end
-- delta[j] is the sum of counter j's increments; saved* hold what a hit
-- found, to restore when it is undone; moved[r] says TAT r moved.
local delta, savedc, savedv, savedd, moved = {}, {}, {}, {}, {}
local nargv, h = #ARGV, #reply
while p <= nargv do
	local f = tonumber(ARGV[p])
	local nw, o, undo, rej, ns = fnw[f], fo[f], fundo[f], 0, 0
	local ri, admit, due = frate[f], true, 0
	if ri > 0 then
		due = math.max(tat[ri], now) + finc[f]
		admit = due - now <= ftol[f]
	end
	for i = 1, admit and nw or 0 do
		local ci, d = wc[o + i], winc[o + i]
		if apply and rej == 0 and d ~= 0 then
			if undo then
				ns = ns + 1
				savedc[ns], savedv[ns], savedd[ns] = ci, val[ci], delta[ci] or 0
			end
			val[ci] = val[ci] + d
			delta[ci] = (delta[ci] or 0) + d
		end
		local l = wlim[o + i]
		if rej == 0 and l and (l == true or val[ci] + val[wp[o + i]] * tonumber(ARGV[p + i]) > l) then
			rej = i
		end
	end
	if undo and rej > 0 and ns > 0 then
		for x = ns, 1, -1 do
			val[savedc[x]], delta[savedc[x]] = savedv[x], savedd[x]
		end
	end
	if ri > 0 and admit and apply and rej == 0 then
		tat[ri], moved[ri] = due, true
	end
	h = h + 1
	reply[h] = rej - 1
	p = p + 1 + nw
end
local function whole(v)
	return v ~= 0 and v % 1 == 0 and v < 9007199254740992 and v > -9007199254740992
end
for j = 1, nc do
	local d = delta[j]
	if d and d ~= 0 then
		local key, v = KEYS[m + j], nil
		if whole(d) then
			v = string.format('%d', d)
		else
			v = string.format('%.17g', d)
		end
		if held[j] and whole(d) and whole(val[j]) then
			redis.call('SET', key, string.format('%d', val[j]), 'KEEPTTL')
		elseif held[j] or not redis.call('SET', key, v, 'PXAT', ARGV[2 * j + 2], 'NX') then
			redis.call('INCRBYFLOAT', key, v)
		end
	end
end
for r = 1, nr do
	if moved[r] then
		redis.call('SET', KEYS[m + nc + r], string.format('%.0f', tat[r]), 'PX', math.floor((tat[r] - now) / 1000) + 1)
	end
end
for j = 2, nc + 1 do
	if not whole(reply[j]) then
		reply[j] = string.format('%.17g', reply[j])
	end
end
return reply
`

// batchScript is batchSource, run by its SHA1 digest.
var batchScript = goredis.NewScript(batchSource)

// HitBatch applies several synchronous hits of a namespace, in order, each
// deciding as Hit would if they were sent one after the other (see
// strategy.BatchHitter for the contract): one script run for the whole
// batch on a standalone server or a Sentinel-managed primary, and one per
// Cluster slot its keys fall in, pipelined (go-redis sends one pipeline
// per node, in parallel). A script reads each counter once and writes it
// once, however many hits of the batch share it: a batch of n hits of one
// key with two windows costs Redis five commands (the EVALSHA, the
// marker's SET NX, one MGET and a write per counter), whatever n. A batch
// of one hit is sent as Hit sends it.
//
// A non-empty id names the batch. Each script run sets, for every bucket
// of its hits, the markers of groups 0 to ceil(w/256)-1 of the bucket
// under that ID, w being the number of windows of the run's hits of the
// bucket: only if none of them exists, in which case it applies its hits;
// if one does, it only reads, and decides on the counts as they are. A
// Batch of the same ID holding at most one diff per window of the hits
// that failed then checks only markers that the run set: see the package
// documentation (Batches of synchronous hits) for why, and what the
// caller must keep to. The markers live as a hit's do.
//
// A hit with a slot (see strategy.SlotBatcher) is a run of the script of
// AcquireSlot, in the same pipeline, after the hits' runs: the slots of a
// key are taken in the batch's order.
//
// Each hit is checked as Hit checks its input; a bad one gets an error that
// wraps strategy.ErrRejected in its result, and the others are sent
// without it. A script run is sent at most once, as a hit is, and its
// failure sets the error of each of its hits: of all of them on a
// standalone server, of the hits of one slot on a Cluster. The error wraps
// strategy.ErrNotSent when the run surely never reached Redis.
func (s *Store) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	good := errs.CheckBatch(namespace, id, hits, results)
	if len(good) == 0 {
		return
	}
	if err := s.checkOpen(); err != nil {
		errs.FailBatch(results, namespace, good, err)
		return
	}
	if len(good) == 1 && hits[good[0]].Rate == nil && hits[good[0]].Slot == nil {
		errs.HitOne(ctx, namespace, id, hits, results, good[0], s.hit)
		return
	}
	// The slots' runs go in the pipeline after the hits'.
	counted, slots := strategy.SplitSlots(hits, good)

	// One run per slot, in the order of their first hits.
	nowMs := s.now().UnixMilli()
	nsp := nsPart(namespace)
	// Each run is sized for its hits: first the hits' buckets and how many
	// fall in each slot.
	ks, perSlot := make([]int, len(counted)), make(map[int]int)
	for x, i := range counted {
		ks[x] = bucketOf(namespace, hits[i].Key)
		perSlot[s.slotOf(ks[x])]++
	}
	var runs []*batchRun
	bySlot := make(map[int]*batchRun, len(perSlot))
	for x, i := range counted {
		slot := s.slotOf(ks[x])
		r := bySlot[slot]
		if r == nil {
			r = newBatchRun(perSlot[slot])
			bySlot[slot] = r
			runs = append(runs, r)
		}
		r.add(s.layout, i, ks[x], nsp, &hits[i])
	}
	scripts := make([]scriptRun, 0, len(runs)+len(slots))
	for _, r := range runs {
		scripts = append(scripts, scriptRun{batchScript, batchSource, r.command(s, id, nowMs)})
	}
	for _, i := range slots {
		scripts = append(scripts, s.acquireSlotRun(namespace, hits[i].Key, *hits[i].Slot))
	}

	cmds := s.runOncePipelined(ctx, scripts)
	for n, r := range runs {
		reply, err := cmds[n].Slice()
		if err == nil {
			err = r.answer(s, results, reply, nowMs)
		}
		if err != nil {
			errs.FailBatch(results, namespace, r.hits, notSent(err))
		}
	}
	for n, i := range slots {
		reply, err := slotReply(cmds[len(runs)+n])
		if err != nil {
			errs.FailBatch(results, namespace, []int{i}, err)
			continue
		}
		results[i].Slot = reply
	}
}

// batchRun is one script run of a HitBatch: hits of one slot, or of any
// slots on a standalone server.
type batchRun struct {
	hits    []int       // indexes of the run's hits in the batch, in order
	formOf  []int       // the index of each hit's form, in the run's order
	windows map[int]int // bucket: the number of windows of the run's hits in it
	// The counters, each once: their keys, by key their indexes, and what
	// the run knows of each.
	keys     []string
	index    map[string]int
	counters []batchCounter
	// The TATs of the hits' rates, each once, and by key their indexes.
	tats     []string
	tatIndex map[string]int
	// The forms of the hits: a form is a key's windows as one hit sends
	// them, which its next hits mostly share. lastForm holds each key's
	// latest form.
	forms    []batchForm
	lastForm map[string]int
	formArgs []any  // the forms' arguments to the script
	hitArgs  []any  // the hits' arguments to the script
	lastExp  int64  // the latest expiry of a current counter
	buf      []byte // scratch space for counter keys
	weights  []byte // the hits' weights, formatted (see weightArg)
	// The hits of a batch mostly share their values, limits and weights:
	// the last of each formatted, to reuse rather than format again.
	value, limit, weight formatted
}

// batchForm is the form of a run's hits of one key with the same windows
// (but for their weights), and whether they undo when rejected.
type batchForm struct {
	undo    bool
	windows []formWindow
	// rate, for hits with a rate, is the index of its TAT in the run,
	// plus 1 (0 for none), and inc and tol its increment and tolerance in
	// microseconds.
	rate     int
	inc, tol int64
	rateWin  time.Duration
}

// formWindow is a window of a form: what the hits send of it, and the
// indexes of its current and previous counters in the run.
type formWindow struct {
	size       time.Duration
	start      int64
	value, max float64
	cur, prev  int
}

// matches reports whether h sends f's windows.
func (f *batchForm) matches(h *strategy.HitRequest) bool {
	if f.undo != h.Undo || len(f.windows) != len(h.Windows) || (f.rate != 0) != (h.Rate != nil) {
		return false
	}
	if r := h.Rate; r != nil && (f.rateWin != r.Window || f.inc != r.Increment.Microseconds() || f.tol != r.Tolerance.Microseconds()) {
		return false
	}
	for w := range f.windows {
		fw, hw := &f.windows[w], &h.Windows[w]
		if fw.size != hw.Size || fw.start != hw.Start || fw.value != hw.Value || fw.max != hw.Max {
			return false
		}
	}
	return true
}

// formatted is a number formatted for a script, and the number.
type formatted struct {
	v   float64
	arg any
}

// format returns f's argument if it formats v, or else v formatted by
// with, which it remembers.
func (f *formatted) format(v float64, with func(float64) any) any {
	if f.arg == nil || f.v != v {
		f.v, f.arg = v, with(v)
	}
	return f.arg
}

// batchCounter is what a batchRun knows of one of its counters.
type batchCounter struct {
	bucket int
	expMs  int64 // its expiry, if it is a current counter
	// current is set when the counter is some window's current counter:
	// its count changes in the run, so it is always read.
	current bool
	// For a counter that is only read as windows' previous counter: the
	// start of those windows (Unix milliseconds), whether any gives it a
	// weight, and the last hit that reads it (see answer).
	startMs  int64
	weighted bool
	lastHit  int // index in the run's hits
	lastWin  int // index in that hit's windows
	// sent is the count sent to the script, from the store's memory
	// (prevCache), and sentAt when it was read; "" when it is read.
	sent   string
	sentAt int64
}

// newBatchRun returns a run with room for n hits of two windows.
func newBatchRun(n int) *batchRun {
	return &batchRun{
		windows: make(map[int]int), index: make(map[string]int), lastForm: make(map[string]int),
		hits: make([]int, 0, n), formOf: make([]int, 0, n), hitArgs: make([]any, 0, 3*n),
	}
}

// counter returns the index of a counter of bucket k, adding it if new.
func (r *batchRun) counter(l *layout, k int, sizeMs, startMs int64, nsp, key string) int {
	var c string
	c, r.buf = l.counterKey(r.buf, k, sizeMs, startMs, nsp, key)
	j, ok := r.index[c]
	if !ok {
		j = len(r.keys)
		r.keys = append(r.keys, c)
		r.index[c] = j
		r.counters = append(r.counters, batchCounter{bucket: k, startMs: startMs + sizeMs})
	}
	return j
}

// add adds hit i, of bucket k, to the run.
func (r *batchRun) add(l *layout, i, k int, nsp string, h *strategy.HitRequest) {
	r.windows[k] += len(h.Windows)
	if h.Rate != nil {
		r.windows[k]++ // a retry's RateDiff counts as a window (see HitBatch)
	}
	f := r.form(l, k, nsp, h)
	r.formOf = append(r.formOf, f)
	r.hitArgs = append(r.hitArgs, f+1)
	for w := range h.Windows {
		weight := h.Windows[w].Weight
		p := &r.counters[r.forms[f].windows[w].prev]
		p.weighted = p.weighted || weight != 0
		p.lastHit, p.lastWin = len(r.hits), w
		r.hitArgs = append(r.hitArgs, r.weight.format(weight, r.weightArg))
	}
	r.hits = append(r.hits, i)
}

// weightArg formats a weight as scriptValue does, as bytes of one buffer
// that the run's weights share: a batch's hits have weights of their own.
func (r *batchRun) weightArg(w float64) any {
	if w == 0 {
		return "0"
	}
	at := len(r.weights)
	r.weights = strconv.AppendFloat(r.weights, w, 'g', -1, 64)
	return r.weights[at:len(r.weights):len(r.weights)]
}

// form returns the index of the form of h, of bucket k: its key's latest
// form if h matches it, or a new one.
func (r *batchRun) form(l *layout, k int, nsp string, h *strategy.HitRequest) int {
	if f, ok := r.lastForm[h.Key]; ok && r.forms[f].matches(h) {
		return f
	}
	form := batchForm{undo: h.Undo, windows: make([]formWindow, len(h.Windows))}
	var undo any = "0"
	if h.Undo {
		undo = "1"
	}
	r.formArgs = append(r.formArgs, undo, len(h.Windows))
	if rate := h.Rate; rate == nil {
		r.formArgs = append(r.formArgs, 0)
	} else {
		t := l.rateKey(k, rate.Window.Milliseconds(), nsp, h.Key)
		j, ok := r.tatIndex[t]
		if !ok {
			if r.tatIndex == nil { // made for runs with rates only: not on every batch's path
				r.tatIndex = make(map[string]int)
			}
			j = len(r.tats)
			r.tatIndex[t] = j
			r.tats = append(r.tats, t)
		}
		form.rate, form.rateWin, form.inc, form.tol = j+1, rate.Window, rate.Increment.Microseconds(), rate.Tolerance.Microseconds()
		r.formArgs = append(r.formArgs, j+1, form.inc, form.tol)
	}
	for w := range h.Windows {
		win := &h.Windows[w]
		sizeMs, startMs := int64(win.Size/time.Millisecond), win.Start/int64(time.Millisecond)
		cur := r.counter(l, k, sizeMs, startMs, nsp, h.Key)
		prev := r.counter(l, k, sizeMs, startMs-sizeMs, nsp, h.Key)
		c := &r.counters[cur]
		c.current, c.expMs = true, expireAtMs(sizeMs, startMs)
		r.lastExp = max(r.lastExp, c.expMs)
		form.windows[w] = formWindow{size: win.Size, start: win.Start, value: win.Value, max: win.Max, cur: cur, prev: prev}
		r.formArgs = append(r.formArgs, cur+1, prev+1,
			r.value.format(win.Value, scriptValue), r.limit.format(win.Max, scriptLimit))
	}
	f := len(r.forms)
	r.forms = append(r.forms, form)
	r.lastForm[h.Key] = f
	return f
}

// scriptValue formats an increment or a weight for the scripts: "0" for
// zero (and never "-0").
func scriptValue(v float64) any {
	if v == 0 {
		return "0"
	}
	return formatValue(v)
}

// scriptLimit formats a limit for the scripts: "" for +Inf, which no rate
// exceeds, and "-" for -Inf, which every rate does (Lua 5.1's tonumber
// cannot be trusted with "inf").
func scriptLimit(v float64) any {
	switch {
	case math.IsInf(v, 1):
		return ""
	case math.IsInf(v, -1):
		return "-"
	}
	return formatValue(v)
}

// command returns the run's EVALSHA command (two slots for runOnce to
// fill, then the number of keys, the keys and the arguments), sending the
// previous counts that the store remembers and may use (see prevCache).
func (r *batchRun) command(s *Store, id string, nowMs int64) []any {
	var markers []string
	switch {
	case id == "":
	case s.cluster:
		for _, k := range slices.Sorted(maps.Keys(r.windows)) {
			for n := range (r.windows[k] + maxScriptKeys - 1) / maxScriptKeys {
				markers = append(markers, s.dedupeKey(k, n, id))
			}
		}
	default: // the batch's own groups, whatever their buckets
		w := 0
		for _, n := range r.windows {
			w += n
		}
		for n := range (w + maxScriptKeys - 1) / maxScriptKeys {
			markers = append(markers, s.dedupeKey(0, n, id))
		}
	}
	nkeys := len(markers) + len(r.keys) + len(r.tats)
	cmd := make([]any, 3, 3+nkeys+4+2*len(r.keys)+len(r.formArgs)+len(r.hitArgs))
	cmd[2] = nkeys
	for _, m := range markers {
		cmd = append(cmd, m)
	}
	for _, k := range r.keys {
		cmd = append(cmd, k)
	}
	for _, t := range r.tats {
		cmd = append(cmd, t)
	}
	cmd = append(cmd, len(markers), hitMarkerTTL(r.lastExp, nowMs), len(r.tats))
	for j := range r.counters {
		c := &r.counters[j]
		if !c.current && s.prevs != nil {
			if e, ok := s.prevs.get(c.bucket, r.keys[j]); ok && e.usablePrev(c.startMs, nowMs, boolWeight(c.weighted)) {
				c.sent, c.sentAt = e.prev, e.readAt
			}
		}
		cmd = append(cmd, c.expMs, c.sent)
	}
	cmd = append(cmd, len(r.forms))
	cmd = append(cmd, r.formArgs...)
	return append(cmd, r.hitArgs...)
}

// boolWeight is a weight that is 0 or not, as prevEntry.usablePrev tells
// them apart.
func boolWeight(weighted bool) float64 {
	if weighted {
		return 1
	}
	return 0
}

// answer fills the results of the run's hits from the script's reply, and
// has the store remember the previous counts it read.
//
// The reply holds the counters' counts before the hits and each hit's
// rejecting window: each hit's counts are computed here as the script
// computed them, in the same order and the same doubles: window by
// window, while no window has rejected the hit (the rejecting one
// included), the increment is added to the running count of the current
// counter, and the window's counts are the running counts of its two
// counters; a rejected hit with undo then restores the counts it found,
// and its windows up to the rejecting one report their current counts
// restored. Nothing is added when the hits did not apply.
func (r *batchRun) answer(s *Store, results []strategy.HitResult, reply []any, nowMs int64) error {
	nc, nr := len(r.counters), len(r.tats)
	head := 1 + nc // the reply before the hits' rejecting windows
	if nr > 0 {
		head += 1 + nr
	}
	if len(reply) != head+len(r.hits) {
		return fmt.Errorf("the batch script replied %d values, not %d", len(reply), head+len(r.hits))
	}
	apply := reply[0] == int64(1)
	// The TATs and the server's clock, in microseconds.
	var now int64
	tats := make([]int64, nr)
	if nr > 0 {
		var ok bool
		if now, ok = reply[1+nc].(int64); !ok || now <= 0 {
			return fmt.Errorf("the batch script replied %v, not a time", reply[1+nc])
		}
		for x := range tats {
			if tats[x], ok = reply[2+nc+x].(int64); !ok {
				return fmt.Errorf("%s: the script replied %v, not a TAT", r.tats[x], reply[2+nc+x])
			}
		}
	}
	val := make([]float64, nc)
	for j := range val {
		v, err := replyCount(reply[1+j])
		if err != nil {
			return fmt.Errorf("%s: %w", r.keys[j], err)
		}
		val[j] = v
	}
	// Read-only counters keep their counts through the run.
	prevText := func(j int) string {
		if str, ok := reply[1+j].(string); ok {
			return str
		}
		return strconv.FormatInt(reply[1+j].(int64), 10)
	}

	parsed := make([]strategy.HitResult, len(r.hits))
	counts := make([]strategy.WindowCounts, 0, len(r.hits)*len(r.forms[0].windows))
	type saved struct {
		j int
		v float64
	}
	var found []saved
	for x, i := range r.hits {
		f := &r.forms[r.formOf[x]]
		rejected, ok := reply[head+x].(int64)
		if !ok || rejected < -1 || rejected >= int64(len(f.windows)) {
			return fmt.Errorf("hits[%d]: the script replied %v, not a window index", i, reply[head+x])
		}
		// The rate first, as the script decides it.
		admit, due := true, int64(0)
		if f.rate > 0 {
			due = max(tats[f.rate-1], now) + f.inc
			admit = due-now <= f.tol
		}
		at := len(counts)
		found = found[:0]
		for w := range f.windows {
			fw := &f.windows[w]
			if apply && admit && (rejected < 0 || w <= int(rejected)) && fw.value != 0 {
				found = append(found, saved{fw.cur, val[fw.cur]})
				val[fw.cur] += fw.value
			}
			counts = append(counts, strategy.WindowCounts{Current: val[fw.cur], Previous: val[fw.prev]})
		}
		c := counts[at:len(counts):len(counts)]
		if f.undo && rejected >= 0 && len(found) > 0 {
			for n := len(found) - 1; n >= 0; n-- {
				val[found[n].j] = found[n].v
			}
			for w := 0; w <= int(rejected); w++ {
				c[w].Current = val[f.windows[w].cur]
			}
		}
		parsed[x] = strategy.HitResult{Counts: c, Rejected: int(rejected)}
		if f.rate > 0 {
			if admit && apply && rejected < 0 {
				tats[f.rate-1] = due
			}
			parsed[x].Rate = strategy.RateReply{OK: admit, TAT: tats[f.rate-1] * 1e3, Now: now * 1e3}
		}
	}
	for x, i := range r.hits {
		results[i] = parsed[x]
	}
	if s.prevs == nil {
		return nil
	}
	// Remember, for each window only read as a previous one, its count
	// and the current count of the window after it.
	for j := range r.counters {
		c := &r.counters[j]
		if c.current {
			continue
		}
		counts := parsed[c.lastHit].Counts[c.lastWin]
		e := prevEntry{prev: prevText(j), readAt: c.sentAt, prevCount: counts.Previous, cur: counts.Current}
		if c.sent != "" {
			e.prev = c.sent // as it was, to the byte
		}
		if e.readAt == 0 {
			e.readAt = nowMs
		}
		s.prevs.put(c.bucket, r.keys[j], e, nowMs)
	}
	return nil
}

// replyCount parses a count the batch script replied: an integer, or a
// string for any other number.
func replyCount(v any) (float64, error) {
	switch v := v.(type) {
	case int64:
		return float64(v), nil
	case string:
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f, nil
		}
	}
	return 0, fmt.Errorf("the script replied %v, not a count", v)
}

// slotOf returns the slot of bucket k's keys on a Cluster, and 0 on a
// standalone server, where every key is in one.
func (s *Store) slotOf(k int) int {
	if s.cluster {
		return int(bucketSlots[k])
	}
	return 0
}

// bucketSlots maps each bucket to the Cluster hash slot of its keys.
var bucketSlots = func() (slots [buckets]uint16) {
	for k := range slots {
		slots[k] = hashSlot(strconv.Itoa(k))
	}
	return slots
}()

// hashSlot returns the Cluster hash slot of a hash tag's text: CRC16
// (XMODEM) modulo 16384, as Redis computes it.
func hashSlot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
