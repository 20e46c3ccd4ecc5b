package strategy

import (
	"fmt"
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// The rules of input that every store of this module applies (memory,
// Redis and PostgreSQL), so that input one store refuses the others refuse
// too, and a config that works on one works on all. A third-party store
// may apply them as well.

// Limits of a Hit's input.
const (
	// MaxHitWindows is the most windows one Hit takes: a hit runs as one
	// atomic step in the store (one Redis script, one SQL function call),
	// so its size stays bounded.
	MaxHitWindows = 16

	// MaxIDLen is the most bytes of a hit's ID, which a store keeps, with
	// the namespace, in a record of its own (a Redis key, a table row).
	MaxIDLen = 256
)

// How long a store keeps the record of an ID (a Redis marker key, a
// memory marker, a table row) that makes the hit ID rule of Hitter hold.
// A batch's record lives as long as the counters it wrote, and a hit's as
// long as its counters, within these bounds.
const (
	// MinBatchIDLife is the shortest life of a batch's record, so that a
	// prompt retry is recognised even for the shortest windows.
	MinBatchIDLife = 5 * time.Second

	// MinHitIDLife is the shortest life of a hit's record, so that the
	// batch that carries a failed hit's diffs finds it: a minute covers
	// any prompt retry of a short window's hit.
	MinHitIDLife = time.Minute

	// MaxHitIDLife is the longest life of a hit's record, so that one
	// record per synchronous hit does not fill the store with long
	// windows. A caller retries a failed hit as soon as the store answers
	// again, well within it; a retry that comes later still, for a hit that
	// was applied although its reply was lost, counts it twice, which errs
	// towards limiting.
	MaxHitIDLife = 2 * time.Minute
)

// ErrInvalidWindow is wrapped by the errors of CheckSize, CheckWindow and
// CheckHit for a window the stores do not take: a size that is not a
// positive whole number of milliseconds (as Redis keys and PostgreSQL
// columns hold them), or a start that is not a multiple of the size. It
// wraps ErrRejected, as such a request can never succeed, so callers drop
// it rather than retry.
var ErrInvalidWindow = fmt.Errorf("invalid window: %w", ErrRejected)

// CheckSize checks a window size: a positive whole number of milliseconds.
// The error names the size and wraps ErrInvalidWindow.
func CheckSize(size time.Duration) error {
	if size <= 0 || size%time.Millisecond != 0 {
		return fmt.Errorf("%w: size %v is not a positive whole number of milliseconds", ErrInvalidWindow, size)
	}
	return nil
}

// CheckSizes checks every size of a fetch or a reset as CheckSize does;
// the error names the first bad one by its index.
func CheckSizes(sizes []time.Duration) error {
	for j, size := range sizes {
		if err := CheckSize(size); err != nil {
			return fmt.Errorf("sizes[%d]: %w", j, err)
		}
	}
	return nil
}

// CheckWindow checks a window's size, as CheckSize does, and its start
// (Unix nanoseconds): a multiple of the size, or for a calendar window
// (window.CalendarSize) the start of a period. The error names the size
// or the start and wraps ErrInvalidWindow.
func CheckWindow(size time.Duration, start int64) error {
	if err := CheckSize(size); err != nil {
		return err
	}
	if window.Start(start, size) != start {
		return fmt.Errorf("%w: start %d is not a multiple of size %v", ErrInvalidWindow, start, size)
	}
	return nil
}

// CheckHit checks the input of a Hit: 1 to MaxHitWindows windows, an id
// of at most MaxIDLen bytes, and windows valid for CheckWindow, each with
// a finite Value, a Weight in [0, 1] and a Max that is not NaN (an
// infinite Max is a limit: +Inf never rejects, -Inf always does). The
// error names the field, and the index of the window, at fault, and wraps
// ErrRejected (ErrInvalidWindow for a bad window).
func CheckHit(id string, windows []WindowHit) error {
	if n := len(windows); n == 0 || n > MaxHitWindows {
		return fmt.Errorf("%w: a hit takes 1 to %d windows, got %d", ErrRejected, MaxHitWindows, n)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: the hit's ID has %d bytes, more than %d", ErrRejected, len(id), MaxIDLen)
	}
	for i := range windows {
		w := &windows[i]
		if err := CheckWindow(w.Size, w.Start); err != nil {
			return fmt.Errorf("windows[%d]: %w", i, err)
		}
		if math.IsNaN(w.Value) || math.IsInf(w.Value, 0) {
			return fmt.Errorf("%w: windows[%d]: value %v is not a finite number", ErrRejected, i, w.Value)
		}
		if !(w.Weight >= 0 && w.Weight <= 1) { // NaN too
			return fmt.Errorf("%w: windows[%d]: weight %v is not in [0, 1]", ErrRejected, i, w.Weight)
		}
		if math.IsNaN(w.Max) {
			return fmt.Errorf("%w: windows[%d]: max is NaN", ErrRejected, i)
		}
	}
	return nil
}
