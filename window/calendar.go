package window

import (
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Calendar windows are fixed windows that start at a calendar's
// boundaries: local midnight, Monday's midnight, or the 1st of the month at
// midnight, in a time zone. Their periods differ in length (a month has 28
// to 31 days, a day 23 to 25 hours across a DST change), so the arithmetic
// of fixed-size windows cannot place them. Everything else about a window
// (counts, diffs, stores' keys and expiries) only needs a size that names
// it and a start, so a calendar window gets a size too: a code that
// CalendarSize makes and registers, a whole number of milliseconds a
// little over the unit's longest period. The code is the same on every
// node for the same unit and zone name, so a fleet shares its counters,
// and a store that expires a window at its start plus twice its size
// keeps a period's counter past its end. Its previous window weighs
// nothing: a calendar window is always fixed.

// Unit is the unit of a calendar window.
type Unit uint8

// The units of calendar windows.
const (
	Day   Unit = iota + 1 // from local midnight to the next
	Week                  // from Monday's local midnight to the next Monday's
	Month                 // from the 1st's local midnight to the next month's
)

var unitNames = [...]string{Day: "day", Week: "week", Month: "month"}

// ParseUnit returns the unit named day, week or month.
func ParseUnit(name string) (Unit, bool) {
	if i := slices.Index(unitNames[:], name); i > 0 {
		return Unit(i), true
	}
	return 0, false
}

// String returns the unit's name: day, week or month.
func (u Unit) String() string {
	if u >= Day && u <= Month {
		return unitNames[u]
	}
	return fmt.Sprintf("Unit(%d)", u)
}

// codeBase is the smallest code of each unit: its longest period (a day,
// week or month that a DST change or a zone's change of offset lengthens
// by up to 3 hours). Codes of a unit lie in [codeBase, codeBase+codeSpan),
// ranges that do not overlap.
var codeBase = [...]int64{
	Day:   minCode,
	Week:  int64(7*24*time.Hour + 3*time.Hour),
	Month: int64(31*24*time.Hour + 3*time.Hour),
}

// codeSpan is the width of a unit's codes: 2^24 milliseconds (about 4.7
// hours), in which a hash of the zone's name places each zone's code.
const codeSpan = int64(1<<24) * int64(time.Millisecond)

// minCode is the smallest code: sizes under it are never looked up, so
// that windows of fixed sizes pay one comparison for calendars.
const minCode = int64(27 * time.Hour)

// calendar is a registered calendar window.
type calendar struct {
	unit Unit
	loc  *time.Location
	size int64 // its code

	// The period last placed: most calls fall in it.
	last atomic.Pointer[period]
}

// period is the k-th period of a calendar, [start, end) in Unix
// nanoseconds.
type period struct{ k, start, end int64 }

var (
	calendarsMu sync.Mutex                          // serializes registrations
	calendars   atomic.Pointer[map[int64]*calendar] // by code; copied on write
)

// CalendarSize returns the window size that stands for the calendar
// windows of unit in loc, registering it. loc must be a named zone that
// every node resolves the same way (not Local). Besides an unknown unit
// or such a zone, it fails only when another zone's windows of the same
// unit have the same code, which a test of every IANA name rules out.
func CalendarSize(unit Unit, loc *time.Location) (time.Duration, error) {
	if unit < Day || unit > Month {
		return 0, fmt.Errorf("window: unknown calendar unit %d", unit)
	}
	if loc == nil || loc == time.Local || loc.String() == "Local" {
		return 0, fmt.Errorf("window: a calendar window needs a named time zone, not the machine's local one")
	}
	size := calendarCode(unit, loc.String())
	calendarsMu.Lock()
	defer calendarsMu.Unlock()
	m := map[int64]*calendar{}
	if old := calendars.Load(); old != nil {
		m = maps.Clone(*old)
	}
	if c := m[size]; c != nil {
		if c.loc.String() != loc.String() {
			return 0, fmt.Errorf("window: the %s windows of time zones %s and %s have the same code", unit, c.loc, loc)
		}
		return time.Duration(size), nil
	}
	m[size] = &calendar{unit: unit, loc: loc, size: size}
	calendars.Store(&m)
	return time.Duration(size), nil
}

// calendarCode is the code of unit's windows in the zone named name.
func calendarCode(unit Unit, name string) int64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	ms := int64(h.Sum32()) % (codeSpan / int64(time.Millisecond))
	return codeBase[unit] + ms*int64(time.Millisecond)
}

// calendarOf returns the calendar of a window size, or nil for a size of
// fixed length.
func calendarOf(size int64) *calendar {
	if size < minCode {
		return nil
	}
	if m := calendars.Load(); m != nil {
		return (*m)[size]
	}
	return nil
}

// IsCalendar reports whether size stands for calendar windows.
func IsCalendar(size time.Duration) bool { return calendarOf(int64(size)) != nil }

// CalendarOf returns the unit and zone of a calendar window size, and
// false for a size of fixed length.
func CalendarOf(size time.Duration) (Unit, *time.Location, bool) {
	c := calendarOf(int64(size))
	if c == nil {
		return 0, nil, false
	}
	return c.unit, c.loc, true
}

// bound returns the start of period k, in Unix nanoseconds: period 0 is
// the one holding the first instant of 1970 in local time.
func (c *calendar) bound(k int64) int64 {
	var t time.Time
	switch c.unit {
	case Day:
		t = time.Date(1970, 1, 1+int(k), 0, 0, 0, 0, c.loc)
	case Week: // 1970-01-01 was a Thursday; week 0 starts on the Monday before
		t = time.Date(1970, 1, 1+7*int(k)-3, 0, 0, 0, 0, c.loc)
	default:
		t = time.Date(1970, 1+time.Month(k), 1, 0, 0, 0, 0, c.loc)
	}
	return t.UnixNano()
}

// guess returns the number of the period holding now by its local date.
// A local midnight that a DST change skips can move a boundary off the
// date, which place corrects.
func (c *calendar) guess(now int64) int64 {
	y, m, d := time.Unix(0, now).In(c.loc).Date()
	days := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
	switch c.unit {
	case Month:
		return int64(y-1970)*12 + int64(m) - 1
	case Day:
		return days
	}
	// Weeks start on Monday, three days before the epoch: floor division
	// is fixedFrame's.
	return fixedFrame(days+3, 7).k
}

// place returns the period holding now: the k whose bounds hold it.
func (c *calendar) place(now int64) *period {
	if p := c.last.Load(); p != nil && p.start <= now && now < p.end {
		return p
	}
	k := c.guess(now)
	for c.bound(k) > now {
		k--
	}
	for c.bound(k+1) <= now {
		k++
	}
	p := &period{k: k, start: c.bound(k), end: c.bound(k + 1)}
	c.last.Store(p)
	return p
}

// startOf returns the start of window k of a size.
func startOf(k, size int64) int64 {
	if c := calendarOf(size); c != nil {
		if p := c.last.Load(); p != nil && p.k == k {
			return p.start
		}
		return c.bound(k)
	}
	return k * size
}

// End returns the end, in Unix nanoseconds, of the window of the given
// size that starts at start.
func End(start int64, size time.Duration) int64 {
	if c := calendarOf(int64(size)); c != nil {
		return c.place(start).end
	}
	return start + int64(size)
}

// Index returns the number of the window of the given size that holds t
// (Unix nanoseconds): consecutive windows have consecutive numbers.
func Index(t int64, size time.Duration) int64 {
	return frameAt(t, int64(size)).k
}
