package strategy

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Slotter is a Store that can hold concurrency slots: the capability that
// max_concurrent needs in a namespace with a store. A slot is a lease on
// one of at most max places of a key: it frees itself when its holder
// neither releases nor renews it within the lease, so the slots of a node
// that dies come back on their own.
//
// Slots expire by the store's clock (the Redis server's, PostgreSQL's), so
// the clocks of the nodes do not matter. Keys and IDs are arbitrary bytes,
// only ever data: two keys, or one key of two namespaces, never share
// slots, and the slots of a key that nobody renews expire, so that a store
// never grows without bound. Errors follow the conventions of Store and
// Hitter: they wrap ErrNotSent when the request surely never reached the
// store, and ErrRejected for input that can never be accepted (see
// CheckAcquire and CheckSlots).
type Slotter interface {
	Store

	// AcquireSlot takes a slot of key, named id, when fewer than max
	// unexpired slots of key are held, in one round trip. id is unique per
	// request and chosen by the caller (the node's ID and a sequence
	// number). The slot expires lease after the store's clock's now, unless
	// renewed or released. It reports whether the slot was taken and how
	// many slots of key are held after the call, including this one when
	// it was taken. Taking an id that is already held renews it (to lease
	// from now) and succeeds, whatever the number held: so a call whose
	// reply was lost may be sent again under its id without taking a
	// second place.
	//
	// An error that does not wrap ErrNotSent leaves the caller not knowing
	// whether the slot was taken: it may release the id (or let the lease
	// run out), as a slot that was never taken is released harmlessly.
	AcquireSlot(ctx context.Context, namespace, key, id string, max int, lease time.Duration) (held int, ok bool, err error)

	// ReleaseSlots frees the given slots of a namespace, in one round trip
	// per call (on a Redis Cluster, per node involved). Freeing a slot that
	// is not held (it expired, was released or was never taken) is not an
	// error, so a release may be sent again.
	ReleaseSlots(ctx context.Context, namespace string, slots []Slot) error

	// RenewSlots extends to lease after the store's clock's now the given
	// slots of a namespace that are still held, in one round trip per call
	// (Cluster: per node). A slot that expired (or was released) is not
	// taken again: its holder must acquire it anew.
	RenewSlots(ctx context.Context, namespace string, slots []Slot, lease time.Duration) error
}

// SlotBatcher is a Slotter whose batches of hits take concurrency slots,
// so that a request's slot rides the round trip of the synchronous hits
// and rates beside it, with their stall handling: the one road of a
// namespace's requests to its store.
//
// HitBatch takes hits with a Slot (and neither windows nor a rate): each
// takes its slot of Key, in the batch's order, as AcquireSlot would, and
// HitResult.Slot holds the answer. The batch's ID does not guard slots:
// taking an id again renews it, so a slot is taken once however often its
// hit is sent. A hit's error means what AcquireSlot's errors mean: with
// ErrNotSent the slot surely was not taken; otherwise it may have been.
type SlotBatcher interface {
	Slotter
	BatchHitter

	// TakesSlotsInBatches marks a store whose HitBatch takes slots as
	// described above.
	TakesSlotsInBatches()
}

// SplitSlots splits the indexes good of hits into those of the hits
// that count (windows, a rate) and those that take slots, each in order:
// a SlotBatcher sends the two kinds its own ways in one round trip. A
// batch without slots, the common case, returns good itself.
func SplitSlots(hits []HitRequest, good []int) (counted, slots []int) {
	if !slices.ContainsFunc(good, func(i int) bool { return hits[i].Slot != nil }) {
		return good, nil
	}
	for _, i := range good {
		if hits[i].Slot != nil {
			slots = append(slots, i)
		} else {
			counted = append(counted, i)
		}
	}
	return counted, slots
}

// SlotRequest is the concurrency slot that a hit of a SlotBatcher's
// HitBatch takes: AcquireSlot's id, max and lease.
type SlotRequest struct {
	// ID names the slot, as AcquireSlot's id.
	ID string
	// Max is the most slots of the key held at once.
	Max int
	// Lease is how long the slot lives unless renewed or released.
	Lease time.Duration
}

// SlotReply is the answer to a SlotRequest: whether the slot was taken,
// and how many slots of the key are held after it, as AcquireSlot
// reports them.
type SlotReply struct {
	Held int
	OK   bool
}

// Slot names one slot held: the key and the slot's id.
type Slot struct {
	// Key is the key whose place the slot holds.
	Key string
	// ID is the id the slot was acquired with.
	ID string
}

// Limits of the input of a Slotter.
const (
	// MinSlotLease is the shortest lease of a slot: the stores count
	// leases in whole milliseconds, rounding down.
	MinSlotLease = time.Millisecond

	// MaxSlotLease is the longest lease of a slot. A slot whose holder
	// died keeps its place until its lease ends, so a lease stays short
	// and a long request renews its slot instead.
	MaxSlotLease = time.Hour
)

// CheckSlotLease checks the lease of a slot: from MinSlotLease to
// MaxSlotLease. The error names the lease and wraps ErrRejected.
func CheckSlotLease(lease time.Duration) error {
	if lease < MinSlotLease || lease > MaxSlotLease {
		return fmt.Errorf("%w: a slot's lease is %v, not within [%v, %v]", ErrRejected, lease, MinSlotLease, MaxSlotLease)
	}
	return nil
}

// CheckSlotID checks the id of a slot: 1 to MaxIDLen bytes. The error
// wraps ErrRejected.
func CheckSlotID(id string) error {
	if n := len(id); n == 0 || n > MaxIDLen {
		return fmt.Errorf("%w: a slot's ID has %d bytes, not 1 to %d", ErrRejected, n, MaxIDLen)
	}
	return nil
}

// CheckAcquire checks the input of AcquireSlot: an id valid for
// CheckSlotID, a max of at least 1 and a lease valid for CheckSlotLease.
// The error names the field at fault and wraps ErrRejected.
func CheckAcquire(id string, max int, lease time.Duration) error {
	if err := CheckSlotID(id); err != nil {
		return err
	}
	if max < 1 {
		return fmt.Errorf("%w: a key's most slots is %d, less than 1", ErrRejected, max)
	}
	return CheckSlotLease(lease)
}

// CheckSlots checks the slots of a release or a renewal: each has an ID
// valid for CheckSlotID (any key will do). The error names the first bad
// one by its index and wraps ErrRejected.
func CheckSlots(slots []Slot) error {
	for i := range slots {
		if err := CheckSlotID(slots[i].ID); err != nil {
			return fmt.Errorf("slots[%d]: %w", i, err)
		}
	}
	return nil
}

// CheckRenew checks the input of RenewSlots: a lease valid for
// CheckSlotLease and slots valid for CheckSlots. The error names what is
// at fault and wraps ErrRejected.
func CheckRenew(slots []Slot, lease time.Duration) error {
	if err := CheckSlotLease(lease); err != nil {
		return err
	}
	return CheckSlots(slots)
}

// LeaseMs returns a checked lease in whole milliseconds, rounded down, as
// the stores count it.
func LeaseMs(lease time.Duration) int64 { return int64(lease / time.Millisecond) }
