package redis

import (
	"strings"
	"sync"
	"time"
)

// How long a count read of a previous window stays usable: see prevCache.
const (
	// prevSettle is how long after a window ends its count is taken as
	// final. A synchronous hit reaches Redis within its timeout (a second
	// in the sync app) of the moment its node chose its window, and nodes'
	// clocks may differ by up to expiryMargin; a count read later than
	// that after the window ended has every hit of the window.
	prevSettle = 2 * time.Second
	// prevRefresh is how long a count read stays usable at all: what
	// reaches a previous window later than prevSettle (a failed hit's
	// retry, a periodic push of a node that syncs rarely, a reset through
	// another node) reaches this node's hits at most this much later than
	// it reaches Redis.
	prevRefresh = time.Second
	// prevShards is the number of independently locked parts of the
	// cache, chosen by a key's bucket.
	prevShards = 16
	// prevShardCap is the most entries one generation of a shard holds.
	prevShardCap = 1024
)

// prevCache remembers, for the windows of recent synchronous hits, what the
// hits' script replies said of them: the previous window's count and the
// current window's count. A hit whose previous count the cache holds, read
// recently enough, sends it to the script, which then does not read it:
// that saves one command per hit. See the package documentation
// (Synchronous hits) for when a count is usable.
//
// Entries are keyed by the previous window's counter key, which names the
// namespace, the client key, the size and the previous window's start, so
// an entry serves one window of one key and a new window starts with none.
// Client keys are chosen by clients, so the cache is bounded: each shard
// keeps two generations of at most prevShardCap entries, and starts a new
// one (dropping the older) when the current one is full or prevRefresh
// old. Entries older than two generations are gone, and none could be used
// after prevRefresh anyway; a key pushed out early only reads its previous
// count again. At most 2*prevShards*prevShardCap entries (32,768) are held,
// a few megabytes with their keys.
type prevCache struct {
	shards [prevShards]prevShard
}

type prevShard struct {
	mu       sync.Mutex
	cur, old map[string]*prevSlot
	since    int64 // when cur started, Unix milliseconds
}

// prevSlot is an entry of the cache and its key, which the cache owns: a
// put updates an entry in place, without storing its key again.
type prevSlot struct {
	key string
	e   prevEntry
}

// prevEntry is what the cache knows of one window of a key.
type prevEntry struct {
	// prev is the previous window's count as the script replied it (a
	// string, as Redis holds it, so that the script decides on exactly
	// the same value), read by a hit sent at readAt (Unix milliseconds).
	// readAt is 0 when prev is unknown.
	prev      string
	readAt    int64
	prevCount float64 // prev parsed
	// cur is the current window's count after the last hit that replied.
	cur float64
}

func newPrevCache() *prevCache { return new(prevCache) }

// get returns the entry of key (a previous counter's key) in bucket.
func (c *prevCache) get(bucket int, key string) (prevEntry, bool) {
	s := &c.shards[bucket%prevShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.cur[key]
	if p == nil {
		p = s.old[key]
	}
	if p == nil {
		return prevEntry{}, false
	}
	return p.e, true
}

// put stores the entry of key in bucket at nowMs (Unix milliseconds). It
// copies key when it adds an entry, so key may be part of a longer string
// that the cache must not keep.
func (c *prevCache) put(bucket int, key string, e prevEntry, nowMs int64) {
	s := &c.shards[bucket%prevShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.cur[key]; p != nil {
		p.e = e
		return
	}
	p := s.old[key] // kept on into the current generation
	if s.cur == nil || len(s.cur) >= prevShardCap || nowMs-s.since >= prevRefresh.Milliseconds() || nowMs < s.since {
		s.old, s.cur, s.since = s.cur, make(map[string]*prevSlot), nowMs
	}
	if p == nil {
		p = &prevSlot{key: strings.Clone(key)}
	}
	p.e = e
	s.cur[p.key] = p
}

// forget drops the entries of keys in bucket.
func (c *prevCache) forget(bucket int, keys ...string) {
	if c == nil {
		return
	}
	s := &c.shards[bucket%prevShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.cur, k)
		delete(s.old, k)
	}
}

// usablePrev reports whether e's previous count may stand in for a read,
// at nowMs, for a window that started at startMs (Unix milliseconds),
// whose previous window has weight in the rate: it was read less than
// prevRefresh ago, and, unless the weight is 0 (the previous count plays
// no part in the decision, only in the reply), at least prevSettle after
// the previous window ended.
func (e *prevEntry) usablePrev(startMs, nowMs int64, weight float64) bool {
	return e.readAt != 0 && nowMs-e.readAt < prevRefresh.Milliseconds() && nowMs >= e.readAt &&
		(weight == 0 || e.readAt >= startMs+prevSettle.Milliseconds())
}

// settling reports whether, at nowMs, the previous window of a window that
// started at startMs (Unix milliseconds) ended too recently for any read
// of its count to be usable (see usablePrev), so that there is no entry
// to look for: its count has weight in the rate, and no read is
// prevSettle older than its end yet. The previous windows of windows
// shorter than prevSettle are always settling.
func settling(startMs, nowMs int64, weight float64) bool {
	return weight != 0 && nowMs < startMs+prevSettle.Milliseconds()
}
