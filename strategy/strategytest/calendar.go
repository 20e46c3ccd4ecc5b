package strategytest

import (
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// testCalendarWindows checks windows whose size stands for a calendar's
// periods (window.CalendarSize), which start at local midnight of the
// 1st rather than at a multiple of the size: November in New York (next
// year's, which the store keeps whenever the test runs) is fetched
// anywhere in November, the end of daylight saving time included, and no
// longer once December has started there; a synchronous hit counts in
// the period the node names, beside a pushed diff.
func testCalendarWindows(t *testing.T, h Harness) {
	s, ctx, ns := h.open(t), testContext(t), unique("calendar")
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	month, err := window.CalendarSize(window.Month, ny)
	if err != nil {
		t.Fatal(err)
	}
	y := time.Now().Year() + 1
	nov := time.Date(y, 11, 1, 0, 0, 0, 0, ny)
	start := nov.UnixNano()
	push(t, ctx, s, ns, window.Diff{Key: "a", Size: month, Start: start, Value: 3})
	want := counts{{"a", month, start}: 3}
	for _, at := range []time.Time{nov, nov.Add(3 * time.Hour), time.Date(y, 11, 30, 23, 59, 59, 0, ny)} {
		assertCounts(t, "November at "+at.String(), fetch(t, ctx, s, ns, []string{"a"}, []time.Duration{month}, at), want)
	}
	dec := time.Date(y, 12, 1, 0, 0, 0, 0, ny)
	assertCounts(t, "December", fetch(t, ctx, s, ns, []string{"a"}, []time.Duration{month}, dec), counts{})

	hs, ok := s.(strategy.Hitter)
	if !ok {
		return
	}
	got, rejected, err := hs.Hit(ctx, ns, "a", newID(), []strategy.WindowHit{{Size: month, Start: start, Value: 1, Max: 4}}, true)
	if err != nil || rejected != -1 || len(got) != 1 || got[0].Current != 4 {
		t.Fatalf("a hit of November: counts %v, rejected %d, %v; want 4 admitted", got, rejected, err)
	}
	if _, rejected, err = hs.Hit(ctx, ns, "a", newID(), []strategy.WindowHit{{Size: month, Start: start, Value: 1, Max: 4}}, true); err != nil || rejected != 0 {
		t.Fatalf("a fifth hit of November against 4: rejected %d, %v; want rejected by window 0", rejected, err)
	}
	assertCounts(t, "November after the hits", fetch(t, ctx, s, ns, []string{"a"}, []time.Duration{month}, nov), counts{{"a", month, start}: 4})
}
