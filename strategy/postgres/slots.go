package postgres

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// AcquireSlot takes a concurrency slot of key, named id, when fewer than
// max unexpired slots of key are held, in one call of the table's acquire
// function: one round trip (plus, once per pooled connection, one to
// prepare the call). See strategy.Slotter for the contract, and
// acquireBodySQL for why it is atomic: the call takes a transaction
// advisory lock of the key, so the acquisitions of a key take turns, and
// counts the key's slots once it holds it. Taking an id that is held
// renews it. The slot expires lease (in whole milliseconds) after the
// server's clock's now: the nodes' clocks play no part.
//
// An id of 1 to 256 bytes, a max of at least 1 and a lease from 1ms to an
// hour are taken; other input is refused, before anything is sent, with
// an error that wraps strategy.ErrRejected.
//
// pgx never resends a query. An error wraps strategy.ErrNotSent when the
// call surely never reached the server; any other error leaves the caller
// not knowing whether the slot was taken: acquiring the id again renews
// it, releasing it frees it, and otherwise its lease frees it.
func (s *Store) AcquireSlot(ctx context.Context, namespace, key, id string, max int, lease time.Duration) (_ int, _ bool, err error) {
	defer errs.AcquireSlot(&err, namespace)
	if err := strategy.CheckAcquire(id, max, lease); err != nil {
		return 0, false, err
	}
	conn, err := s.acquire(ctx, &s.slotPart)
	if err != nil {
		return 0, false, err
	}
	defer conn.Release()
	var reply strategy.SlotReply
	slot := strategy.SlotRequest{ID: id, Max: max, Lease: lease}
	if err := scanSlot(conn.QueryRow(ctx, s.sql.acquire, s.acquireArgs(namespace, key, slot, s.names.slotLock(namespace, key))...), &reply); err != nil {
		return 0, false, s.sent(err)
	}
	return reply.Held, reply.OK, nil
}

// acquireArgs are the arguments of a call of the acquire function that
// takes slot of key, whose advisory lock is lock (see slotLock).
func (s *Store) acquireArgs(namespace, key string, slot strategy.SlotRequest, lock int64) []any {
	return []any{stored(namespace, maxStoredNamespace), stored(key, maxStoredKey), stored(slot.ID, maxStoredID),
		int64(slot.Max), strategy.LeaseMs(slot.Lease), lock}
}

// scanSlot reads the answer of a call of the acquire function into reply.
func scanSlot(row pgx.Row, reply *strategy.SlotReply) error {
	return row.Scan(&reply.Held, &reply.OK)
}

// ReleaseSlots frees the given slots of a namespace, in one call of the
// table's release function: one round trip. Slots that are not held are
// skipped. An ID that no slot can have (empty, or longer than 256 bytes)
// is refused, before anything is sent, with an error that wraps
// strategy.ErrRejected. An error wraps strategy.ErrNotSent when the call
// surely never reached the server; releasing again is harmless.
func (s *Store) ReleaseSlots(ctx context.Context, namespace string, slots []strategy.Slot) (err error) {
	defer errs.ReleaseSlots(&err, namespace, len(slots))
	if err := strategy.CheckSlots(slots); err != nil {
		return err
	}
	return s.slotCall(ctx, s.sql.release, namespace, slots, nil)
}

// RenewSlots extends the given slots of a namespace that are still held
// to lease after the server's now, in one call of the table's renew
// function: one round trip. A slot that expired is not taken again. Bad
// input is refused as by AcquireSlot and ReleaseSlots, and errors are
// those of ReleaseSlots (renewing twice is harmless too).
func (s *Store) RenewSlots(ctx context.Context, namespace string, slots []strategy.Slot, lease time.Duration) (err error) {
	defer errs.RenewSlots(&err, namespace, len(slots))
	if err := strategy.CheckRenew(slots, lease); err != nil {
		return err
	}
	leaseMs := strategy.LeaseMs(lease)
	return s.slotCall(ctx, s.sql.renew, namespace, slots, &leaseMs)
}

// slotCall calls the renew function (with a lease) or the release function
// (without) on slots: their keys and ids as the table holds them, each
// slot once, and the advisory locks of their keys, sorted and each once,
// so that every call takes them in one order. With no slots, it sends
// nothing.
func (s *Store) slotCall(ctx context.Context, query, namespace string, slots []strategy.Slot, leaseMs *int64) error {
	if len(slots) == 0 {
		return nil
	}
	seen := make(map[strategy.Slot]bool, len(slots))
	keys := make([][]byte, 0, len(slots))
	ids := make([][]byte, 0, len(slots))
	locks := make([]int64, 0, len(slots))
	for _, sl := range slots {
		if seen[sl] {
			continue
		}
		seen[sl] = true
		keys = append(keys, stored(sl.Key, maxStoredKey))
		ids = append(ids, stored(sl.ID, maxStoredID))
		locks = append(locks, s.names.slotLock(namespace, sl.Key))
	}
	slices.Sort(locks)
	locks = slices.Compact(locks)

	conn, err := s.acquire(ctx, &s.slotPart)
	if err != nil {
		return err
	}
	defer conn.Release()
	ns := stored(namespace, maxStoredNamespace)
	if leaseMs != nil {
		_, err = conn.Exec(ctx, query, ns, keys, ids, *leaseMs, locks)
	} else {
		_, err = conn.Exec(ctx, query, ns, keys, ids, locks)
	}
	return s.sent(err)
}

// Slots returns how many concurrency slots of a namespace the table
// holds, expired or not (a purge drops the expired ones), for tests and
// tools.
func (s *Store) Slots(ctx context.Context, namespace string) (int, error) {
	n, err := s.countRows(ctx, &s.slotPart, "_slots", namespace)
	if err != nil {
		return 0, fmt.Errorf("counting slots: %w", err)
	}
	return n, nil
}

// countRows returns how many rows of a namespace the table <table><suffix>
// of part p holds.
func (s *Store) countRows(ctx context.Context, p *part, suffix, namespace string) (n int, err error) {
	conn, err := s.acquire(ctx, p)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	err = conn.QueryRow(ctx, "SELECT count(*) FROM "+s.names.qualified(suffix)+" WHERE namespace = $1",
		stored(namespace, maxStoredNamespace)).Scan(&n)
	return n, s.sent(err)
}

// slotLock returns the key of the transaction advisory lock that the
// calls touching the slots of a (namespace, key) take: FNV-1a 64 of
// "caddy-ratelimit slot <table> ", the decimal length of the namespace, a
// colon, the namespace and the key, the same on every node. Two keys that
// share a lock key only take turns, which costs time, never correctness.
func (n *names) slotLock(namespace, key string) int64 {
	h := fnv1a(n.slotSeed, strconv.Itoa(len(namespace)))
	h = fnv1a(h, ":")
	h = fnv1a(h, namespace)
	return int64(fnv1a(h, key))
}

// TakesSlotsInBatches marks the store as a strategy.SlotBatcher: its
// HitBatch calls the acquire function in the pipeline of the batch's
// hits.
func (*Store) TakesSlotsInBatches() {}

var _ strategy.SlotBatcher = (*Store)(nil)
