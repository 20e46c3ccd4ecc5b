// Package fakeclock is a clock that tests move by hand, for the zones of
// package window (UnixNano is a window.Clock) and for stores that date
// what they write by a now func (Now). It is safe for concurrent use.
package fakeclock

import (
	"sync/atomic"
	"time"
)

// Clock is a time that moves only when a test sets or advances it.
type Clock struct{ ns atomic.Int64 }

// New returns a clock that reads t.
func New(t time.Time) *Clock {
	c := new(Clock)
	c.Set(t)
	return c
}

// UnixNano returns the clock's time in Unix nanoseconds.
func (c *Clock) UnixNano() int64 { return c.ns.Load() }

// Now returns the clock's time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
