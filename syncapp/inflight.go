package syncapp

import (
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// inflight sums, per counter, the diffs taken from the zone and not yet in
// the store. An answer of the store lacks them until the push that
// carries them lands, so the reader adds them back.
//
// A read of the store may be answered before a push lands and looked at
// after the push left inflight: its counts then lack the push's diffs,
// and inflight no longer has them. The epoch tells the reader: it grows
// each time diffs leave inflight, and a reader that saw it change since
// it sent its read only lets the counts it holds rise
// (window.Namespace.ObserveAtLeast).
type inflight struct {
	p atomic.Pointer[inflightSums]
}

// inflightSums is one state of inflight.
type inflightSums struct {
	m     map[counterID]float64
	epoch uint64
}

// counterID names one counter of a namespace.
type counterID struct {
	key   string
	size  time.Duration
	start int64
}

// set records the diffs of the given batches as on their way to the
// store, replacing what was recorded before.
func (f *inflight) set(batches []strategy.Batch) {
	m := make(map[counterID]float64)
	for _, b := range batches {
		for _, d := range b.Diffs {
			m[counterID{d.Key, d.Size, d.Start}] += d.Value
		}
	}
	old := f.p.Load()
	next := &inflightSums{m: m}
	if old != nil {
		next.epoch = old.epoch
		for id, v := range old.m {
			if m[id] < v {
				next.epoch++ // some of it landed (or was dropped)
				break
			}
		}
	}
	if len(m) == 0 {
		next.m = nil
	}
	f.p.Store(next)
}

// load returns the sums recorded (nil if none), which the caller must not
// change, and the epoch they belong to.
func (f *inflight) load() (map[counterID]float64, uint64) {
	if s := f.p.Load(); s != nil {
		return s.m, s.epoch
	}
	return nil, 0
}

// epoch returns the current epoch.
func (f *inflight) epoch() uint64 {
	_, e := f.load()
	return e
}
