package redis

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// batchScript applies a batch of synchronous hits of one slot (of any slots on a
// standalone server) in order, each deciding as if the hits ran one after
// the other, at the cost of one read and one write per
// counter, however many hits share it: one MGET reads every counter whose
// count the caller did not send, the hits are decided in Lua on running
// counts, and each counter that changed is written once at the end, with
// SET ... PXAT ... NX if it did not exist (its value and its fixed expiry),
// SET ... KEEPTTL of a count that stays whole and INCRBYFLOAT of the sum
// of its increments otherwise (both keep its expiry). Kong's order holds
// for each hit: window by window, while no window has rejected it, the
// increment is added to the current count; the first window whose rate,
// current + previous * weight, exceeds its limit rejects it, and the
// windows after it are only read. With undo, a rejected hit's increments
// are taken back at once, restoring the counts it found exactly. A
// counter that a hit writes and a later hit reads as its previous
// window's is one running count, so the later hit sees the earlier one.
//
// Most batches are far from their limits, and deciding them hit by hit
// is wasted work. When the caller allows it (every increment a whole
// number above 0, no rate, no limit of -Inf, and each current counter in
// one window of one form), the script takes the fast way: it adds to
// each current counter the increments of all its form's hits with
// INCRBY, which keeps the counter's expiry (a counter it makes gets its
// expiry with PEXPIREAT) and replies the count, and checks that the
// window stays under its limit at that count, with the greatest weight
// any hit of its shape gives the previous count. If every window does,
// every hit is admitted, as deciding hit by hit would find (counts only
// grow in such a batch, and whole numbers add exactly in any order): the
// current counters cost one command each, read and write, and the hits
// are not looked at. A window over its limit, or a count INCRBY cannot
// add to (not an integer), takes back the increments made so far, and
// the hits are decided one by one.
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
// Besides its commands, what Redis spends on a batch is mostly its
// arguments, Lua's tonumber (strtod) and the tables the script makes, so
// the batch is sent in few arguments, numbers packed in binary where
// they can be. Counters are numbered 1 to C: first the C1 current
// counters (those some window writes), then the C2 previous ones to read,
// then the S previous ones whose counts the caller sends (see prevCache),
// which are not keys of the script. KEYS[1..M] are the markers, then the
// C1 + C2 counters and the R TATs, all in one slot on a Cluster. ARGV[1]
// is the header, 16-bit big-endian numbers: M, R, C1, the number E of
// the current counters' expiries, the number of the shapes that the
// forms share (a shape is what hits of any key with the same limits
// send), 1 if the caller allows the fast way above (or 0), and for each
// shape 1 to undo a rejected hit (or 0), its number of windows and 1 if
// it has a rate (or 0). ARGV[2] is the markers' time to live in
// milliseconds, and the E expiries follow, in Unix milliseconds. Then
// come the shapes' numbers that are not whole: for each, the rate's
// increment and tolerance in microseconds if it has one, and three
// arguments per window: its increment ("0" only reads), its limit (""
// for none, "-" for one that every rate exceeds) and the greatest weight
// any hit of the shape gives the previous count. Then, each packed in one
// argument, the current counters' expiries (each the 1-based index of
// one of the E), the forms, the hits, the weights and the S counts sent;
// then the counts sent that do not pack, in decimal. A form is a key's
// windows as its hits send them, which a batch's hits of one key mostly
// share: its shape, the index of its TAT (0 for none), its number of
// hits, and the indexes of each window's current and previous counters,
// each a 16-bit big-endian number, as are a counter's expiry and a hit,
// the index of its form, in the batch's order. The weights are each
// hit's windows' previous weights, in order, separated by spaces, read
// only when the hits are decided one by one. A count sent is six bytes:
// a whole number below 255 * 2^40, big-endian, or 255 and five zeros for
// one sent in decimal, in the next of the arguments after them.
//
// It replies 1 if the hits applied (0 if a marker existed), the count
// before the hits of each counter it read (C1 + C2), as Redis holds it
// (an integer when the fast way computed it), with TATs the server's now
// and each TAT before the hits, then, unless every hit was admitted the
// fast way, for each hit in order the 0-based index of the window that
// rejected it or -1: what the caller needs to compute, in doubles as the
// script does, every hit's counts and rates (see batchRun.answer).
var batchScript = newScript(tatSource + `
-- Globals a batch reads often, as locals: each global costs a table
-- lookup a read (two for a field of one).
local byte, tonumber, type, rcall, rpcall = string.byte, tonumber, type, redis.call, redis.pcall
local KEYS, ARGV = KEYS, ARGV
-- sized(n) is an empty table with room for entries 1 to n, made at once:
-- one filled from empty grows, and rehashes, at 1, 2, 4, 8... entries.
-- (Past 4000 entries it grows as it is filled: unpack's results take
-- the stack.)
local none = {}
local function sized(n)
	return {unpack(none, 1, math.min(n, 4000))}
end
-- The header's numbers, 16 bits each: hd(i) is the ith.
local hb = {byte(ARGV[1], 1, -1)}
local function hd(i)
	return hb[2 * i - 1] * 256 + hb[2 * i]
end
local m, nr, c1, ne, ns = hd(1), hd(2), hd(3), hd(4), hd(5)
local nread = #KEYS - m - nr
local apply = true
if m == 1 then
	if not rcall('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) then
		apply = false
	end
elseif m > 1 then
	local found = 0
	for i = 1, m, 1000 do
		found = found + rcall('EXISTS', unpack(KEYS, i, math.min(m, i + 999)))
	end
	if found > 0 then
		apply = false
	else
		for i = 1, m do
			rcall('SET', KEYS[i], '1', 'PX', ARGV[2])
		end
	end
end
-- The shapes, each a record: whether its hits undo, its number of windows
-- nw, and its rate's increment and tolerance (nil for none). Its windows
-- follow one another in wins: shape s's window i is wins[shape.o + i],
-- with increment inc, limit lim (false for none, true for one that every
-- rate exceeds; fast a hair under it, for the fast way) and greatest
-- weight max. Records, whose constructors size them, cost Redis less
-- than a table per field, which grows as it is filled.
local p = 3 + ne
local shapes, wins = {}, {}
local k = 0
for s = 1, ns do
	local nw, rinc, rtol = hd(5 + 3 * s), nil, nil
	if hd(6 + 3 * s) == 1 then
		rinc, rtol = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
		p = p + 2
	end
	shapes[s] = {undo = hd(4 + 3 * s) == 1, nw = nw, o = k, rinc = rinc, rtol = rtol}
	for i = 1, nw do
		k = k + 1
		local l, lf = ARGV[p + 1], nil
		if l == '' then
			l = false
		elseif l == '-' then
			l = true
		else
			l = tonumber(l)
			lf = l - 1e-12 * math.abs(l)
		end
		wins[k] = {inc = tonumber(ARGV[p]), lim = l, fast = lf, max = tonumber(ARGV[p + 2])}
		p = p + 3
	end
end
local fast = apply and hd(6) == 1
local cs, fs, hs, ws, ss = ARGV[p], ARGV[p + 1], ARGV[p + 2], ARGV[p + 3], ARGV[p + 4]
-- val[j] is counter j's running count; held[j] whether a current one
-- exists; tat[r] is TAT r's running value (0 for none). read makes held
-- and tat when it first reads: a batch that reads nothing needs neither.
local val, held, tat = sized(nread + #ss / 6), nil, nil
local reply = sized(1 + nread + (nr > 0 and 1 + nr or 0))
reply[1] = apply and 1 or 0
-- read reads counters from to to (and TATs past nread) with MGET.
local function read(from, to)
	if not held then
		held, tat = sized(nread), sized(nr)
	end
	for i = m + from, m + to, 1000 do
		local last = math.min(m + to, i + 999)
		local got = rcall('MGET', unpack(KEYS, i, last))
		for x = i, last do
			local v, j = got[x - i + 1], x - m
			local n = 0
			if v then
				n = tonumber(v)
			end
			if not n then
				return redis.error_reply('a counter holds ' .. v .. ', not a number')
			end
			if j > nread then
				tat[j - nread] = n
			else
				held[j], val[j] = v ~= false, n
				reply[j + 1] = v or '0' -- as stored: the caller reads the same double
			end
		end
	end
end
-- The previous counts to read and the TATs now; the current counts when
-- the hits are decided one by one (the fast way reads them as it writes).
local failed = c1 < #KEYS - m and read(c1 + 1, #KEYS - m)
if failed then
	return failed
end
local h = nread + 1
local now = 0
if nr > 0 then
	now = serverNow()
	h = h + 1
	reply[h] = now
	for r = 1, nr do
		h = h + 1
		reply[h] = tat[r]
	end
end
-- The counts sent, six bytes each, cost Redis less than an argument and a
-- tonumber each: a whole number, big-endian, or 255 for one in decimal,
-- in the next of the arguments that follow.
local x = p + 5
for q = 1, #ss, 6 do
	local a, b, c, d, e, g = byte(ss, q, q + 5)
	local v
	if a == $maxPackedCountByte then
		v, x = tonumber(ARGV[x]), x + 1
	else
		v = ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + g
	end
	val[nread + (q + 5) / 6] = v
end
-- The fast way: each current counter gets the increments of all the hits
-- of its form (INCRBY, which keeps its expiry and replies its count; no
-- counter is in two forms' windows then), and each window must stay
-- under its limit at that count. A count that is not an integer, or a
-- window over its limit, takes the increments back, and the hits are
-- decided one by one. delta[j] is the sum of counter j's increments.
local delta = sized(c1)
-- istr[inc] is increment inc as INCRBY's argument, formatted once: a
-- number argument costs Redis a "%.17g" formatting on every call, more
-- than the INCRBY itself, and a batch's increments are mostly one number.
-- One past 2^53 stays a number (INCRBY then refuses what it is sent).
local istr = {}
if fast then
	local q = 1
	while fast and q <= #fs do
		local a, b, c, d, e, g = byte(fs, q, q + 5)
		local s, n = a * 256 + b, e * 256 + g
		q = q + 6
		local shape = shapes[s]
		for i = shape.o + 1, shape.o + shape.nw do
			local win = wins[i]
			a, b, c, d = byte(fs, q, q + 3)
			q = q + 4
			local cur, prev, inc, l = a * 256 + b, c * 256 + d, n * win.inc, win.lim
			local is = istr[inc]
			if not is then
				is = inc < $maxExact and string.format('%d', inc) or inc
				istr[inc] = is
			end
			local v = rpcall('INCRBY', KEYS[m + cur], is)
			if type(v) ~= 'number' then
				fast = false
				break
			end
			delta[cur], reply[cur + 1] = inc, v - inc
			if v == inc then -- a new counter (or one at 0): its expiry
				local x, y = byte(cs, 2 * cur - 1, 2 * cur)
				rcall('PEXPIREAT', KEYS[m + cur], ARGV[2 + x * 256 + y])
			end
			if l and v + val[prev] * win.max > win.fast then
				fast = false
				break
			end
		end
	end
	if not fast then
		for j, d in pairs(delta) do
			rcall('INCRBY', KEYS[m + j], -d)
		end
		delta = {}
	end
end
-- saved* hold what a hit found, to restore when it is undone; moved[r]
-- says TAT r moved. The fast way needs none of them.
local savedc, savedv, savedd, moved
if not fast then
	savedc, savedv, savedd, moved = {}, {}, {}, {}
	failed = c1 > 0 and read(1, c1)
	if failed then
		return failed
	end
	-- The forms' windows, one after the other: form f's window i is
	-- window fo[f] + i, with counters wc and wp. fshape[f] is the form's
	-- shape and fr[f] its TAT's index.
	local fshape, fr, fo, wc, wp = {}, {}, {}, {}, {}
	local f, w, q = 0, 0, 1
	while q <= #fs do
		local a, b, c, d = byte(fs, q, q + 3)
		f = f + 1
		local s = a * 256 + b
		fshape[f], fr[f], fo[f] = shapes[s], c * 256 + d, w
		q = q + 6
		for i = 1, shapes[s].nw do
			a, b, c, d = byte(fs, q, q + 3)
			w = w + 1
			wc[w], wp[w] = a * 256 + b, c * 256 + d
			q = q + 4
		end
	end
	local nextw = string.gmatch(ws, '[^ ]+')
	for q = 1, #hs, 2 do
		local a, b = byte(hs, q, q + 1)
		local x = a * 256 + b
		local shape = fshape[x]
		local nw, o, so, undo, rej, nsv = shape.nw, fo[x], shape.o, shape.undo, 0, 0
		local ri, admit, due = fr[x], true, 0
		if ri > 0 then
			due = arrival(tat[ri], now, shape.rinc)
			admit = due - now <= shape.rtol
		end
		for i = 1, nw do
			local weight = nextw()
			if admit then
				local win = wins[so + i]
				local ci, d = wc[o + i], win.inc
				if apply and rej == 0 and d ~= 0 then
					if undo then
						nsv = nsv + 1
						savedc[nsv], savedv[nsv], savedd[nsv] = ci, val[ci], delta[ci] or 0
					end
					val[ci] = val[ci] + d
					delta[ci] = (delta[ci] or 0) + d
				end
				local l = win.lim
				if rej == 0 and l and (l == true or val[ci] + val[wp[o + i]] * tonumber(weight) > l) then
					rej = i
				end
			end
		end
		if undo and rej > 0 and nsv > 0 then
			for y = nsv, 1, -1 do
				val[savedc[y]], delta[savedc[y]] = savedv[y], savedd[y]
			end
		end
		if ri > 0 and admit and apply and rej == 0 then
			tat[ri], moved[ri] = due, true
		end
		h = h + 1
		reply[h] = rej - 1
	end
end
local function whole(v)
	return v ~= 0 and v % 1 == 0 and v < $maxExact and v > -$maxExact
end
for j = 1, fast and 0 or c1 do -- the fast way wrote them
	local d = delta[j]
	if d and d ~= 0 then
		local key, v = KEYS[m + j], nil
		if held[j] and whole(d) and whole(val[j]) then
			rcall('SET', key, string.format('%d', val[j]), 'KEEPTTL')
		else
			if whole(d) then
				v = string.format('%d', d)
			else
				v = string.format('%.17g', d)
			end
			local a, b = byte(cs, 2 * j - 1, 2 * j)
			if held[j] or not rcall('SET', key, v, 'PXAT', ARGV[2 + a * 256 + b], 'NX') then
				rcall('INCRBYFLOAT', key, v)
			end
		end
	end
end
for r = 1, fast and 0 or nr do -- the fast way moves no TAT
	if moved[r] then
		storeTAT(KEYS[m + nread + r], tat[r], now)
	end
end
return reply
`)

// HitBatch applies several synchronous hits of a namespace, in order, each
// deciding as Hit would if they were sent one after the other (see
// strategy.BatchHitter for the contract): one script run for the whole
// batch on a standalone server or a Sentinel-managed primary, and one per
// Cluster slot its keys fall in, pipelined (go-redis sends one pipeline
// per node, in parallel). A script reads each counter once and writes it
// once, however many hits of the batch share it: a batch of n hits of one
// key with two windows far from their limits costs Redis four commands
// (the EVALSHA, the marker's SET NX and an INCRBY per counter), one near
// them seven (an MGET and a write per counter, after an INCRBY taken
// back), whatever n. A single Hit is a batch of one.
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
// The hits with a slot (see strategy.SlotBatcher) take them in runs of
// the script of AcquireSlot, one for all of them (one per Cluster slot
// they fall in), in the same pipeline, after the hits' runs: the slots of
// a key are taken in the batch's order.
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
	// One run per slot of the counted hits, then one per slot of the
	// slots', each in the order of their first hits.
	counted, slots := strategy.SplitSlots(hits, good)
	nowMs, nsp := s.now().UnixMilli(), nsPart(namespace)
	var (
		runs     []*batchRun
		slotRuns []*slotRun
		scripts  = make([]scriptRun, 0, 1)
	)
	s.eachSlot(namespace, hits, counted, func(group []int) {
		r := newBatchRun(len(group))
		for _, i := range group {
			r.add(s.layout, i, bucketOf(namespace, hits[i].Key), nsp, &hits[i])
		}
		cmd, err := r.command(s, id, nowMs)
		if err != nil {
			errs.FailBatch(results, namespace, r.hits, err)
			return
		}
		runs = append(runs, r)
		scripts = append(scripts, scriptRun{script: batchScript, cmd: cmd})
	})
	s.eachSlot(namespace, hits, slots, func(group []int) {
		r := new(slotRun)
		for _, i := range group {
			r.add(s.layout, i, bucketOf(namespace, hits[i].Key), nsp, hits[i].Key, *hits[i].Slot)
		}
		slotRuns = append(slotRuns, r)
		scripts = append(scripts, r.script())
	})
	if len(scripts) == 0 {
		return
	}
	cmds := s.runScripts(ctx, scripts, sendOnce)
	fail := func(i int, err error) {
		errs.FailBatch(results, namespace, []int{i}, s.partial(err, bucketOf(namespace, hits[i].Key)))
	}
	for n, r := range runs {
		reply, err := cmds[n].Slice()
		if err == nil {
			err = r.answer(s, results, reply, nowMs)
		}
		for _, i := range r.hits {
			if err != nil {
				fail(i, notSent(err))
			}
		}
		r.free()
	}
	for n, r := range slotRuns {
		replies, err := r.replies(cmds[len(runs)+n])
		for x, i := range r.hits {
			if err != nil {
				fail(i, err)
			} else {
				results[i].Slot = replies[x]
			}
		}
	}
}

// eachSlot calls do with the indexes of the hits of each Cluster slot
// that the given hits' keys fall in (with all of them on a standalone
// server), in the order of their first hits.
func (s *Store) eachSlot(namespace string, hits []strategy.HitRequest, indexes []int, do func(group []int)) {
	switch {
	case len(indexes) == 0:
		return
	case !s.cluster:
		do(indexes)
		return
	}
	var groups [][]int
	groupOf := make(map[int]int)
	for _, i := range indexes {
		slot := s.slotOf(bucketOf(namespace, hits[i].Key))
		g, ok := groupOf[slot]
		if !ok {
			g = len(groups)
			groupOf[slot] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	for _, g := range groups {
		do(g)
	}
}

// batchRun is one script run of a HitBatch: hits of one slot, or of any
// slots on a standalone server.
type batchRun struct {
	hits    []int       // indexes of the run's hits in the batch, in order
	formOf  []int       // the index of each hit's form, in the run's order
	windows map[int]int // bucket: the number of windows of the run's hits in it
	// The client keys of the hits, each once, and by key their indexes.
	clients  []runClient
	byClient map[string]int
	// The counters, each once: what the run knows of each, and their
	// keys, written one after the other in keyBytes as they are added,
	// and made strings at once (see names).
	counters []batchCounter
	keyBytes []byte
	keys     []string
	// The windows' parts of the counters' keys (see appendWindowPart),
	// each formatted once in winBytes: a run's counters have a few
	// windows between them.
	winParts []windowPart
	winBytes []byte
	// The TATs of the hits' rates, each once, and by key their indexes.
	tats     []string
	tatIndex map[string]int
	// The forms of the hits: a form is a key's windows as one hit sends
	// them, which its next hits mostly share.
	forms []batchForm
	// formWindows holds the forms' windows, each form's a part of it:
	// one allocation for a run's forms instead of one each.
	formWindows []formWindow
	// fast says that the script may admit every hit at once when their
	// counts stay under their limits (see batchScript): no hit has a
	// rate, an increment that is not a whole number above 0, or a limit
	// of -Inf.
	fast    bool
	weights []byte // the hits' weights, formatted, each followed by a space
	lastExp int64  // the latest expiry of a current counter
	// Scratch space of command, kept from batch to batch with the run.
	ints  []int
	arena []byte
	exps  []int64
}

// runClient is what a run knows of one client key: its latest form, and
// its counters, a chain through batchCounter.nextOfClient that starts at
// counters (-1 for none). A key's counters are few (two per window size),
// and only its own forms look for them.
type runClient struct {
	form     int
	counters int
}

// windowPart is the part of the counters' keys of one window (see
// appendWindowPart), held in the run's winBytes at at:end.
type windowPart struct {
	sizeMs, startMs int64
	at, end         int
}

// batchForm is the form of a run's hits of one key with the same windows
// (but for their weights), and whether they undo when rejected.
type batchForm struct {
	undo    bool
	windows []formWindow
	hits    int // the run's hits of the form
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
	// maxWeight is the greatest weight the form's hits give the
	// previous count.
	maxWeight float64
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

// sameShape reports whether forms f and g send the script the same
// shape: all but their counters, TATs and hits.
func sameShape(f, g *batchForm) bool {
	if f.undo != g.undo || len(f.windows) != len(g.windows) || (f.rate != 0) != (g.rate != 0) ||
		f.rate != 0 && (f.inc != g.inc || f.tol != g.tol) {
		return false
	}
	for w := range f.windows {
		fw, gw := &f.windows[w], &g.windows[w]
		if fw.value != gw.value || fw.max != gw.max {
			return false
		}
	}
	return true
}

// batchCounter is what a batchRun knows of one of its counters.
type batchCounter struct {
	bucket int
	// keyAt and keyEnd delimit its key in the run's keyBytes.
	keyAt, keyEnd int
	// Its window's size and start, in milliseconds, and the next counter
	// of its client key in the run (-1 for none): see runClient.
	sizeMs, windowMs int64
	nextOfClient     int
	expMs            int64 // its expiry, if it is a current counter
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
	// (prevCache), as Redis held it and as a number, and sentAt when it
	// was read; "" when it is read.
	sent    string
	sentVal float64
	sentAt  int64
	// script is the counter's number in the script (see batchScript).
	script int
}

// batchRuns recycles runs: their slices and maps are most of what a batch
// allocates, and a busy node sends thousands a second.
var batchRuns = sync.Pool{New: func() any { return new(batchRun) }}

// maxPooledCounters bounds the runs that batchRuns keeps: one that grew
// for a huge batch is left to the garbage collector.
const maxPooledCounters = 1024

// newBatchRun returns an empty run, with room for n hits of two windows
// if it is new.
func newBatchRun(n int) *batchRun {
	r := batchRuns.Get().(*batchRun)
	if r.byClient == nil {
		*r = batchRun{
			windows: make(map[int]int), byClient: make(map[string]int, n), clients: make([]runClient, 0, n),
			keys: make([]string, 0, 4*n), counters: make([]batchCounter, 0, 4*n), forms: make([]batchForm, 0, n),
			hits: make([]int, 0, n), formOf: make([]int, 0, n), weights: make([]byte, 0, 24*n),
			formWindows: make([]formWindow, 0, 2*n),
		}
	}
	r.fast = true
	return r
}

// free empties r and gives it back to batchRuns. Nothing may use r or
// its command afterwards.
func (r *batchRun) free() {
	if cap(r.counters) > maxPooledCounters {
		return
	}
	clear(r.windows)
	clear(r.byClient)
	clear(r.tatIndex)
	clear(r.keys) // let go of what the slices point to
	clear(r.counters)
	clear(r.tats)
	clear(r.forms)
	clear(r.formWindows)
	*r = batchRun{
		windows: r.windows, byClient: r.byClient, clients: r.clients[:0], tatIndex: r.tatIndex,
		hits: r.hits[:0], formOf: r.formOf[:0], keys: r.keys[:0], counters: r.counters[:0],
		tats: r.tats[:0], forms: r.forms[:0], weights: r.weights[:0], keyBytes: r.keyBytes[:0],
		formWindows: r.formWindows[:0], winParts: r.winParts[:0], winBytes: r.winBytes[:0],
		ints: r.ints[:0], arena: r.arena[:0], exps: r.exps[:0],
	}
	batchRuns.Put(r)
}

// counter returns the index of the counter of a window of client x, of
// bucket k, adding it if new.
func (r *batchRun) counter(l *layout, k, x int, sizeMs, startMs int64, nsp, key string) int {
	client := &r.clients[x]
	for j := client.counters; j >= 0; j = r.counters[j].nextOfClient {
		if c := &r.counters[j]; c.sizeMs == sizeMs && c.windowMs == startMs {
			return j
		}
	}
	j := len(r.counters)
	at := len(r.keyBytes)
	r.keyBytes = l.appendCounterKeyOf(r.keyBytes, k, r.windowPart(sizeMs, startMs), nsp, key)
	r.counters = append(r.counters, batchCounter{
		bucket: k, startMs: startMs + sizeMs, keyAt: at, keyEnd: len(r.keyBytes),
		sizeMs: sizeMs, windowMs: startMs, nextOfClient: client.counters,
	})
	client.counters = j
	return j
}

// windowPart returns the part of the keys of a window's counters (see
// appendWindowPart), formatted once per run.
func (r *batchRun) windowPart(sizeMs, startMs int64) []byte {
	for _, w := range r.winParts {
		if w.sizeMs == sizeMs && w.startMs == startMs {
			return r.winBytes[w.at:w.end]
		}
	}
	at := len(r.winBytes)
	r.winBytes = appendWindowPart(r.winBytes, sizeMs, startMs)
	r.winParts = append(r.winParts, windowPart{sizeMs, startMs, at, len(r.winBytes)})
	return r.winBytes[at:]
}

// names fills r.keys, the counters' keys in order, from keyBytes: one
// string for all of them, where a string each would cost a batch an
// allocation per counter.
func (r *batchRun) names() {
	all := string(r.keyBytes)
	for j := range r.counters {
		r.keys = append(r.keys, all[r.counters[j].keyAt:r.counters[j].keyEnd])
	}
}

// add adds hit i, of bucket k, to the run.
func (r *batchRun) add(l *layout, i, k int, nsp string, h *strategy.HitRequest) {
	r.windows[k] += len(h.Windows)
	if h.Rate != nil {
		r.windows[k]++ // a retry's RateDiff counts as a window (see HitBatch)
	}
	f := r.form(l, k, nsp, h)
	form := &r.forms[f]
	form.hits++
	r.formOf = append(r.formOf, f)
	for w := range h.Windows {
		weight := h.Windows[w].Weight
		form.windows[w].maxWeight = max(form.windows[w].maxWeight, weight)
		p := &r.counters[form.windows[w].prev]
		p.weighted = p.weighted || weight != 0
		p.lastHit, p.lastWin = len(r.hits), w
		r.weights = appendScriptValue(r.weights, weight)
		r.weights = append(r.weights, ' ')
	}
	r.hits = append(r.hits, i)
}

// form returns the index of the form of h, of bucket k: its key's latest
// form if h matches it, or a new one.
func (r *batchRun) form(l *layout, k int, nsp string, h *strategy.HitRequest) int {
	x, ok := r.byClient[h.Key]
	if ok && r.forms[r.clients[x].form].matches(h) {
		return r.clients[x].form
	}
	if !ok {
		x = len(r.clients)
		r.clients = append(r.clients, runClient{counters: -1})
		r.byClient[h.Key] = x
	}
	// A form's windows are a part of formWindows that it alone uses: a
	// later form that outgrows the array moves on to a new one, and the
	// earlier forms keep theirs.
	at := len(r.formWindows)
	r.formWindows = slices.Grow(r.formWindows, len(h.Windows))[:at+len(h.Windows)]
	form := batchForm{undo: h.Undo, windows: r.formWindows[at : at+len(h.Windows) : at+len(h.Windows)]}
	if rate := h.Rate; rate != nil {
		r.fast = false
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
	}
	for w := range h.Windows {
		win := &h.Windows[w]
		sizeMs, startMs := int64(win.Size/time.Millisecond), win.Start/int64(time.Millisecond)
		cur := r.counter(l, k, x, sizeMs, startMs, nsp, h.Key)
		prev := r.counter(l, k, x, sizeMs, startMs-sizeMs, nsp, h.Key)
		c := &r.counters[cur]
		c.current, c.expMs = true, expireAtMs(sizeMs, startMs)
		r.lastExp = max(r.lastExp, c.expMs)
		form.windows[w] = formWindow{size: win.Size, start: win.Start, value: win.Value, max: win.Max, cur: cur, prev: prev}
		if win.Value <= 0 || win.Value != math.Trunc(win.Value) || math.IsInf(win.Max, -1) {
			r.fast = false
		}
	}
	f := len(r.forms)
	r.forms = append(r.forms, form)
	r.clients[x].form = f
	return f
}

// appendScriptValue appends an increment or a weight as the scripts read
// it: "0" for zero (and never "-0").
func appendScriptValue(b []byte, v float64) []byte {
	if v == 0 {
		return append(b, '0')
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
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

// maxPacked is the greatest number a 16-bit field of the script's packed
// arguments holds: a run with more hits (hence forms), counters or TATs
// than that cannot be sent (a batch holds a few hundred hits).
const maxPacked = 1<<16 - 1

// command returns the run's command (see scriptRun and batchScript),
// sending the previous counts that the store remembers and may use (see
// prevCache).
func (r *batchRun) command(s *Store, id string, nowMs int64) ([]any, error) {
	if len(r.hits) > maxPacked || len(r.counters) > maxPacked || len(r.tats) > maxPacked {
		return nil, fmt.Errorf("%w: a batch of %d hits, %d counters and %d rates is too large for one script run",
			strategy.ErrRejected, len(r.hits), len(r.counters), len(r.tats))
	}
	markers := r.markers(s, id)
	r.names()
	c1, nread := r.number(s, nowMs)
	// Scratch space that the run keeps from batch to batch: its numbers
	// (byScript, uses) in ints, the packed arguments in arena.
	n := len(r.counters)
	r.ints = slices.Grow(r.ints[:0], n+1+c1+1)[:n+1+c1+1]
	byScript, uses := r.ints[:n+1], r.ints[n+1:]
	for j := range r.counters {
		byScript[r.counters[j].script] = j
	}
	// The keys, then the header, packed once its numbers are known, and
	// the markers' time to live; sized for a batch of one shape with a
	// rate and two expiries.
	nkeys := len(markers) + nread + len(r.tats)
	cmd := make([]any, 3, 3+nkeys+2+2+2+3*len(r.forms[0].windows)+5)
	cmd[2] = nkeys
	for _, m := range markers {
		cmd = append(cmd, m)
	}
	for x := 1; x <= nread; x++ {
		cmd = appendKey(cmd, &r.keys[byScript[x]])
	}
	for t := range r.tats {
		cmd = appendKey(cmd, &r.tats[t])
	}
	head := len(cmd)
	cmd = append(cmd, nil, hitMarkerTTL(r.lastExp, nowMs))

	p := packer{b: r.arena[:0]}
	counters := r.packExpiries(&p, byScript[1:c1+1])
	for e := range r.exps {
		cmd = append(cmd, &r.exps[e]) // a pointer, as appendKey's: without an allocation
	}
	shapes := r.packForms(&p)
	packedForms := p.cut()
	for _, f := range r.formOf {
		p.b = appendUint16s(p.b, f+1)
	}
	packedHits := p.cut()
	p.b = appendUint16s(p.b, len(markers), len(r.tats), c1, len(r.exps), len(shapes), oneIf(r.fast && r.onceEach(uses)))
	for _, f := range shapes {
		form := &r.forms[f]
		p.b = appendUint16s(p.b, oneIf(form.undo), len(form.windows), oneIf(form.rate > 0))
	}
	cmd[head] = p.cut()
	for _, f := range shapes { // the shapes' increments and weights, formatted
		form := &r.forms[f]
		if form.rate > 0 {
			cmd = append(cmd, form.inc, form.tol)
		}
		for w := range form.windows {
			p.b = appendScriptValue(p.b, form.windows[w].value)
			inc := p.cut()
			p.b = appendScriptValue(p.b, form.windows[w].maxWeight)
			cmd = append(cmd, inc, scriptLimit(form.windows[w].max), p.cut())
		}
	}
	cmd = append(cmd, counters, packedForms, packedHits, r.weights)
	for x := nread + 1; x <= n; x++ {
		p.b = appendCount(p.b, r.counters[byScript[x]].sentVal)
	}
	cmd = append(cmd, p.cut())
	for x := nread + 1; x <= n; x++ {
		if c := &r.counters[byScript[x]]; !packableCount(c.sentVal) {
			cmd = append(cmd, c.sent)
		}
	}
	r.arena = p.b // grown, for the next batch
	return cmd, nil
}

// packExpiries sets r.exps to the expiries of the current counters,
// given in the script's order, each once, and packs each counter's
// expiry's number.
func (r *batchRun) packExpiries(p *packer, current []int) []byte {
	r.exps = r.exps[:0]
	for _, j := range current {
		e := slices.Index(r.exps, r.counters[j].expMs)
		if e < 0 {
			e = len(r.exps)
			r.exps = append(r.exps, r.counters[j].expMs)
		}
		p.b = appendUint16s(p.b, e+1)
	}
	return p.cut()
}

// packer appends a command's packed arguments one after the other to one
// buffer, each cut off so that the next cannot write into it. The
// command refers to the buffer, which may move as it grows: what it
// referred to stays as it was.
type packer struct {
	b  []byte
	at int // where the argument being packed starts
}

// cut returns the argument packed since the last cut.
func (p *packer) cut() []byte {
	arg := p.b[p.at:len(p.b):len(p.b)]
	p.at = len(p.b)
	return arg
}

// markers returns the run's dedupe markers, those of the groups of the
// batch ID (see HitBatch): on a Cluster, of each bucket of its hits; on a
// standalone server, the batch's own groups, whatever their buckets.
func (r *batchRun) markers(s *Store, id string) []string {
	var markers []string
	add := func(k, windows int) {
		for n := range (windows + maxScriptKeys - 1) / maxScriptKeys {
			markers = append(markers, s.dedupeKey(k, n, id))
		}
	}
	switch {
	case id == "":
	case s.cluster:
		for _, k := range slices.Sorted(maps.Keys(r.windows)) {
			add(k, r.windows[k])
		}
	default:
		w := 0
		for _, n := range r.windows {
			w += n
		}
		add(0, w)
	}
	return markers
}

// number numbers the counters as the script does (batchCounter.script):
// the c1 current ones, then the previous ones to read, then those whose
// counts are sent, from the store's memory of previous counts. It
// returns c1 and the number of counters read.
func (r *batchRun) number(s *Store, nowMs int64) (c1, nread int) {
	sent := 0
	for j := range r.counters {
		c := &r.counters[j]
		switch {
		case c.current:
			c1++
		case s.prevs != nil && !settling(c.startMs, nowMs, boolWeight(c.weighted)):
			if e, ok := s.prevs.get(c.bucket, r.keys[j]); ok && e.usablePrev(c.startMs, nowMs, boolWeight(c.weighted)) {
				if v, err := strconv.ParseFloat(e.prev, 64); err == nil { // else read it
					c.sent, c.sentVal, c.sentAt = e.prev, v, e.readAt
					sent++
				}
			}
		}
	}
	nread = len(r.counters) - sent
	next := [3]int{1, c1 + 1, nread + 1} // current, to read, sent
	for j := range r.counters {
		c := &r.counters[j]
		kind := 1
		if c.current {
			kind = 0
		} else if c.sent != "" {
			kind = 2
		}
		c.script = next[kind]
		next[kind]++
	}
	return c1, nread
}

// onceEach reports whether each current counter is in one window of one
// form, as the fast way needs (see batchScript); uses has room for a
// count per current counter.
func (r *batchRun) onceEach(uses []int) bool {
	clear(uses)
	for f := range r.forms {
		for _, fw := range r.forms[f].windows {
			for _, j := range [2]int{fw.cur, fw.prev} {
				if c := &r.counters[j]; c.current {
					uses[c.script]++
					if uses[c.script] > 1 {
						return false
					}
				}
			}
		}
	}
	return true
}

// packForms packs the forms, each with its shape's number, and returns
// the shapes, each by its first form, whose windows' maxWeight it makes
// the greatest of the shape's forms'.
func (r *batchRun) packForms(p *packer) (shapes []int) {
	for f := range r.forms {
		form := &r.forms[f]
		shape := slices.IndexFunc(shapes, func(g int) bool { return sameShape(form, &r.forms[g]) })
		if shape < 0 {
			shape = len(shapes)
			shapes = append(shapes, f)
		}
		first := r.forms[shapes[shape]].windows
		for w := range first {
			first[w].maxWeight = max(first[w].maxWeight, form.windows[w].maxWeight)
		}
		p.b = appendUint16s(p.b, shape+1, form.rate, form.hits)
		for w := range form.windows {
			fw := &form.windows[w]
			p.b = appendUint16s(p.b, r.counters[fw.cur].script, r.counters[fw.prev].script)
		}
	}
	return shapes
}

// appendKey appends key to cmd, a script's command whose keys start at
// cmd[3]: the first as a string, which runScripts and a Cluster's routing
// read to find its node, and the others as pointers (to a run's keys,
// which outlive its command), which an interface holds without
// allocating: a busy node sends dozens of keys a batch.
func appendKey(cmd []any, key *string) []any {
	if len(cmd) == 3 {
		return append(cmd, *key)
	}
	return append(cmd, key)
}

// maxPackedCount bounds the counts that the batch script's arguments pack
// in six bytes: a first byte of 255 stands for a count sent in decimal.
const maxPackedCount = 255 << 40

// packableCount reports whether v, a count sent to the batch script, packs
// in six bytes: a whole number from 0 (not -0) to below maxPackedCount.
func packableCount(v float64) bool {
	return v >= 0 && v < maxPackedCount && v == math.Trunc(v) && !math.Signbit(v)
}

// appendCount appends v to b as the batch script unpacks a count sent:
// six bytes, big-endian, or 255 and five zeros for one sent in decimal,
// in an argument of its own.
func appendCount(b []byte, v float64) []byte {
	if !packableCount(v) {
		return append(b, 255, 0, 0, 0, 0, 0)
	}
	n := uint64(v)
	return append(b, byte(n>>40), byte(n>>32), byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
}

// oneIf is 1 if b, else 0: a flag of the batch script's header.
func oneIf(b bool) int {
	if b {
		return 1
	}
	return 0
}

// appendUint16s appends each of vs to b as a 16-bit big-endian number,
// as the batch script unpacks them.
func appendUint16s(b []byte, vs ...int) []byte {
	for _, v := range vs {
		b = append(b, byte(v>>8), byte(v))
	}
	return b
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
// The reply holds the counts before the hits of the counters read and
// each hit's rejecting window (none when every hit was admitted at once):
// each hit's counts are computed here as the script computed them, in
// the same order and the same doubles: window by window, while no window
// has rejected the hit (the rejecting one included), the increment is
// added to the running count of the current counter, and the window's
// counts are the running counts of its two counters; a rejected hit with
// undo then restores the counts it found, and its windows up to the
// rejecting one report their current counts restored. Nothing is added
// when the hits did not apply.
func (r *batchRun) answer(s *Store, results []strategy.HitResult, reply []any, nowMs int64) error {
	val, tats := make([]float64, len(r.counters)), make([]int64, len(r.tats))
	now, rejections, err := r.readReply(reply, val, tats)
	if err != nil {
		return err
	}
	apply := reply[0] == int64(1)
	// The results are written as they are computed: on an error, the
	// caller fails every hit of the run, which replaces them.
	counts := make([]strategy.WindowCounts, 0, len(r.hits)*len(r.forms[0].windows))
	type saved struct {
		j int
		v float64
	}
	var found []saved
	for x, i := range r.hits {
		f := &r.forms[r.formOf[x]]
		rejected := int64(-1)
		if rejections != nil {
			var ok bool
			if rejected, ok = rejections[x].(int64); !ok || rejected < -1 || rejected >= int64(len(f.windows)) {
				return fmt.Errorf("hits[%d]: the script replied %v, not a window index", i, rejections[x])
			}
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
		results[i] = strategy.HitResult{Counts: c, Rejected: int(rejected)}
		if f.rate > 0 {
			if admit && apply && rejected < 0 {
				tats[f.rate-1] = due
			}
			results[i].Rate = strategy.RateReply{OK: admit, TAT: tats[f.rate-1] * 1e3, Now: now * 1e3}
		}
	}
	r.remember(s, results, reply, nowMs)
	return nil
}

// readReply reads the batch script's reply: into val each counter's
// count before the hits (read, in the reply, or sent), into tats the TATs
// before the hits, and it returns the server's clock, in microseconds,
// and each hit's rejecting window, nil when every hit was admitted at
// once. (The caller makes val and tats: they stay on its stack.)
func (r *batchRun) readReply(reply []any, val []float64, tats []int64) (now int64, rejections []any, err error) {
	nread := 0
	for j := range r.counters {
		c := &r.counters[j]
		if c.sent != "" {
			val[j] = c.sentVal
			continue
		}
		nread++
		if c.script >= len(reply) {
			return 0, nil, fmt.Errorf("the batch script replied %d values, too few for its counters", len(reply))
		}
		if val[j], err = replyCount(reply[c.script]); err != nil {
			return 0, nil, fmt.Errorf("%s: %w", r.keys[j], err)
		}
	}
	head := 1 + nread // the reply before the hits' rejecting windows
	if len(r.tats) > 0 {
		head += 1 + len(r.tats)
	}
	if len(reply) != head && len(reply) != head+len(r.hits) {
		return 0, nil, fmt.Errorf("the batch script replied %d values, not %d or %d", len(reply), head, head+len(r.hits))
	}
	if len(reply) > head {
		rejections = reply[head:]
	}
	if len(tats) > 0 {
		var ok bool
		if now, ok = reply[1+nread].(int64); !ok || now <= 0 {
			return 0, nil, fmt.Errorf("the batch script replied %v, not a time", reply[1+nread])
		}
		for x := range tats {
			if tats[x], ok = reply[2+nread+x].(int64); !ok {
				return 0, nil, fmt.Errorf("%s: the script replied %v, not a TAT", r.tats[x], reply[2+nread+x])
			}
		}
	}
	return now, rejections, nil
}

// remember has the store remember, for each window only read as a
// previous one, its count and the current count of the window after it.
func (r *batchRun) remember(s *Store, results []strategy.HitResult, reply []any, nowMs int64) {
	if s.prevs == nil {
		return
	}
	for j := range r.counters {
		c := &r.counters[j]
		if c.current {
			continue
		}
		counts := results[r.hits[c.lastHit]].Counts[c.lastWin]
		e := prevEntry{prev: c.sent, readAt: c.sentAt, prevCount: counts.Previous, cur: counts.Current}
		if c.sent == "" { // as the script replied it
			switch v := reply[c.script].(type) {
			case string:
				e.prev = v
			case int64:
				e.prev = strconv.FormatInt(v, 10)
			}
		}
		if e.readAt == 0 {
			e.readAt = nowMs
		}
		s.prevs.put(c.bucket, r.keys[j], e, nowMs)
	}
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
