package window

import (
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
)

func mustLoad(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func mustCalendar(t testing.TB, unit Unit, loc *time.Location) time.Duration {
	t.Helper()
	size, err := CalendarSize(unit, loc)
	if err != nil {
		t.Fatal(err)
	}
	return size
}

// TestCalendarPeriods places instants around boundaries and DST changes
// in the periods a calendar on the wall would.
func TestCalendarPeriods(t *testing.T) {
	ny := mustLoad(t, "America/New_York")
	at := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04:05", s, ny)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		unit       Unit
		now        time.Time
		start, end time.Time
	}{
		// November 2026 holds the end of DST (1 November, 02:00): 30 days and an hour.
		{Month, at("2026-11-15 12:00:00"), at("2026-11-01 00:00:00"), at("2026-12-01 00:00:00")},
		{Month, at("2026-11-01 00:00:00"), at("2026-11-01 00:00:00"), at("2026-12-01 00:00:00")},
		{Month, at("2026-10-31 23:59:59"), at("2026-10-01 00:00:00"), at("2026-11-01 00:00:00")},
		{Month, at("2026-12-31 23:59:59"), at("2026-12-01 00:00:00"), at("2027-01-01 00:00:00")},
		{Month, at("1969-12-31 23:00:00"), at("1969-12-01 00:00:00"), at("1970-01-01 00:00:00")},
		// The day DST ends has 25 hours; the day it starts, 23.
		{Day, at("2026-11-01 23:30:00"), at("2026-11-01 00:00:00"), at("2026-11-02 00:00:00")},
		{Day, at("2026-03-08 12:00:00"), at("2026-03-08 00:00:00"), at("2026-03-09 00:00:00")},
		// Weeks start on Monday: 2026-11-30 is one.
		{Week, at("2026-12-02 08:00:00"), at("2026-11-30 00:00:00"), at("2026-12-07 00:00:00")},
		{Week, at("2026-11-29 23:59:59"), at("2026-11-23 00:00:00"), at("2026-11-30 00:00:00")},
		{Week, at("1970-01-01 00:00:00"), at("1969-12-29 00:00:00"), at("1970-01-05 00:00:00")},
	} {
		size := mustCalendar(t, tc.unit, ny)
		now := tc.now.UnixNano()
		start := Start(now, size)
		if start != tc.start.UnixNano() {
			t.Errorf("%s at %v: start %v, want %v", tc.unit, tc.now, time.Unix(0, start).In(ny), tc.start)
		}
		if end := End(start, size); end != tc.end.UnixNano() {
			t.Errorf("%s at %v: end %v, want %v", tc.unit, tc.now, time.Unix(0, end).In(ny), tc.end)
		}
		if w := Weight(now, size); w != 0 {
			t.Errorf("%s at %v: the previous period weighs %v, want 0", tc.unit, tc.now, w)
		}
		if k, next := Index(now, size), Index(tc.end.UnixNano(), size); next != k+1 {
			t.Errorf("%s at %v: period %d, the next %d", tc.unit, tc.now, k, next)
		}
	}
	if got := (Sample{Start: at("2026-11-01 00:00:00").UnixNano(), Size: mustCalendar(t, Month, ny)}).Length(); got != 30*24*time.Hour+time.Hour {
		t.Errorf("November 2026 in New York lasts %v, want 721h", got)
	}
}

// TestCalendarPeriodsEveryDay walks two years of days, weeks and months in
// zones with DST changes at midnight and at 02:00 and in one without:
// every instant's period holds it, and periods follow each other without
// gaps (a day a zone skipped is an empty period).
func TestCalendarPeriodsEveryDay(t *testing.T) {
	for _, name := range []string{"UTC", "America/New_York", "America/Havana", "Australia/Lord_Howe", "Pacific/Apia"} {
		loc := mustLoad(t, name)
		for _, unit := range []Unit{Day, Week, Month} {
			size := mustCalendar(t, unit, loc)
			from := time.Date(2011, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
			prevK, prevEnd := Index(from, size)-1, Start(from, size)
			for now := from; now < from+int64(2*366*24*time.Hour); now += int64(time.Hour) {
				k, start := Index(now, size), Start(now, size)
				end := End(start, size)
				if now < start || now >= end {
					t.Fatalf("%s %s: %v is not in its period [%v, %v)", name, unit, time.Unix(0, now), time.Unix(0, start), time.Unix(0, end))
				}
				if k != prevK { // Apia skipped 30 December 2011: an empty period
					if k < prevK || start != prevEnd {
						t.Fatalf("%s %s: period %d at %v follows %d ending at %v", name, unit, k, time.Unix(0, start), prevK, time.Unix(0, prevEnd))
					}
					prevK, prevEnd = k, end
				}
			}
		}
	}
}

// TestCalendarCodes checks that the codes are whole milliseconds above
// the unit's longest period, stable, and apart for every zone this
// machine knows.
func TestCalendarCodes(t *testing.T) {
	ny := mustLoad(t, "America/New_York")
	if a, b := mustCalendar(t, Month, ny), mustCalendar(t, Month, mustLoad(t, "America/New_York")); a != b {
		t.Errorf("the same zone has two codes: %v and %v", a, b)
	}
	if _, err := CalendarSize(Month, time.Local); err == nil {
		t.Error("the machine's local zone was taken")
	}
	var names []string
	root := "/usr/share/zoneinfo"
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name, _ := filepath.Rel(root, path)
		if strings.HasPrefix(name, "posix/") || strings.HasPrefix(name, "right/") {
			return nil
		}
		if _, err := time.LoadLocation(name); err == nil {
			names = append(names, name)
		}
		return nil
	})
	if err != nil || len(names) < 300 {
		t.Fatalf("listing the zones: %v (%d found)", err, len(names))
	}
	for _, unit := range []Unit{Day, Week, Month} {
		seen := map[int64]string{}
		for _, name := range names {
			code := calendarCode(unit, name)
			if other, ok := seen[code]; ok {
				t.Errorf("%s windows of %s and %s have the same code", unit, other, name)
			}
			seen[code] = name
			if code%int64(time.Millisecond) != 0 || code < codeBase[unit] || code >= codeBase[unit]+codeSpan {
				t.Errorf("%s windows of %s: code %v out of its range", unit, name, time.Duration(code))
			}
		}
	}
}

// TestCalendarZone counts a monthly quota of 100 on a zone whose clock
// crosses the end of the month and of DST in New York: 100 admitted in
// each month, the count restarting at local midnight of the 1st, and the
// wait of a rejected hit ending there.
func TestCalendarZone(t *testing.T) {
	ny := mustLoad(t, "America/New_York")
	size := mustCalendar(t, Month, ny)
	clock := fakeclock.New(time.Date(2026, 10, 31, 12, 0, 0, 0, ny))
	z, err := NewZone(100, clock.UnixNano)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := z.Namespace("quota")
	limits := []Limit{{Size: 10 * time.Minute, Max: 1e9}, {Size: size, Max: 100}}
	out := make([]Sample, 2)
	admit := func() int {
		admitted := 0
		for range 150 {
			if n.Hit("k", limits, 1, false, true, false, out) < 0 {
				admitted++
			}
		}
		return admitted
	}
	for _, month := range []struct {
		at   time.Time
		next time.Time
	}{
		{time.Date(2026, 10, 31, 12, 0, 0, 0, ny), time.Date(2026, 11, 1, 0, 0, 0, 0, ny)},
		{time.Date(2026, 11, 1, 0, 0, 0, 0, ny), time.Date(2026, 12, 1, 0, 0, 0, 0, ny)},
		{time.Date(2026, 11, 30, 23, 59, 59, 0, ny), time.Date(2026, 12, 1, 0, 0, 0, 0, ny)},
	} {
		clock.Set(month.at)
		got := admit()
		want := 100
		if month.at.Day() == 30 { // the same month as the row before
			want = 0
		}
		if got != want {
			t.Errorf("at %v: %d admitted, want %d", month.at, got, want)
		}
		s := out[1]
		if s.Current != 100 || s.Previous*s.Weight != 0 {
			t.Errorf("at %v: count %v, previous %v x %v", month.at, s.Current, s.Previous, s.Weight)
		}
		if wait, want := s.Until(99, clock.UnixNano(), false), month.next.Sub(month.at); wait != want {
			t.Errorf("at %v: wait %v, want %v", month.at, wait, want)
		}
		clock.Set(month.next.Add(-time.Nanosecond))
		if n.Hit("k", limits, 1, false, true, false, out) < 0 {
			t.Errorf("admitted a nanosecond before %v", month.next)
		}
	}
}
