package strategy

import (
	"context"
	"fmt"
	"time"
)

// Roster is a Store that can count the nodes of a namespace's fleet:
// each node attends now and then, and learns from the same round trip how
// many nodes attended within their own time to live. A namespace whose
// nodes enforce their share of each limit while the store is away
// (on_store_failure share) needs to know how many nodes share it, and the
// store is the one place every node reaches.
//
// Members expire by the store's clock, so that nodes' clocks never
// matter, and the store never grows without bound. Node IDs and
// namespaces are arbitrary bytes, only ever data. Errors follow the
// conventions of Store.
type Roster interface {
	Store

	// Attend records node as a member of namespace's fleet until ttl from
	// now, and returns how many members the fleet has, node included: the
	// members whose last attendance has not expired. One round trip.
	// Attending again only moves the node's expiry.
	Attend(ctx context.Context, namespace, node string, ttl time.Duration) (members int, err error)
}

// MinAttendTTL and MaxAttendTTL bound a member's time to live: at least a
// millisecond, which is the stores' resolution, and at most a day.
const (
	MinAttendTTL = time.Millisecond
	MaxAttendTTL = 24 * time.Hour
)

// CheckAttend checks the input of Attend; the error wraps ErrRejected.
func CheckAttend(node string, ttl time.Duration) error {
	switch {
	case node == "":
		return fmt.Errorf("%w: a node ID is empty", ErrRejected)
	case ttl < MinAttendTTL || ttl > MaxAttendTTL:
		return fmt.Errorf("%w: a member's time to live of %v is not between %v and %v", ErrRejected, ttl, MinAttendTTL, MaxAttendTTL)
	}
	return nil
}
