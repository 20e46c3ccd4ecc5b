package memory

import (
	"context"
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// slotKey names the slots of a key within a namespace.
type slotKey struct {
	namespace string
	key       string
}

// AcquireSlot takes a slot of key, named id, when fewer than max slots of
// key are held and unexpired, atomically (see strategy.Slotter). Taking
// an id that is held renews it. The slot expires lease after the store's
// clock's now, the lease counted in whole milliseconds as Redis counts
// it. An id of 1 to 256 bytes, a max of at least 1 and a lease from 1ms
// to an hour are taken; other input is refused, before anything changes,
// with an error that wraps strategy.ErrRejected.
func (s *Store) AcquireSlot(ctx context.Context, namespace, key, id string, max int, lease time.Duration) (held int, ok bool, err error) {
	defer errs.AcquireSlot(&err, namespace)
	err = s.run(ctx, strategy.CheckAcquire(id, max, lease), func(d *data, now int64) {
		r := d.acquireSlot(namespace, key, strategy.SlotRequest{ID: id, Max: max, Lease: lease}, now)
		held, ok = r.Held, r.OK
	})
	return held, ok, err
}

// acquireSlot takes a slot of key as AcquireSlot does, at now (Unix
// nanoseconds). The caller holds d.mu.
func (d *data) acquireSlot(namespace, key string, slot strategy.SlotRequest, now int64) strategy.SlotReply {
	k := slotKey{namespace, key}
	held := d.heldSlots(k, now)
	if _, mine := held[slot.ID]; !mine && len(held) >= slot.Max {
		return strategy.SlotReply{Held: len(held)}
	}
	if held == nil {
		held = make(map[string]int64)
	}
	held[slot.ID] = slotExpiry(now, slot.Lease)
	d.putSlots(k, held, now)
	return strategy.SlotReply{Held: len(held), OK: true}
}

// heldSlots returns the slots of k that have not expired at now. The
// caller holds d.mu.
func (d *data) heldSlots(k slotKey, now int64) map[string]int64 {
	held, _ := d.slots.get(k, now)
	for id, exp := range held {
		if exp <= now {
			delete(held, id)
		}
	}
	return held
}

// putSlots stores the slots of k, held until the last of them expires
// (none: at once). The caller holds d.mu.
func (d *data) putSlots(k slotKey, held map[string]int64, now int64) {
	last := int64(0)
	for _, exp := range held {
		last = max(last, exp)
	}
	d.slots.set(k, held, last, now)
}

// ReleaseSlots frees the given slots of a namespace, atomically; slots
// that are not held are skipped. An ID that no slot can have (empty, or
// longer than 256 bytes) is refused, before anything is freed, with an
// error that wraps strategy.ErrRejected.
func (s *Store) ReleaseSlots(ctx context.Context, namespace string, slots []strategy.Slot) (err error) {
	defer errs.ReleaseSlots(&err, namespace, len(slots))
	return s.run(ctx, strategy.CheckSlots(slots), func(d *data, now int64) {
		for _, sl := range slots {
			k := slotKey{namespace, sl.Key}
			held := d.heldSlots(k, now)
			delete(held, sl.ID)
			d.putSlots(k, held, now)
		}
	})
}

// RenewSlots extends the given slots of a namespace that are still held
// to lease after the store's clock's now, atomically; a slot that expired
// is not taken again. Bad input is refused as by AcquireSlot and
// ReleaseSlots.
func (s *Store) RenewSlots(ctx context.Context, namespace string, slots []strategy.Slot, lease time.Duration) (err error) {
	defer errs.RenewSlots(&err, namespace, len(slots))
	return s.run(ctx, strategy.CheckRenew(slots, lease), func(d *data, now int64) {
		for _, sl := range slots {
			k := slotKey{namespace, sl.Key}
			held := d.heldSlots(k, now) // without those that expired: they are not renewed
			if _, ok := held[sl.ID]; ok {
				held[sl.ID] = slotExpiry(now, lease)
				d.putSlots(k, held, now)
			}
		}
	})
}

// Slots returns how many slots the data set holds for a namespace, over
// all its keys, after dropping the expired ones.
func (s *Store) Slots(namespace string) (n int) {
	s.lock(func(d *data, now int64) {
		for k := range d.slots.m {
			if k.namespace == namespace {
				n += len(d.heldSlots(k, now))
			}
		}
	})
	return n
}

// slotExpiry returns when a slot leased at now (Unix nanoseconds) expires:
// the lease, in whole milliseconds as the other stores count it, later.
func slotExpiry(now int64, lease time.Duration) int64 {
	l := strategy.LeaseMs(lease) * int64(time.Millisecond)
	if now > math.MaxInt64-l {
		return math.MaxInt64
	}
	return now + l
}

// TakesSlotsInBatches marks the store as a strategy.SlotBatcher.
func (*Store) TakesSlotsInBatches() {}

var _ strategy.SlotBatcher = (*Store)(nil)
