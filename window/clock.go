package window

import (
	"sync/atomic"
	"time"
)

// Clock returns the current time in Unix nanoseconds. Zones read it on every
// operation; tests inject their own to control time.
type Clock func() int64

// SystemClock reads the wall clock. It is the clock of production zones.
//
// It is called on every hit, and time.Now, which reads both the wall and
// the monotonic clock, costs about half of a hit. So SystemClock reads
// only the monotonic clock, added to a wall-clock reading that it renews
// every rebaseInterval: a wall clock that is stepped (NTP slewing moves
// both clocks alike) is followed within that time.
func SystemClock() int64 {
	b := clockBase.Load()
	since := time.Since(b.mono) // monotonic only: b.mono has a reading
	if since < 0 || since >= rebaseInterval {
		return rebase()
	}
	return b.wall + int64(since)
}

// rebaseInterval is how often SystemClock reads the wall clock again.
const rebaseInterval = time.Second

// wallBase is a time.Now reading: the monotonic clock and the wall clock
// at one instant.
type wallBase struct {
	mono time.Time
	wall int64
}

var clockBase atomic.Pointer[wallBase]

func init() { rebase() }

// rebase reads time.Now, makes it SystemClock's base, and returns it.
func rebase() int64 {
	now := time.Now()
	b := &wallBase{mono: now, wall: now.UnixNano()}
	clockBase.Store(b)
	return b.wall
}
