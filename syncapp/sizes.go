package syncapp

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// windowSizes are the window sizes of a namespace: those its handlers'
// limits use, which its runs fetch and a reset clears in the store. A
// namespace that syncs with a store takes only the sizes its store can
// keep.
type windowSizes struct {
	namespace string
	store     string                    // the store's module, for errors
	valid     func(time.Duration) error // the store's check, or nil

	// sizes holds the sizes, ascending; add replaces the slice, which is
	// never changed once stored, so that runs read it without a lock.
	sizes atomic.Pointer[[]time.Duration]
}

// add merges sizes in, refusing those the zone or the store cannot keep.
func (w *windowSizes) add(sizes ...time.Duration) error {
	for _, s := range sizes {
		if err := window.ValidateSize(s); err != nil {
			return err
		}
		if w.valid != nil {
			if err := w.valid(s); err != nil {
				return fmt.Errorf("window %v: namespace %q syncs with the %s store: %w", s, w.namespace, w.store, err)
			}
		}
	}
	update(&w.sizes, func(merged []time.Duration) []time.Duration {
		for _, s := range sizes {
			if !slices.Contains(merged, s) {
				merged = append(merged, s)
			}
		}
		slices.Sort(merged)
		return merged
	})
	return nil
}

// update replaces the slice p points to with what change makes of a copy
// of it, retrying when another update came first: a slice read far more
// often than changed, which its readers load without a lock and never
// change.
func update[T any](p *atomic.Pointer[[]T], change func([]T) []T) {
	for {
		old := p.Load()
		var s []T
		if old != nil {
			s = slices.Clone(*old)
		}
		s = change(s)
		if p.CompareAndSwap(old, &s) {
			return
		}
	}
}

// list returns the sizes, ascending, in a slice of the caller's.
func (w *windowSizes) list() []time.Duration {
	if p := w.sizes.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// with returns the sizes and those of held that are not among them,
// ascending: a key's windows may be of sizes only the Go API used. With
// stored, held sizes the store cannot keep are left out.
func (w *windowSizes) with(held []time.Duration, stored bool) []time.Duration {
	sizes := w.list()
	for _, s := range held {
		if !slices.Contains(sizes, s) && (!stored || w.storable(s)) {
			sizes = append(sizes, s)
		}
	}
	slices.Sort(sizes)
	return sizes
}

// storable reports whether the store can keep windows of size s.
func (w *windowSizes) storable(s time.Duration) bool {
	return w.valid == nil || w.valid(s) == nil
}
