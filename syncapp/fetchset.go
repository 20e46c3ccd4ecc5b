package syncapp

import (
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
)

// fetchSpan is how long after its last request a key stays fetched, at
// least: a node that sees a key every 30ms in a namespace synced every
// 10ms then holds the others' counts of one run ago, not of its previous
// request. Above 50ms it changes nothing: every key is fetched twice.
const fetchSpan = 100 * time.Millisecond

// fetchRuns is how many fetches read a key after a run that found it
// touched.
func fetchRuns(interval time.Duration) int64 {
	if interval <= 0 {
		return 2
	}
	return max(2, int64((fetchSpan+interval-1)/interval))
}

// fetchSet is the keys whose store counts a periodic namespace's runs
// fetch. A key is fetched by the fetchRuns fetches after the run that
// found it touched (at least two): the second lets a node see the diffs
// other nodes pushed in the same aligned run as its own fetch, and more
// keep a key that a node sees less often than every two runs up to date
// between its requests.
type fetchSet struct {
	mu lockorder.RWMutex[fetchSetLock]
	// touched maps each key to the number of fetches made when a run last
	// found it touched; fetches counts the fetches made.
	touched map[string]int64
	fetches int64
}

func newFetchSet() *fetchSet { return &fetchSet{touched: make(map[string]int64)} }

// touch adds the keys a run found touched, up to capacity keys in all: a
// key left out is added when it is touched again.
func (f *fetchSet) touch(keys []string, capacity int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		if _, ok := f.touched[k]; !ok && len(f.touched) >= capacity {
			break
		}
		f.touched[k] = f.fetches
	}
}

// has reports whether the runs fetch key.
func (f *fetchSet) has(key string) bool {
	f.mu.RLock()
	_, ok := f.touched[key]
	f.mu.RUnlock()
	return ok
}

// due returns the keys touched within the last runs fetches, and forgets
// the others.
func (f *fetchSet) due(runs int64) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(f.touched))
	for k, last := range f.touched {
		if f.fetches-last >= runs {
			delete(f.touched, k)
			continue
		}
		keys = append(keys, k)
	}
	return keys
}

// fetched counts a fetch that read the keys due.
func (f *fetchSet) fetched() {
	f.mu.Lock()
	f.fetches++
	f.mu.Unlock()
}
