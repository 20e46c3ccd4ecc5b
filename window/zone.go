package window

import (
	"fmt"
	"hash/maphash"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
)

const (
	maxShards        = 64
	minShardCapacity = 16
)

// Zone holds the counters of one or more namespaces in memory, bounded by a
// maximum number of keys. Past it, keys are evicted in approximately least
// recently used order. It is safe for concurrent use.
//
// A zone is split into shards by key hash, each with its own lock, so that
// hits on different keys rarely wait for each other. The capacity is the
// zone's, not a shard's: a new key evicts from its own shard while the zone
// is full, so an uneven spread of keys never wastes room. Small zones have
// fewer shards, so that eviction stays close to least-recently-used, and a
// resize re-shards.
type Zone struct {
	shards    atomic.Pointer[[]*shard]
	resizeMu  sync.Mutex
	seed      maphash.Seed
	now       Clock
	live      atomic.Int64
	limit     atomic.Int64
	evictions atomic.Uint64
	dropped   atomic.Uint64
	orphaned  atomic.Int64 // diffs of keys that left the zone, in all namespaces

	mu         lockorder.Mutex[namesLock] // guards names
	names      map[string]*Namespace
	namespaces atomic.Pointer[[]*Namespace] // by ID, copied on write
}

// NewZone returns an empty zone that holds at most maxKeys keys, across all
// its namespaces. clock may be nil for the system clock.
func NewZone(maxKeys int, clock Clock) (*Zone, error) {
	if maxKeys <= 0 {
		return nil, fmt.Errorf("max_keys must be positive, got %d", maxKeys)
	}
	if clock == nil {
		clock = SystemClock
	}
	z := &Zone{seed: maphash.MakeSeed(), now: clock, names: make(map[string]*Namespace)}
	z.namespaces.Store(&[]*Namespace{})
	z.limit.Store(int64(maxKeys))
	shards := makeShards(maxKeys)
	z.shards.Store(&shards)
	return z, nil
}

// makeShards splits a capacity over as many shards as keep at least
// minShardCapacity keys each, up to maxShards.
func makeShards(capacity int) []*shard {
	n := 1
	for n < maxShards && capacity/(2*n) >= minShardCapacity {
		n *= 2
	}
	shards := make([]*shard, n)
	for i := range shards {
		shards[i] = &shard{quota: max(capacity/n, minShardCapacity), table: make([]slot, 16)}
	}
	return shards
}

// current returns the shards in use.
func (z *Zone) current() []*shard { return *z.shards.Load() }

func shardOf(shards []*shard, h uint64) *shard { return shards[int(h>>32)&(len(shards)-1)] }

// Capacity returns the maximum number of keys the zone holds.
func (z *Zone) Capacity() int { return int(z.limit.Load()) }

// Len returns the number of keys the zone holds now.
func (z *Zone) Len() int { return int(z.live.Load()) }

// Evictions returns how many keys were evicted to make room since the zone
// was created.
func (z *Zone) Evictions() uint64 { return z.evictions.Load() }

// Dropped returns how many pending diffs of evicted keys were dropped
// because more than twice the zone's capacity were waiting to be pushed
// (a store outage during a flood of new keys). Bounded memory wins over
// those diffs.
func (z *Zone) Dropped() uint64 { return z.dropped.Load() }

// Resize changes the zone's capacity, keeping every counter that fits;
// when it shrinks, keys are evicted until the zone fits. When the capacity
// calls for another number of shards, the keys move to new shards; hits
// meanwhile wait for the move, then use the new shards.
func (z *Zone) Resize(maxKeys int) error {
	if maxKeys <= 0 {
		return fmt.Errorf("max_keys must be positive, got %d", maxKeys)
	}
	z.resizeMu.Lock()
	defer z.resizeMu.Unlock()
	z.limit.Store(int64(maxKeys))
	if shards := makeShards(maxKeys); len(shards) != len(z.current()) {
		z.reshard(shards)
	}
	now := z.now()
	for z.live.Load() > int64(maxKeys) {
		evicted := false
		for s := range z.lockAll() {
			if z.live.Load() > int64(maxKeys) && s.evict(z, now) {
				evicted = true
			}
			s.mu.Unlock()
		}
		if !evicted {
			break
		}
	}
	return nil
}

// reshard moves every entry and orphan to the given empty shards, and
// retires the old ones: a caller that locks a retired shard looks again.
func (z *Zone) reshard(shards []*shard) {
	old := z.current()
	lockEvery(old)
	for _, s := range old {
		s.forEachLive(func(_ int32, e *entry) {
			key := s.keyOf(e)
			t := shardOf(shards, z.fullHash(e.ns, key))
			i := t.alloc()
			ne := t.at(i)
			*ne = *e
			ne.keyAt, ne.more = t.keys.put(key), 0
			ne.flags &^= flagListed
			s.forEachCounts(e, func(c *counts) {
				if c != &e.first {
					*t.countsFor(ne, c.size, true) = *c
				}
			})
			t.place(i)
			if e.flags&flagListed != 0 {
				t.list(i, ne)
			}
		})
		for _, o := range s.orphans {
			t := shardOf(shards, z.fullHash(o.ns, o.Key))
			t.orphans = append(t.orphans, o)
		}
		s.retired = true
	}
	z.shards.Store(&shards)
	for _, s := range old {
		s.mu.Unlock()
	}
}

// lockEvery locks all the shards, or waits and tries again: it never
// blocks while it holds some, so an insert that holds one shard and looks
// for a victim in another (evictElsewhere) cannot deadlock with it.
func lockEvery(shards []*shard) {
	for {
		held := 0
		for _, s := range shards {
			if !s.mu.TryLock() {
				break
			}
			held++
		}
		if held == len(shards) {
			return
		}
		for _, s := range shards[:held] {
			s.mu.Unlock()
		}
		runtime.Gosched()
	}
}

// evictElsewhere evicts one entry from some shard other than s, which the
// caller holds and which is empty. It only tries locks, so two shards doing
// this at once cannot deadlock.
func (z *Zone) evictElsewhere(s *shard, now int64) {
	for {
		shards := z.current()
		tried := 0
		for _, t := range shards {
			if t == s || !t.mu.TryLock() {
				continue
			}
			tried++
			ok := !t.retired && t.evict(z, now)
			t.mu.Unlock()
			if ok {
				return
			}
		}
		if tried == len(shards)-1 {
			return // every other shard is empty: nothing to evict
		}
		runtime.Gosched()
	}
}

// Namespace returns the handle of a namespace in this zone, creating it on
// first use. Handles are cheap to keep and the same name always gives the
// same handle.
func (z *Zone) Namespace(name string) (*Namespace, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if n, ok := z.names[name]; ok {
		return n, nil
	}
	all := *z.namespaces.Load()
	if len(all) > math.MaxUint16 {
		return nil, fmt.Errorf("zone holds too many namespaces (%d)", len(all))
	}
	n := &Namespace{zone: z, id: uint16(len(all)), name: name, backlog: make(chan struct{}, 1)}
	n.SetUnsyncedWeight(1)
	z.names[name] = n
	next := append(all[:len(all):len(all)], n)
	z.namespaces.Store(&next)
	return n, nil
}

func (z *Zone) namespace(id uint16) *Namespace { return (*z.namespaces.Load())[id] }

// fullHash hashes a (namespace, key) pair. The low 32 bits place the entry
// in its shard's table, the high bits choose the shard.
func (z *Zone) fullHash(ns uint16, key string) uint64 {
	return maphash.String(z.seed, key) ^ (uint64(ns)+1)*0x9e3779b97f4a7c15
}

// lock finds and locks the shard that owns hash h, looking again if a
// resize retired it meanwhile.
func (z *Zone) lock(h uint64) *shard {
	for {
		s := shardOf(z.current(), h)
		s.mu.Lock()
		if !s.retired {
			return s
		}
		s.mu.Unlock()
	}
}

// Namespace is a set of counters inside a zone, kept apart from every other
// namespace's. It is what a limit counts in and what one sync loop pushes.
type Namespace struct {
	zone    *Zone
	id      uint16
	name    string
	tracked atomic.Bool
	dirty   atomic.Int64 // keys with a diff
	orphans atomic.Int64 // diffs of keys that left the zone
	backlog chan struct{}
	// unsynced holds the bits of the weight of this node's unsynced
	// counts (see SetUnsyncedWeight).
	unsynced atomic.Uint64
}

// SetUnsyncedWeight has every decision of the namespace count this
// node's unsynced counts (its diffs, which no store has yet) m times, m
// at least 1, and a request's cost against a rate m times: the node then
// judges each key as if every one of m nodes had taken as many hits as it
// did since its last sync, which is how a fleet of m nodes stays within
// one limit while it cannot reach its store (on_store_failure share).
// 1 restores the counts as they are. What a sync takes and pushes is
// never weighted.
func (n *Namespace) SetUnsyncedWeight(m float64) {
	if !(m > 1) || math.IsInf(m, 1) {
		m = 1
	}
	n.unsynced.Store(math.Float64bits(m))
}

// unsyncedWeight returns the weight SetUnsyncedWeight set.
func (n *Namespace) unsyncedWeight() float64 { return math.Float64frombits(n.unsynced.Load()) }

// Backlog receives when the zone holds as many diffs of evicted keys as
// it holds keys: keys with diffs leave the zone faster than the namespace
// syncs. A sync loop that takes the namespace's diffs now keeps them from
// being dropped past twice the capacity.
func (n *Namespace) Backlog() <-chan struct{} { return n.backlog }

// Orphaned returns how many diffs of keys that left the zone wait for the
// namespace's next Take.
func (n *Namespace) Orphaned() int { return int(n.orphans.Load()) }

// orphanGone counts one diff of an evicted key less: taken, reset or
// dropped.
func (n *Namespace) orphanGone() {
	n.orphans.Add(-1)
	n.zone.orphaned.Add(-1)
}

// Name returns the namespace's name.
func (n *Namespace) Name() string { return n.name }

// Zone returns the zone that holds the namespace.
func (n *Namespace) Zone() *Zone { return n.zone }

// Now reads the zone's clock, in Unix nanoseconds: the time every window
// of the namespace is placed by, also the windows a store is asked for.
func (n *Namespace) Now() int64 { return n.zone.now() }

// Now reads the zone's clock, in Unix nanoseconds.
func (z *Zone) Now() int64 { return z.now() }

// Increment adds value (which may be fractional or negative) to key's
// current window of the given size and returns the window's state after it.
func (n *Namespace) Increment(key string, size time.Duration, value float64) Sample {
	return n.increment(key, size, value, false)
}

// IncrementSynced adds value to key's current window as if the store had
// already counted it: it shows in the counts but is never pushed. It is for
// a hit whose request to the store failed after it may have been applied.
func (n *Namespace) IncrementSynced(key string, size time.Duration, value float64) Sample {
	return n.increment(key, size, value, true)
}

// lockEntry locks the shard of key and returns it with the key's entry,
// added if the zone does not hold it, and the zone's clock. The caller
// unlocks s.mu.
func (n *Namespace) lockEntry(key string) (s *shard, i int32, now int64) {
	z := n.zone
	now = z.now()
	h := z.fullHash(n.id, key)
	s = z.lock(h)
	return s, s.findOrInsert(z, uint32(h), n.id, key, now), now
}

// lockKey locks the shard of key and returns it with the index of key's
// entry, or -1 when the zone does not hold it. The caller unlocks s.mu.
func (n *Namespace) lockKey(key string) (s *shard, i int32) {
	h := n.zone.fullHash(n.id, key)
	s = n.zone.lock(h)
	return s, s.find(uint32(h), n.id, key)
}

func (n *Namespace) increment(key string, size time.Duration, value float64, synced bool) Sample {
	s, i, now := n.lockEntry(key)
	e := s.at(i)
	c, f := s.window(e, int64(size), now, true)
	c.count(f, now, value, synced)
	n.mark(s, i, e, !synced)
	out := c.sample(f, now, n.unsyncedWeight())
	s.mu.Unlock()
	return out
}

// Read returns key's window state of the given size without changing it. A
// key the zone does not hold reads as zero.
func (n *Namespace) Read(key string, size time.Duration) Sample {
	return n.read(key, size, nil)
}

// ReadWithDiff is Read with the current window's unpushed diff replaced by
// diff: the count as it would be if this node had added diff since the
// last sync. It is Kong's sliding_window with cur_diff.
func (n *Namespace) ReadWithDiff(key string, size time.Duration, diff float64) Sample {
	return n.read(key, size, &diff)
}

func (n *Namespace) read(key string, size time.Duration, diff *float64) Sample {
	now := n.zone.now()
	s, i := n.lockKey(key)
	defer s.mu.Unlock()
	f := frameAt(now, int64(size))
	// A key or a size the zone does not hold reads as zero, but for diff.
	c, m := counts{size: int64(size), index: f.k}, 1.0
	if i >= 0 {
		e := s.at(i)
		e.flags |= flagRef
		n.mark(s, i, e, false)
		if held, _ := s.window(e, int64(size), now, false); held != nil {
			c, m = *held, n.unsyncedWeight()
		}
	}
	if diff != nil {
		c.cur.diff = *diff
	}
	return c.sample(f, now, m)
}

// mark lists a touched entry for the next Take, and flags it dirty when it
// gained a diff. Only tracked namespaces keep these lists.
func (n *Namespace) mark(s *shard, i int32, e *entry, dirty bool) {
	if !n.tracked.Load() {
		return
	}
	if dirty && e.flags&flagDirty == 0 {
		e.flags |= flagDirty
		n.dirty.Add(1)
	}
	if e.flags&flagListed == 0 {
		s.list(i, e)
	}
}

func timeDuration(ns int64) time.Duration { return time.Duration(ns) }

func cloneString(s string) string { return strings.Clone(s) }
