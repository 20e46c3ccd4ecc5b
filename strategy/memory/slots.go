package memory

import (
	"container/heap"
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
func (s *Store) AcquireSlot(ctx context.Context, namespace, key, id string, max int, lease time.Duration) (_ int, _ bool, err error) {
	defer errs.AcquireSlot(&err, namespace)
	if err := s.check(ctx); err != nil {
		return 0, false, err
	}
	if err := strategy.CheckAcquire(id, max, lease); err != nil {
		return 0, false, err
	}
	now := s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(now)
	r := d.acquireSlot(namespace, key, strategy.SlotRequest{ID: id, Max: max, Lease: lease}, now)
	return r.Held, r.OK, nil
}

// acquireSlot takes a slot of key as AcquireSlot does, at now (Unix
// nanoseconds). The caller holds d.mu and swept d.
func (d *data) acquireSlot(namespace, key string, slot strategy.SlotRequest, now int64) strategy.SlotReply {
	k := slotKey{namespace, key}
	held := d.slots[k]
	if _, mine := held[slot.ID]; !mine && len(held) >= slot.Max {
		return strategy.SlotReply{Held: len(held)}
	}
	if held == nil {
		held = make(map[string]int64)
		d.slots[k] = held
	}
	d.leaseSlot(k, held, slot.ID, slotExpiry(now, slot.Lease))
	return strategy.SlotReply{Held: len(held), OK: true}
}

// ReleaseSlots frees the given slots of a namespace, atomically; slots
// that are not held are skipped. An ID that no slot can have (empty, or
// longer than 256 bytes) is refused, before anything is freed, with an
// error that wraps strategy.ErrRejected.
func (s *Store) ReleaseSlots(ctx context.Context, namespace string, slots []strategy.Slot) (err error) {
	defer errs.ReleaseSlots(&err, namespace, len(slots))
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := strategy.CheckSlots(slots); err != nil {
		return err
	}
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, sl := range slots {
		k := slotKey{namespace, sl.Key}
		held := d.slots[k]
		delete(held, sl.ID)
		if held != nil && len(held) == 0 {
			delete(d.slots, k)
		}
	}
	return nil
}

// RenewSlots extends the given slots of a namespace that are still held
// to lease after the store's clock's now, atomically; a slot that expired
// is not taken again. Bad input is refused as by AcquireSlot and
// ReleaseSlots.
func (s *Store) RenewSlots(ctx context.Context, namespace string, slots []strategy.Slot, lease time.Duration) (err error) {
	defer errs.RenewSlots(&err, namespace, len(slots))
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := strategy.CheckRenew(slots, lease); err != nil {
		return err
	}
	now := s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(now) // drops the slots that expired: they are not renewed
	exp := slotExpiry(now, lease)
	for _, sl := range slots {
		k := slotKey{namespace, sl.Key}
		held := d.slots[k]
		if _, ok := held[sl.ID]; ok {
			d.leaseSlot(k, held, sl.ID, exp)
		}
	}
	return nil
}

// Slots returns how many slots the data set holds for a namespace, over
// all its keys, after dropping the expired ones.
func (s *Store) Slots(namespace string) int {
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweep(s.now().UnixNano())
	n := 0
	for k, held := range d.slots {
		if k.namespace == namespace {
			n += len(held)
		}
	}
	return n
}

// leaseSlot sets a slot of held, the slots of k, to expire at exp, and
// records when in the expiry heap.
func (d *data) leaseSlot(k slotKey, held map[string]int64, id string, exp int64) {
	held[id] = exp
	heap.Push(&d.expiries, expiry{at: exp, namespace: k.namespace, cell: cell{key: k.key}, id: id, isSlot: true})
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
