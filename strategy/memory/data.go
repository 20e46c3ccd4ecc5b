package memory

import (
	"container/heap"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// registry holds the named data sets of the process, so that every store
// opened from a strategy of a given name, in any config, shares counters
// the way the nodes of a cluster share one Redis. Data sets are kept for
// the life of the process: a name is small, and the counters inside expire.
var registry = struct {
	mu   sync.Mutex
	sets map[string]*data
}{sets: make(map[string]*data)}

// shared returns the data set of a name, creating it on first use.
func shared(name string) *data {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	d := registry.sets[name]
	if d == nil {
		d = newData()
		registry.sets[name] = d
	}
	return d
}

// data is one data set: the counters, ID markers, concurrency slots,
// rates, bans, marks and fleets that the stores opened under one name
// share. One mutex guards it all, so every operation of a store is
// atomic, as a Redis script is.
type data struct {
	mu sync.Mutex
	// counters are the counters of every namespace, each until its window
	// can no longer be anyone's previous window.
	counters timed[counter, float64]
	// markers are the IDs of applied batches and hits.
	markers timed[marker, struct{}]
	// slots are the concurrency slots of each (namespace, key): each
	// slot's id to when it expires, in Unix nanoseconds, until the last
	// of them expires.
	slots timed[slotKey, map[string]int64]
	// tats are the TATs of rates, in Unix microseconds as the other stores
	// count them, until they have passed (the key then has its whole
	// burst, as a key never seen does).
	tats timed[rateKey, int64]
	// bans maps a namespace to its bans; a namespace without bans is
	// removed.
	bans map[string]*namespaceBans
	// near maps a namespace to its feed of keys near their limits (see
	// near.go); a namespace without marks is removed.
	near map[string][]nearMark
	// fleets maps a namespace to its members (see roster.go): each node's
	// expiry, in Unix nanoseconds. A namespace without members is
	// removed.
	fleets map[string]map[string]int64

	// lookups counts the counters GetCounters looked up (see
	// Store.Lookups). It is atomic so that reading it takes no lock.
	lookups atomic.Int64
}

func newData() *data {
	return &data{
		bans:   make(map[string]*namespaceBans),
		near:   make(map[string][]nearMark),
		fleets: make(map[string]map[string]int64),
	}
}

// sweep drops everything that has expired at now. Every operation calls
// it, so the data set holds little more than what is live.
func (d *data) sweep(now int64) {
	d.counters.sweep(now)
	d.markers.sweep(now)
	d.slots.sweep(now)
	d.tats.sweep(now)
}

// counter names a key's window of a size that starts at start (Unix
// nanoseconds), within a namespace. Keys are compared as whole strings,
// so no byte of a key can make two counters one.
type counter struct {
	namespace string
	key       string
	size      time.Duration
	start     int64
}

// expiresAt returns when the counter expires: once its window can no
// longer be anyone's previous window, at start + 2*size. It saturates
// rather than overflow for windows that would outlive int64 nanoseconds.
func (c counter) expiresAt() int64 {
	if int64(c.size) > (math.MaxInt64-c.start)/2 {
		return math.MaxInt64
	}
	return c.start + 2*int64(c.size)
}

// get returns a counter's value at now, and whether it is held.
func (d *data) get(c counter, now int64) (float64, bool) { return d.counters.get(c, now) }

// put sets a counter's value, unless its window has expired (as Redis
// drops a key whose expiry is in the past).
func (d *data) put(c counter, v float64, now int64) { d.counters.set(c, v, c.expiresAt(), now) }

// add adds v to a counter and returns its new value, which it has even
// when its window has expired and it is not stored.
func (d *data) add(c counter, v float64, now int64) float64 {
	old, _ := d.get(c, now)
	d.put(c, old+v, now)
	return old + v
}

// marker names a batch or hit ID within a namespace: a Hit and a Batch with
// the same ID and namespace share it, which is the hit ID rule.
type marker struct {
	namespace string
	id        string
}

// timed is a map whose entries expire by the store's clock (Unix
// nanoseconds): an entry is gone once its time has come, and a later
// sweep drops it, at the cost of O(log n) per entry over its life.
type timed[K comparable, V any] struct {
	m map[K]timedValue[V]
	q dueHeap[K]
}

// timedValue is an entry of a timed map: its value, when it expires, and
// when its place in the heap falls due. An entry whose expiry moves on
// (a busy key's TAT, a renewed slot) keeps its one place, moved on when
// it falls due, rather than one per move.
type timedValue[V any] struct {
	v        V
	exp, due int64
}

// get returns k's value and whether it is held at now.
func (t *timed[K, V]) get(k K, now int64) (V, bool) {
	e, ok := t.m[k]
	if !ok || e.exp <= now {
		var zero V
		return zero, false
	}
	return e.v, true
}

// set holds v under k until exp; an exp that has come removes k.
func (t *timed[K, V]) set(k K, v V, exp, now int64) {
	if exp <= now {
		delete(t.m, k)
		return
	}
	if t.m == nil {
		t.m = make(map[K]timedValue[V])
	}
	e, ok := t.m[k]
	if !ok || exp < e.due {
		e.due = exp
		heap.Push(&t.q, due[K]{exp, k})
	}
	e.v, e.exp = v, exp
	t.m[k] = e
}

// sweep drops the entries that have expired at now.
func (t *timed[K, V]) sweep(now int64) {
	for len(t.q) > 0 && t.q[0].at <= now {
		x := heap.Pop(&t.q).(due[K])
		e, ok := t.m[x.k]
		switch {
		case !ok || e.due != x.at: // removed, or not its place
		case e.exp <= now:
			delete(t.m, x.k)
		default: // moved on
			e.due = e.exp
			t.m[x.k] = e
			heap.Push(&t.q, due[K]{e.exp, x.k})
		}
	}
	// Give back the heap's memory after a burst has expired.
	if c := cap(t.q); c > 1024 && len(t.q) < c/4 {
		t.q = append(make(dueHeap[K], 0, 2*len(t.q)), t.q...)
	}
}

// due is a place in a timed map's heap: when entry k falls due.
type due[K comparable] struct {
	at int64
	k  K
}

// dueHeap is a min-heap of places by time (container/heap).
type dueHeap[K comparable] []due[K]

func (h dueHeap[K]) Len() int           { return len(h) }
func (h dueHeap[K]) Less(i, j int) bool { return h[i].at < h[j].at }
func (h dueHeap[K]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap[K]) Push(x any)        { *h = append(*h, x.(due[K])) }
func (h *dueHeap[K]) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = due[K]{} // let the strings go
	*h = old[:len(old)-1]
	return x
}
