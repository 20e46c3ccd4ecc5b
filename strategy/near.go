package strategy

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// NearFeed is a Store that tells every node which keys come near their
// limits: the capability that keeps a periodic namespace within its
// bounds for keys its nodes see seldom, such as a client whose requests
// a round-robin balancer spreads over the fleet. A node decides a key it
// has not fetched lately on old counts, or none; the store, which holds
// every node's hits, marks a key when a push brings one of its windows
// near its limit, and each node's runs read the marks made since they
// last looked, so that a node asks the store before it decides a marked
// key it has not fetched lately.
//
// A push marks: a diff of a Batch whose Near and Limit are above 0 marks
// its key when it brings its window's count from below Near × Limit to
// Near × Limit or more, so a key is marked once per window and crossing,
// not by every diff past it (NearAt). The mark lasts until the window's
// start plus five times its size (NearUntil): the window's count weighs
// on a sliding rate through the next window, and a window whose number
// (its start divided by its size) is not a multiple of four, and whose
// diff says the window before came near (window.Diff.Previous), marks
// nothing: the nearest window before it that marked is at most three
// back (a run of near windows marks at its first and at each multiple of
// four), so that mark lasts through this window's next. So a key near
// its limit in every window is marked every fourth window: a hot key's
// marks, which every node's fetch reads anyway, cost its pushes a write
// per four windows, not per window.
// Marks are made by the push that applies the diffs, in its round trip or
// before PushDiffs returns: a batch pushed again under its ID marks
// nothing again, and a push that fails may have made its marks or not.
//
// A namespace's marks carry a version, as bans do: it grows with every
// push that marks, so that a node that read up to one version learns of
// the marks made since then, and only those, and one whose view is
// current learns so at no cost beyond its fetch. Marks end by themselves,
// and the store never holds more of them than a bound of its own (the
// newest kept); a node that reads less often than that many marks are
// made misses the oldest, and decides those keys as it would without a
// feed. Keys are arbitrary bytes, only ever data. Errors follow the
// conventions of Store.
type NearFeed interface {
	Store

	// GetCountersNear is GetCounters, and the namespace's marks made
	// after version known that have not ended by now, with the version
	// they bring the reader to: in one round trip when known is the
	// store's version. keys may be empty, for the marks alone. A known of
	// 0 reads every mark that has not ended, and so does a known the store
	// is not at (ahead of its version, as after the store lost its data).
	// Marks come in the order they were made; a key marked twice may come
	// twice.
	//
	// mark, when not empty, holds marks to make after the read, as
	// MarkNear makes them (the read does not return them): a node's run
	// makes the marks its synchronous hits asked for with its fetch. The
	// store may send them in the read's round trip (PostgreSQL: in its
	// transaction) or in one after it; when the call fails, they may
	// have been made or not.
	GetCountersNear(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, known int64, mark []NearMark) (counts []window.Count, marks []NearMark, version int64, err error)

	// MarkNear makes marks as a push's crossings would, one version for
	// them all, in one round trip: for keys that a node saw come near
	// their limits other than by a push, such as by its synchronous hits
	// (sync_above), which the store applies without marking. Marks that
	// ended by the time they are made are made all the same and read by
	// no one. Marks made twice are harmless: a reader reads the key twice.
	MarkNear(ctx context.Context, namespace string, marks []NearMark) error
}

// NearMark says that a key came near one of its limits, until a time.
type NearMark struct {
	// Key is the key marked.
	Key string
	// Until is when the mark ends.
	Until time.Time
}

// NearAt returns the count of a diff's window at which a batch whose
// Near is near marks the diff's key, or 0 when it marks nothing: when
// near or the diff's Limit is not above 0, or their product is not
// finite, or the window's number is not a multiple of four and the
// diff's Previous is at that count or more (a window at most three
// before marked the key until this window's next one ends; see
// NearFeed).
func NearAt(near float64, d *window.Diff) float64 {
	if !(near > 0) || !(d.Limit > 0) {
		return 0
	}
	at := near * d.Limit
	if math.IsInf(at, 0) || math.IsNaN(at) {
		return 0
	}
	if d.Size > 0 && window.Index(d.Start, d.Size)%nearPeriod != 0 && d.Previous >= at {
		return 0
	}
	return at
}

// Crosses reports whether adding value to a count that is now (after the
// add) count takes it from below at to at or more: a diff that marks its
// key (see NearFeed). An at of 0 never crosses.
func Crosses(at, count, value float64) bool {
	return at > 0 && value > 0 && count >= at && count-value < at
}

// nearPeriod is how many windows apart a key near its limit in every
// window is marked (see NearFeed).
const nearPeriod = 4

// NearUntil returns when the mark of a diff's key ends: its window's
// start plus nearPeriod + 1 times its size, through the window after the
// last one its mark may cover (see NearFeed).
func NearUntil(d *window.Diff) time.Time {
	return time.Unix(0, d.Start).Add((nearPeriod + 1) * d.Size)
}

// CheckNear checks a Batch's Near: 0, or a finite share above 0. The
// error names the value and wraps ErrRejected.
func CheckNear(near float64) error {
	if near < 0 || math.IsNaN(near) || math.IsInf(near, 0) {
		return fmt.Errorf("%w: the batch's near share %v is not 0 or a finite number above 0", ErrRejected, near)
	}
	return nil
}
