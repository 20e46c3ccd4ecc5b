package syncapp

import (
	"fmt"
	"slices"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
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

	mu    lockorder.Mutex[windowSizesLock]
	sizes []time.Duration
}

// add merges sizes in, refusing those the zone or the store cannot keep.
func (w *windowSizes) add(sizes ...time.Duration) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range sizes {
		if err := window.ValidateSize(s); err != nil {
			return err
		}
		if w.valid != nil {
			if err := w.valid(s); err != nil {
				return fmt.Errorf("window %v: namespace %q syncs with the %s store: %w", s, w.namespace, w.store, err)
			}
		}
		if !slices.Contains(w.sizes, s) {
			w.sizes = append(w.sizes, s)
		}
	}
	slices.Sort(w.sizes)
	return nil
}

// list returns the sizes, ascending.
func (w *windowSizes) list() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.sizes)
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
