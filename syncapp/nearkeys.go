package syncapp

import (
	"maps"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// nearKeys is what a periodic node knows of the store's feed of keys near
// their limits (strategy.NearFeed): each marked key until its mark ends,
// and the feed's version its runs read up to.
//
// A node decides a key its runs no longer fetch on old counts, or on none
// if it never saw the key: blind to every hit the others took since. The
// store, which has every node's hits, marks a key when a push brings one
// of its windows near a limit; the runs read the marks with their fetch,
// and a request for a marked key that the runs do not fetch asks the
// store first (periodicHits.blind). So a key whose requests the
// balancer spreads over the fleet is decided on the fleet's count from
// the run after its count came near the limit, however seldom each node
// sees it.
//
// A node with nothing to fetch rests: its runs skip the feed, so that an
// idle fleet costs the store nothing. The first request that finds it
// resting reads the feed (periodicHits.wake) before it is decided, and
// the requests that come meanwhile wait for that read: one round trip
// per node and wake, not per request or key.
type nearKeys struct {
	mu      lockorder.RWMutex[nearKeysLock]
	until   map[string]int64 // Unix nanoseconds
	version int64
	// held is len(until), read without the lock: a request asks the map
	// only when some key is marked.
	held atomic.Int64
	// asked holds the marks this node's synchronous hits asked for (ask),
	// by key, until a run makes them (takeAsked).
	asked map[string]int64
	// resting is set while the runs skip the feed (rest); waking is the
	// read of the requests that find it so (wake).
	resting atomic.Bool
	// clock is the zone whose clock the marks' ends are read by, the
	// windows' (the config's that uses the namespace last).
	clock  atomic.Pointer[window.Zone]
	waking singleflight.Group
}

// maxAsked is the most marks a node asks for between two runs: past it,
// keys go unmarked (the other nodes decide them as without a feed).
const maxAsked = 4096

func newNearKeys() *nearKeys {
	return &nearKeys{until: make(map[string]int64), asked: make(map[string]int64)}
}

// rest has the runs skip the feed until a read brings the node up to
// date again (add): a run with no key to fetch calls it.
func (n *nearKeys) rest() { n.resting.Store(true) }

// restingNow reports whether the runs skip the feed.
func (n *nearKeys) restingNow() bool { return n.resting.Load() }

// wake has read bring a resting node up to date, once for all the
// requests that find it resting at the same time: the first calls read,
// on its own goroutine, and the others wait for it (read is bounded: see
// periodicHits.wake). A read that fails leaves the node resting.
func (n *nearKeys) wake(read func()) {
	if !n.resting.Load() {
		return
	}
	n.waking.Do("", func() (any, error) {
		if n.resting.Load() { // not woken by the read that just ended
			read()
		}
		return nil, nil
	})
}

// ask has the next run mark key until until (Unix nanoseconds), unless a
// mark of it lasts that long already: for a key whose count a synchronous
// hit brought near its limit, which no push marks (the store applies such
// hits itself). A mark that ends sooner does not do: the other nodes would
// decide the key blind in the windows after it.
func (n *nearKeys) ask(key string, until int64) {
	if n.end(key) >= until {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if u, ok := n.asked[key]; ok || len(n.asked) < maxAsked {
		n.asked[key] = max(u, until)
	}
}

// takeAsked returns the marks asked for since the last call, but those of
// keys marked by now until as late (a push marked them meanwhile), and
// forgets them.
func (n *nearKeys) takeAsked() []strategy.NearMark {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.asked) == 0 {
		return nil
	}
	marks := make([]strategy.NearMark, 0, len(n.asked))
	for k, u := range n.asked {
		if n.until[k] < u {
			marks = append(marks, strategy.NearMark{Key: k, Until: time.Unix(0, u)})
		}
	}
	clear(n.asked)
	return marks
}

// reask asks again for marks that a run failed to make.
func (n *nearKeys) reask(marks []strategy.NearMark) {
	for _, m := range marks {
		n.ask(m.Key, m.Until.UnixNano())
	}
}

// known returns the feed's version the runs read up to.
func (n *nearKeys) known() int64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.version
}

// add records the marks a run read, and the version they bring the node
// to (see merge).
func (n *nearKeys) add(marks []strategy.NearMark, version int64, capacity int, now time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.version = version
	n.resting.Store(false)
	n.merge(marks, capacity, now)
}

// made records the marks a run made for this node's synchronous hits
// (takeAsked), which its read did not return: so that its hits of the
// key do not ask for them again until they end, as they would until
// a later read brought them back. The version is the read's.
func (n *nearKeys) made(marks []strategy.NearMark, capacity int, now time.Time) {
	if len(marks) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.merge(marks, capacity, now)
}

// merge records marks, under n.mu, keeping at most capacity keys (those
// that did not fit are left out: they are decided as without a feed).
// Marks that ended by now are forgotten.
func (n *nearKeys) merge(marks []strategy.NearMark, capacity int, now time.Time) {
	if len(marks) == 0 && len(n.until) == 0 {
		return
	}
	t := now.UnixNano()
	maps.DeleteFunc(n.until, func(_ string, u int64) bool { return u <= t })
	for _, m := range marks {
		u := m.Until.UnixNano()
		if u <= t {
			continue
		}
		if old, ok := n.until[m.Key]; ok {
			n.until[m.Key] = max(old, u)
		} else if len(n.until) < capacity {
			n.until[m.Key] = u
		}
	}
	n.held.Store(int64(len(n.until)))
}

// count returns how many keys are marked, as of the last run: marks that
// ended since are forgotten by the next.
func (n *nearKeys) count() int64 { return n.held.Load() }

// has reports whether key is marked, and its mark has not ended.
func (n *nearKeys) has(key string) bool { return n.end(key) > n.now() }

// end returns when key's mark ends (Unix nanoseconds), or 0 for a key not
// marked: without a lock when no key is.
func (n *nearKeys) end(key string) int64 {
	if n.held.Load() == 0 {
		return 0
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.until[key]
}

// now reads the zones' clock.
func (n *nearKeys) now() int64 {
	if z := n.clock.Load(); z != nil {
		return z.Now()
	}
	return time.Now().UnixNano()
}
