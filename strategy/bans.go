package strategy

import (
	"context"
	"fmt"
	"time"
)

// Banner is a Store that can hold bans: the capability that a handler's
// ban needs to reach the whole fleet. A ban shuts a key of a namespace
// out until its end; the nodes push the bans they start and read the
// namespace's bans with each sync run, so that every node rejects a
// banned key without a round trip per request.
//
// A namespace's bans carry a version that changes whenever they change
// (a ban set, lengthened or lifted), so that a node whose view is current
// learns so in one cheap round trip, whatever the number of bans. Bans
// expire by themselves at their end, and the store never grows without
// bound. Keys are arbitrary bytes, only ever data. Errors follow the
// conventions of Store: they wrap ErrNotSent when the request surely
// never reached the store, and ErrRejected for input that can never be
// accepted (see CheckBans).
type Banner interface {
	Store

	// SetBans records bans of a namespace, in one round trip: each Ban
	// with an end bans its key until then, or until a later end the store
	// already holds; a Ban with a zero Until lifts the key's ban. A Ban
	// whose end has passed changes nothing. Setting a ban again is
	// harmless, so a failed call may be sent again.
	SetBans(ctx context.Context, namespace string, bans []Ban) error

	// GetBans returns the namespace's version of its bans and, unless it
	// equals known, every ban that has not ended by now: in one round
	// trip, at a cost that does not depend on the number of bans when the
	// version is known. A namespace without bans has version 0; a
	// version is otherwise unique to one state of the bans. A lift keeps
	// a version other than 0 until the lifted ban would have ended, so
	// that a node that reads version 0 while it knows of a ban that has
	// not ended learns that the store lost its bans (a Redis restarted
	// empty), and writes them back.
	//
	// Versions come in epochs (BanEpoch): the first change of a namespace
	// at version 0 starts a new one, never used before, and every later
	// change adds 1 to the version, in the same epoch, for as long as the
	// version is not 0. So a node that reads a version of another epoch
	// than the one it knows, while it holds a ban that has not ended,
	// learns that the store lost its bans too, although another node
	// wrote some back (starting the new epoch) before it looked.
	GetBans(ctx context.Context, namespace string, known int64, now time.Time) (bans []Ban, version int64, err error)
}

// BanEpochShift is how many low bits of a ban version count the changes
// within its epoch: 2^20, about a million, after which the epoch a
// version reads as moves on by one (a node then writes back the bans it
// holds, which changes nothing that the store holds).
const BanEpochShift = 20

// BanEpoch returns the epoch of a ban version (see Banner.GetBans).
func BanEpoch(version int64) int64 { return version >> BanEpochShift }

// Ban shuts a key out until a time.
type Ban struct {
	// Key is the banned key.
	Key string
	// Until is when the ban ends; a zero Until lifts a ban (SetBans).
	Until time.Time
}

// MaxBanLength is the longest a ban may last from now, as a store takes it.
const MaxBanLength = 366 * 24 * time.Hour

// CheckBans checks the input of SetBans: every end is zero or at most
// MaxBanLength after now. The error names the key's ban at fault and wraps
// ErrRejected.
func CheckBans(bans []Ban, now time.Time) error {
	for _, b := range bans {
		if !b.Until.IsZero() && b.Until.Sub(now) > MaxBanLength {
			return fmt.Errorf("%w: a ban ends %v from now, later than %v", ErrRejected, b.Until.Sub(now).Round(time.Second), MaxBanLength)
		}
	}
	return nil
}
