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

// data is one data set: the counters, ID markers and concurrency slots
// that the stores opened under one name share. One mutex guards it all, so every operation
// of a store is atomic, as a Redis script is.
type data struct {
	mu sync.Mutex
	// spaces maps a namespace to its counters. A namespace without
	// counters is removed, so that namespaces come and go freely.
	spaces map[string]map[cell]float64
	// markers maps the IDs of applied batches and hits to when they
	// expire, in Unix nanoseconds.
	markers map[marker]int64
	// slots maps a (namespace, key) to its concurrency slots: each slot's
	// id to when it expires, in Unix nanoseconds. A key without slots is
	// removed.
	slots map[slotKey]map[string]int64
	// bans maps a namespace to its bans; a namespace without bans is
	// removed.
	bans map[string]*namespaceBans
	// near maps a namespace to its feed of keys near their limits (see
	// near.go); a namespace without marks is removed.
	near map[string]*nearFeed
	// fleets maps a namespace to its members (see roster.go): each node's
	// expiry, in Unix nanoseconds. A namespace without members is
	// removed.
	fleets map[string]map[string]int64
	// expiries lists what expires when, earliest first: one entry per
	// counter or marker created, and per slot taken or renewed, so that a
	// sweep drops exactly what has expired, at a cost of O(log n) per entry
	// over its life.
	expiries expiryHeap
	// rates holds the TATs of rates and the records of their IDs (see
	// gcra.go), made by the first Rate.
	rates *rateData

	// lookups counts the counters GetCounters looked up (see
	// Store.Lookups). It is atomic so that reading it takes no lock.
	lookups atomic.Int64
}

func newData() *data {
	return &data{
		spaces:  make(map[string]map[cell]float64),
		markers: make(map[marker]int64),
		slots:   make(map[slotKey]map[string]int64),
		bans:    make(map[string]*namespaceBans),
		near:    make(map[string]*nearFeed),
	}
}

// cell names a counter within a namespace: a key's window of a size that
// starts at start (Unix nanoseconds). Keys are compared as whole strings,
// so no byte of a key can make two counters one.
type cell struct {
	key   string
	size  time.Duration
	start int64
}

// expiresAt returns when the counter expires: once its window can no
// longer be anyone's previous window, at start + 2*size. It saturates
// rather than overflow for windows that would outlive int64 nanoseconds.
func (c cell) expiresAt() int64 {
	if int64(c.size) > (math.MaxInt64-c.start)/2 {
		return math.MaxInt64
	}
	return c.start + 2*int64(c.size)
}

// marker names a batch or hit ID within a namespace: a Hit and a Batch with
// the same ID and namespace share it, which is the hit ID rule.
type marker struct {
	namespace string
	id        string
}

// get returns a counter's value at now (Unix nanoseconds), and whether it
// is held; an expired counter is not, even before a sweep drops it.
func (d *data) get(namespace string, c cell, now int64) (float64, bool) {
	if c.expiresAt() <= now {
		return 0, false
	}
	v, ok := d.spaces[namespace][c]
	return v, ok
}

// add adds v to a counter and returns its new value. A counter of a window
// that has already expired is not stored (as Redis drops a key whose
// expiry is in the past), but the value it would have had is returned.
func (d *data) add(namespace string, c cell, v float64, now int64) float64 {
	old, _ := d.get(namespace, c, now)
	d.put(namespace, c, old+v, now)
	return old + v
}

// put sets a counter's value, unless its window has expired.
func (d *data) put(namespace string, c cell, v float64, now int64) {
	exp := c.expiresAt()
	if exp <= now {
		return
	}
	space := d.spaces[namespace]
	if space == nil {
		space = make(map[cell]float64)
		d.spaces[namespace] = space
	}
	if _, ok := space[c]; !ok {
		heap.Push(&d.expiries, expiry{at: exp, namespace: namespace, cell: c})
	}
	space[c] = v
}

// marked reports whether an ID marker is set and not expired at now.
func (d *data) marked(m marker, now int64) bool {
	exp, ok := d.markers[m]
	return ok && exp > now
}

// mark sets an ID marker until exp (Unix nanoseconds).
func (d *data) mark(m marker, exp int64) {
	d.markers[m] = exp
	heap.Push(&d.expiries, expiry{at: exp, namespace: m.namespace, id: m.id, isMarker: true})
}

// sweep drops every counter and marker that has expired at now. Every
// write calls it, so the data set holds little more than what is live, and
// its cost is one heap pop per entry ever created.
func (d *data) sweep(now int64) {
	for len(d.expiries) > 0 && d.expiries[0].at <= now {
		e := heap.Pop(&d.expiries).(expiry)
		if e.isSlot {
			// A slot renewed since has a later expiry and an entry of its
			// own: keep it.
			k := slotKey{e.namespace, e.cell.key}
			held := d.slots[k]
			if exp, ok := held[e.id]; ok && exp <= now {
				delete(held, e.id)
				if len(held) == 0 {
					delete(d.slots, k)
				}
			}
			continue
		}
		if e.isMarker {
			// A marker that expired and was set again has a later
			// expiry and an entry of its own: keep it.
			m := marker{e.namespace, e.id}
			if exp, ok := d.markers[m]; ok && exp <= now {
				delete(d.markers, m)
			}
			continue
		}
		space := d.spaces[e.namespace]
		delete(space, e.cell)
		if space != nil && len(space) == 0 {
			delete(d.spaces, e.namespace)
		}
	}
	// Give back the heap's memory after a burst has expired.
	if c := cap(d.expiries); c > 1024 && len(d.expiries) < c/4 {
		d.expiries = append(make(expiryHeap, 0, 2*len(d.expiries)), d.expiries...)
	}
}

// expiry is one entry of the expiry heap: a counter; a marker when
// isMarker is set; or, when isSlot is set, the slot id of the key
// cell.key.
type expiry struct {
	at        int64
	namespace string
	cell      cell
	id        string
	isMarker  bool
	isSlot    bool
}

// expiryHeap is a min-heap of expiries by time (container/heap).
type expiryHeap []expiry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = expiry{} // let the strings go
	*h = old[:len(old)-1]
	return e
}
