package window

import (
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
)

// Entries live in fixed-size chunks so that growing a shard never copies the
// entries it already holds, and a full shard wastes at most one chunk.
const (
	chunkShift = 10
	chunkLen   = 1 << chunkShift
	chunkMask  = chunkLen - 1
)

// Entry flags.
const (
	flagUsed   uint8 = 1 << iota // the entry holds a key
	flagListed                   // the entry is in its shard's recent list
	flagDirty                    // some counter of the entry has a diff to push
	flagRef                      // touched since the CLOCK hand last passed
)

// cell is one window's count, split into what this node has not pushed yet
// (diff) and what the store last reported (synced). The visible count is
// their sum.
type cell struct{ diff, synced float64 }

func (c cell) total() float64 { return c.diff + c.synced }

// weighted is the cell's count with its diff taken m times.
func (c cell) weighted(m float64) float64 { return c.synced + m*c.diff }

// counts holds one window size of one key: the current window and the one
// before it. Older windows never matter to a rate, so they are forgotten.
type counts struct {
	size  int64 // window size in nanoseconds; 0 marks an unused slot
	index int64 // the current window is [index*size, (index+1)*size)
	cur   cell
	prev  cell
	// When this node last counted a hit in each window: see stamp.
	curAt, prevAt uint32
}

// noteLimit records in *l, a counts' limit (see limitOf), that a hit
// counted in it was checked against max: a store's feed of keys near their
// limits compares their counts with the smallest since the last Take (see
// Diff.Limit). Limits that are not finite and above 0 mark nothing.
func noteLimit(l *float32, max float64) {
	if max > 0 && max <= math.MaxFloat32 && (*l == 0 || float32(max) < *l) {
		*l = float32(max)
	}
}

// limitOf returns where entry e keeps the limit of its counts c (see
// noteLimit): the entry for its first window size, the extra for the
// others, where their structs' padding holds it at no cost in memory.
func (s *shard) limitOf(e *entry, c *counts) *float32 {
	if c == &e.first {
		return &e.firstLimit
	}
	for j := e.more; j != 0; {
		x := s.extraAt(j - 1)
		if c == &x.counts {
			return &x.limit
		}
		j = x.next
	}
	panic("window: counts not of their entry")
}

// advance makes window k the current one. Windows older than k-1 are
// dropped: their diffs could no longer change any rate, and the store
// expires them at about the same time.
func (c *counts) advance(k int64) {
	switch {
	case k <= c.index:
		return
	case k == c.index+1:
		c.prev, c.prevAt = c.cur, c.curAt
	default:
		c.prev, c.prevAt = cell{}, 0
	}
	c.cur, c.curAt = cell{}, 0
	c.index = k
}

// stampEnd is the stamp of a hit too far into its window for a stamp to
// tell: it counts as at the window's end.
const stampEnd = math.MaxUint32

// stamp returns the stamp of a hit r nanoseconds into its window: the
// milliseconds into it, rounded up, so that a stamp is never earlier than
// the hit; 0 means no hit. HitIfRoom reads them: a window's hits are all
// out of the last window length once its last one is.
func stamp(r int64) uint32 {
	return uint32(min(r/1e6+1, stampEnd))
}

// cellAt returns the cell of window k, advancing c to it when it is
// newer, or nil when c no longer holds it.
func (c *counts) cellAt(k int64) *cell {
	c.advance(k)
	switch k {
	case c.index:
		return &c.cur
	case c.index - 1:
		return &c.prev
	}
	return nil
}

// sample returns the counts' state at the instant at, of frame f, with this
// node's unsynced counts taken m times (see Namespace.SetUnsyncedWeight;
// 1 is the counts as they are). Counts ahead of it (a hit that read the
// clock later advanced them first) are those of the window after f's.
func (c *counts) sample(f frame, at int64, m float64) Sample {
	s := Sample{
		Current: c.cur.weighted(m),
		Weight:  f.w,
		Start:   f.start,
		Size:    timeDuration(c.size),
		At:      at,
	}
	if c.index <= f.k {
		s.Previous = c.prev.weighted(m)
	} else {
		s.Start = f.end
	}
	return s
}

// entry is one (namespace, key) held by a zone. The first window size lives
// inline because most limits use one; further sizes are extras of the
// shard, chained from more. An entry holds no pointer (its key's bytes are
// in the shard's arena), so neither do the chunks of entries, and the
// garbage collector never scans them.
type entry struct {
	first  counts
	hash   uint32
	keyAt  uint32 // where the key is in the shard's arena
	keyLen uint32
	more   int32 // 1 + the index of the first extra, or 0
	// firstLimit is first's limit (see limitOf).
	firstLimit float32
	ns         uint16
	flags      uint8
}

// extra is the counts of a further window size of an entry, in its
// shard's extras, chained by next (1 + an index, or 0 at the end).
type extra struct {
	counts
	next  int32
	limit float32 // see limitOf
}

// Extras live in chunks that never move, so a *counts stays valid while
// others are added.
const (
	extraShift = 7
	extraLen   = 1 << extraShift
	extraMask  = extraLen - 1
)

func (s *shard) extraAt(i int32) *extra { return &s.extras[i>>extraShift][i&extraMask] }

// newExtra returns a free extra holding the counts of size, and its
// index.
func (s *shard) newExtra(size int64) (int32, *extra) {
	i, ok := pop(&s.extraFree)
	if !ok {
		i = s.extraUsed
		s.extraUsed++
		if int(i>>extraShift) == len(s.extras) {
			s.extras = append(s.extras, make([]extra, extraLen))
		}
	}
	x := s.extraAt(i)
	*x = extra{counts: counts{size: size}}
	return i, x
}

// window returns the frame of now among the windows of a size, and entry
// e's counts of that size advanced to it: added when create is true, else
// nil when e has none. It spells frameAt out (see frame), being the hot
// path of every hit.
func (s *shard) window(e *entry, size, now int64, create bool) (*counts, frame) {
	f := fixedFrame(now, size)
	if size >= minCode {
		f = longFrame(now, size)
	}
	c := s.countsFor(e, size, create)
	if c != nil {
		c.advance(f.k)
	}
	return c, f
}

// read returns entry e's window of a size at now, with this node's
// unsynced counts taken m times, without adding it: zero when e has none.
func (s *shard) read(e *entry, size time.Duration, now int64, m float64) Sample {
	c, f := s.window(e, int64(size), now, false)
	if c == nil {
		return Sample{Weight: f.w, Start: f.start, Size: size, At: now}
	}
	return c.sample(f, now, m)
}

// count adds value to c's current window, of frame f, at now: to the
// store's part when synced (see IncrementSynced), else to the diff.
func (c *counts) count(f frame, now int64, value float64, synced bool) {
	if synced {
		c.cur.synced += value
	} else {
		c.cur.diff += value
	}
	if value > 0 {
		c.curAt = stamp(now - f.start)
	}
}

// countsFor returns the counts of entry e for a window size, adding them
// when create is true, or nil.
func (s *shard) countsFor(e *entry, size int64, create bool) *counts {
	if e.first.size == size {
		return &e.first
	}
	return s.moreCounts(e, size, create)
}

// moreCounts is countsFor past the entry's first counts.
func (s *shard) moreCounts(e *entry, size int64, create bool) *counts {
	var last *extra
	for j := e.more; j != 0; j = last.next {
		last = s.extraAt(j - 1)
		if last.size == size {
			return &last.counts
		}
	}
	if !create {
		return nil
	}
	if e.first.size == 0 {
		e.first = counts{size: size}
		return &e.first
	}
	i, x := s.newExtra(size)
	if last == nil {
		e.more = i + 1
	} else {
		last.next = i + 1
	}
	return &x.counts
}

// forEach calls f for every window size entry e holds, and not for the
// TATs of rates (see gcra.go), which have no windows to sync or read.
func (s *shard) forEach(e *entry, f func(c *counts)) {
	s.forEachCounts(e, func(c *counts) {
		if !c.isRate() {
			f(c)
		}
	})
}

// forEachCounts calls f for all the counts entry e holds: every window
// size and every rate's TAT.
func (s *shard) forEachCounts(e *entry, f func(c *counts)) {
	if e.first.size != 0 {
		f(&e.first)
	}
	for j := e.more; j != 0; {
		x := s.extraAt(j - 1)
		f(&x.counts)
		j = x.next
	}
}

// keyOf returns the key of entry e, sharing the arena's bytes: valid while
// the caller holds the shard's lock and e keeps its key.
func (s *shard) keyOf(e *entry) string { return s.keys.view(e.keyAt, e.keyLen) }

// orphan is a pending diff whose entry left the zone (evicted or swept)
// before it could be pushed.
type orphan struct {
	ns uint16
	Diff
}

// shard is one lock's worth of a zone: an open-addressing hash table of
// entry indices and the entries themselves, in chunks. Eviction follows the
// CLOCK algorithm, the usual approximation of least-recently-used: a hit
// only sets a bit on its own entry, and the hand that looks for a victim
// spares every entry whose bit is set once, clearing it.
type shard struct {
	mu      lockorder.Mutex[shardLock]
	retired bool   // replaced by a resize: look up the zone's shards again
	table   []slot // linear probing
	chunks  [][]entry
	used    int32   // indices handed out so far
	free    []int32 // indices given back by removals
	live    int     // entries holding a key
	hand    int32   // where the CLOCK hand looks next
	quota   int     // the zone's capacity over its shards: bounds side lists
	recent  [][]int32
	orphans []orphan
	keys    keyArena
	// The counts of entries' further window sizes: see extra.
	extras    [][]extra
	extraUsed int32
	extraFree []int32
	_         [64]byte // keeps neighbouring shards' locks off one cache line
}

// slot is one place in a shard's hash table: 0 when empty, or else the
// entry's hash in the high 32 bits and its index+1 in the low ones. With
// the hash in the table, a probe passes over other keys' slots without
// reading their entries, each likely a cache miss in a large zone: a key
// the shard lacks costs one look at the table, and moving slots (grow,
// unplace) reads no entry at all.
type slot uint64

func makeSlot(h uint32, i int32) slot { return slot(h)<<32 | slot(uint32(i+1)) }

func (sl slot) hash() uint32 { return uint32(sl >> 32) }

func (sl slot) index() int32 { return int32(uint32(sl)) - 1 }

func (s *shard) at(i int32) *entry { return &s.chunks[i>>chunkShift][i&chunkMask] }

// find returns the index of the entry for (ns, key), or -1.
func (s *shard) find(h uint32, ns uint16, key string) int32 {
	mask := uint32(len(s.table) - 1)
	for j := h & mask; ; j = (j + 1) & mask {
		sl := s.table[j]
		if sl == 0 {
			return -1
		}
		if sl.hash() != h {
			continue
		}
		i := sl.index()
		if e := s.at(i); e.ns == ns && e.keyLen == uint32(len(key)) && s.keyOf(e) == key {
			return i
		}
	}
}

// findOrInsert returns the index of the entry for (ns, key), marked as
// just used, inserting it when the shard lacks it.
func (s *shard) findOrInsert(z *Zone, h uint32, ns uint16, key string, now int64) int32 {
	if i := s.find(h, ns, key); i >= 0 {
		s.at(i).flags |= flagRef
		return i
	}
	return s.insert(z, h, ns, key, now)
}

// pop takes the last element off a free list, and reports false when it is
// empty.
func pop[T any](free *[]T) (v T, ok bool) {
	n := len(*free)
	if n == 0 {
		return v, false
	}
	v = (*free)[n-1]
	*free = (*free)[:n-1]
	return v, true
}

// alloc returns a free entry index.
func (s *shard) alloc() int32 {
	if i, ok := pop(&s.free); ok {
		return i
	}
	i := s.used
	s.used++
	k, off := int(i>>chunkShift), int(i&chunkMask)
	if k == len(s.chunks) {
		s.chunks = append(s.chunks, nil)
	}
	if off >= len(s.chunks[k]) {
		// Chunks start small and double, so small shards stay small.
		c := make([]entry, min(chunkLen, max(16, 2*len(s.chunks[k]))))
		copy(c, s.chunks[k])
		s.chunks[k] = c
	}
	return i
}

// insert adds a new entry and returns its index. When the zone is full it
// first evicts an entry, from this shard if it has one.
func (s *shard) insert(z *Zone, h uint32, ns uint16, key string, now int64) int32 {
	// Reserve room first, so the zone never holds more than its limit, even
	// for an instant.
	for {
		l := z.live.Load()
		if l < z.limit.Load() {
			if z.live.CompareAndSwap(l, l+1) {
				break
			}
			continue
		}
		if !s.evict(z, now) {
			z.evictElsewhere(s, now)
		}
	}
	i := s.alloc()
	e := s.at(i)
	// A new key starts unreferenced: a key seen once goes before keys seen
	// again, which keeps a flood of one-off keys from flushing busy ones.
	*e = entry{keyAt: s.keys.put(key), keyLen: uint32(len(key)), hash: h, ns: ns, flags: flagUsed}
	s.place(i)
	return i
}

// evict removes one entry picked by the CLOCK hand, and reports false when
// the shard holds none.
func (s *shard) evict(z *Zone, now int64) bool {
	if s.live == 0 {
		return false
	}
	for {
		if s.hand >= s.used {
			s.hand = 0
		}
		i := s.hand
		s.hand++
		e := s.at(i)
		switch {
		case e.flags&flagUsed == 0:
		case e.flags&flagRef != 0:
			e.flags &^= flagRef
		default:
			s.remove(z, i, now)
			z.evictions.Add(1)
			return true
		}
	}
}

// remove takes entry i out of the table and frees it. Its pending diffs
// become orphans, so they are still pushed.
func (s *shard) remove(z *Zone, i int32, now int64) {
	e := s.at(i)
	if e.flags&flagDirty != 0 {
		z.namespace(e.ns).dirty.Add(-1)
		key := cloneString(s.keyOf(e)) // the orphans outlive the entry
		s.forEach(e, func(c *counts) {
			limit := float64(*s.limitOf(e, c))
			s.orphan(z, e.ns, key, c.size, c.index, c.cur.diff, limit, now)
			s.orphan(z, e.ns, key, c.size, c.index-1, c.prev.diff, limit, now)
		})
	}
	s.unplace(i)
	s.live--
	z.live.Add(-1)
	for j := e.more; j != 0; {
		x := s.extraAt(j - 1)
		s.extraFree = append(s.extraFree, j-1)
		j = x.next
		*x = extra{}
	}
	s.keys.release(e.keyAt, e.keyLen)
	*e = entry{}
	s.free = append(s.free, i)
}

// orphan keeps a diff whose entry is gone, unless it is zero or its window
// has expired. The zone keeps at most twice its capacity of them, however
// unevenly they fall on its shards; past it the older half of this
// shard's are dropped (or the new one, if the shard holds none), and
// counted. From the capacity on, the namespace's Backlog is signalled,
// for its sync loop to take them before that.
func (s *shard) orphan(z *Zone, ns uint16, key string, size, k int64, v, limit float64, now int64) {
	if v == 0 || startOf(k+2, size) <= now {
		return
	}
	if z.orphaned.Load() >= 2*z.limit.Load() {
		drop := (len(s.orphans) + 1) / 2
		if drop == 0 {
			z.dropped.Add(1)
			return
		}
		z.dropped.Add(uint64(drop))
		for _, o := range s.orphans[:drop] {
			z.namespace(o.ns).orphanGone()
		}
		s.orphans = append(s.orphans[:0], s.orphans[drop:]...)
	}
	s.orphans = append(s.orphans, orphan{ns: ns, Diff: Diff{Key: key, Size: timeDuration(size), Start: startOf(k, size), Value: v, Limit: limit}})
	n := z.namespace(ns)
	n.orphans.Add(1)
	if z.orphaned.Add(1) >= z.limit.Load() {
		select {
		case n.backlog <- struct{}{}:
		default:
		}
	}
}

// list records that entry i was touched since the namespace's last Take.
// The list may hold stale indices of entries removed since; Take skips them
// by their flags, and compaction keeps the list within twice the quota.
func (s *shard) list(i int32, e *entry) {
	e.flags |= flagListed
	for int(e.ns) >= len(s.recent) {
		s.recent = append(s.recent, nil)
	}
	l := s.recent[e.ns]
	if len(l) >= 2*max(s.quota, s.live) { // compact it
		out := l[:0]
		for _, j := range l {
			if x := s.at(j); x.ns == e.ns && x.flags&flagListed != 0 {
				x.flags &^= flagListed // set again below, so duplicates go
				out = append(out, j)
			}
		}
		for _, j := range out {
			s.at(j).flags |= flagListed
		}
		l = out
	}
	s.recent[e.ns] = append(l, i)
}

// place puts entry i in the hash table, grown first to stay at most three
// quarters full, and counts it live.
func (s *shard) place(i int32) {
	if (s.live+1)*4 > len(s.table)*3 {
		s.grow()
	}
	s.placeSlot(makeSlot(s.at(i).hash, i))
	s.live++
}

func (s *shard) placeSlot(sl slot) {
	mask := uint32(len(s.table) - 1)
	j := sl.hash() & mask
	for s.table[j] != 0 {
		j = (j + 1) & mask
	}
	s.table[j] = sl
}

// unplace takes entry i out of the hash table, shifting later entries of
// its probe run back so that lookups never need tombstones.
func (s *shard) unplace(i int32) {
	mask := uint32(len(s.table) - 1)
	want := makeSlot(s.at(i).hash, i)
	j := want.hash() & mask
	for s.table[j] != want {
		j = (j + 1) & mask
	}
	for {
		k := j
		for {
			k = (k + 1) & mask
			if s.table[k] == 0 {
				s.table[j] = 0
				return
			}
			home := s.table[k].hash() & mask
			// The entry at k may move to j unless its home lies in (j, k].
			if (k > j && (home <= j || home > k)) || (k < j && home <= j && home > k) {
				s.table[j] = s.table[k]
				j = k
				break
			}
		}
	}
}

func (s *shard) grow() {
	old := s.table
	s.table = make([]slot, 2*len(old))
	for _, sl := range old {
		if sl != 0 {
			s.placeSlot(sl)
		}
	}
}

// forEachLive calls f for every entry holding a key. f may remove the entry.
func (s *shard) forEachLive(f func(i int32, e *entry)) {
	for i := int32(0); i < s.used; i++ {
		if e := s.at(i); e.flags&flagUsed != 0 {
			f(i, e)
		}
	}
}
