package syncapp

import (
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// inflight sums, per counter, the diffs taken from the zone and not yet in
// the store. A synchronous answer takes the store's counts, which lack
// them until the push that carries them lands, so it adds them back.
type inflight struct {
	p atomic.Pointer[map[counterID]float64]
}

// counterID names one counter of a namespace.
type counterID struct {
	key   string
	size  time.Duration
	start int64
}

// set records the diffs of the given batches as on their way to the
// store, replacing what was recorded before.
func (f *inflight) set(retries []strategy.Batch, batches ...*strategy.Batch) {
	m := make(map[counterID]float64)
	add := func(b strategy.Batch) {
		for _, d := range b.Diffs {
			m[counterID{d.Key, d.Size, d.Start}] += d.Value
		}
	}
	for _, b := range retries {
		add(b)
	}
	for _, b := range batches {
		if b != nil {
			add(*b)
		}
	}
	if len(m) == 0 {
		f.p.Store(nil)
		return
	}
	f.p.Store(&m)
}

// load returns the sums recorded, nil if none. The caller must not change
// them.
func (f *inflight) load() map[counterID]float64 {
	if m := f.p.Load(); m != nil {
		return *m
	}
	return nil
}
