// Package window is the in-memory engine of the rate limiter: sliding-window
// arithmetic and a bounded, concurrent counter zone. It imports nothing from
// Caddy, so it can be tested and benchmarked on its own.
//
// A window of size S starts at floor(now/S)*S in Unix time. The sliding rate
// of a key is
//
//	rate = current + previous * (S - now mod S) / S
//
// where current and previous are the counts of the window holding now and of
// the one before it. A fixed window gives the previous window the weight 0,
// and so does a calendar window (see CalendarSize), which starts at a
// calendar's boundary instead.
package window

import (
	"fmt"
	"time"
)

// ValidateSize reports whether size can be a window size: it must be positive.
func ValidateSize(size time.Duration) error {
	if size <= 0 {
		return fmt.Errorf("window size must be positive, got %v", size)
	}
	return nil
}

// Start returns the start, in Unix nanoseconds, of the window of the given
// size that holds now (also in Unix nanoseconds).
func Start(now int64, size time.Duration) int64 {
	return frameAt(now, int64(size)).start
}

// Weight returns the weight of the previous window at now:
// (S - now mod S) / S, at nanosecond precision; 0 for a calendar window.
func Weight(now int64, size time.Duration) float64 {
	return frameAt(now, int64(size)).w
}

// frame is where an instant falls among the windows of a size: in window
// k, which starts at start (k*size but for a calendar's; flooring, so that
// times before the epoch fall in the right window too) and ends at end; w
// is the weight of the window before it then (0 for a calendar's). A zone
// operation places the instant once per limit, and its samples read the
// frame. It has four fields, so that the compiler keeps it in registers.
// frameAt is too large to inline, so the hot path of every hit
// (shard.window) spells it out, for a window of fixed size to pay for
// calendars one comparison and no call.
type frame struct {
	k, start, end int64
	w             float64
}

// frameAt returns the frame of now among the windows of a size.
func frameAt(now, size int64) frame {
	if size >= minCode {
		return longFrame(now, size)
	}
	return fixedFrame(now, size)
}

// longFrame is frameAt for sizes that may be calendars'.
func longFrame(now, size int64) frame {
	if c := calendarOf(size); c != nil {
		p := c.place(now)
		return frame{k: p.k, start: p.start, end: p.end}
	}
	return fixedFrame(now, size)
}

// fixedFrame is frameAt for a window of fixed size.
func fixedFrame(now, size int64) frame {
	k, r := now/size, now%size
	if r < 0 {
		k, r = k-1, r+size
	}
	start := k * size
	return frame{k: k, start: start, end: start + size, w: float64(size-r) / float64(size)}
}

// Sample is the state of one key's window at one instant, as a zone or a
// store sees it.
type Sample struct {
	// Current is the count of the window holding the instant.
	Current float64
	// Previous is the count of the window before it.
	Previous float64
	// Weight is the weight of the previous window at the instant, in [0, 1].
	Weight float64
	// Start is the start of the current window, in Unix nanoseconds.
	Start int64
	// Size is the window size.
	Size time.Duration
	// At is the instant the sample describes, in Unix nanoseconds: the
	// zone's clock when it was taken. Waits computed from the sample
	// (Until) start there, so a caller needs no second clock reading.
	At int64
}

// Length returns the length of the sample's window: its Size, or for a
// calendar window its period's.
func (s Sample) Length() time.Duration {
	return time.Duration(End(s.Start, s.Size) - s.Start)
}

// Sliding returns the sliding rate: Current + Previous*Weight.
func (s Sample) Sliding() float64 { return s.Current + s.Previous*s.Weight }

// Rate returns the sliding rate, or only the current count when fixed is true.
func (s Sample) Rate(fixed bool) float64 {
	if fixed {
		return s.Current
	}
	return s.Sliding()
}

// Diff is a change to one counter that a zone has not yet pushed to a store,
// or that a store should apply: Value added to Key's window of Size that
// starts at Start (Unix nanoseconds).
type Diff struct {
	// Key is the client key, any bytes.
	Key string
	// Size is the window size.
	Size time.Duration
	// Start is the window's start, in Unix nanoseconds.
	Start int64
	// Value is the change, fractional or negative.
	Value float64
	// Limit is the smallest limit (Max) this node checked the window's
	// hits against since it last took the window's diff, or 0 when none
	// was finite and above 0 (an Increment, a rate's turn). A store that
	// tells the fleet which keys come near their limits (strategy.NearFeed)
	// compares the window's count with it.
	Limit float64
	// Previous is this node's count of the window before, for a diff of
	// a key's newest window (0 for others): what the node last fetched of
	// the store's count, plus its own hits since, so never more than the
	// store holds once the node pushed. A NearFeed reads it to skip a mark
	// that the window before already made (strategy.NearAt).
	Previous float64
}

// Count is a counter's total as a store reports it: the count of Key's window
// of Size that starts at Start (Unix nanoseconds).
type Count struct {
	// Key is the client key, any bytes.
	Key string
	// Size is the window size.
	Size time.Duration
	// Start is the window's start, in Unix nanoseconds.
	Start int64
	// Value is the store's total for the window.
	Value float64
}
