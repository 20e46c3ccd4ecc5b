package syncapp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/fakeclock"
	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/window"
)

// TestFleetCalendarMonth runs a monthly quota of 100 per key in New York
// on three nodes sharing a store, on a test clock that crosses the end of
// October, the end of DST (the first Sunday of November) and the end of
// November: each month admits exactly 100 of the 150 requests spread
// over the nodes, the count restarts at local midnight of the 1st (an
// hour later in UTC in December than in November), and the store holds
// each month's tries. At sync_rate 0, and at 100ms with sync_above 0.8,
// each node syncing after every 9 requests of the fleet (fewer than the
// 20 the rest of the quota leaves), the bound within which the fleet is
// exact.
func TestFleetCalendarMonth(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	size, err := window.CalendarSize(window.Month, ny)
	if err != nil {
		t.Fatal(err)
	}
	// Next year's, so that the store keeps what the test writes whenever
	// it runs.
	y := time.Now().Year() + 1
	local := func(m time.Month, d, h int) time.Time { return time.Date(y, m, d, h, 0, 0, 0, ny) }
	const limit, tries = 100, 150
	limits := []Limit{{Size: size, Max: limit}}
	eachStore(t, func(t *testing.T, s fleetStore) {
		for _, mode := range []struct{ name, cfg string }{
			{"sync_rate 0", s.config("0")},
			{"sync_rate 100ms sync_above 0.8", fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": "100ms", "sync_above": 0.8, "strategy": %s}}}`, s.strategy)},
		} {
			t.Run(mode.name, func(t *testing.T) {
				clock := fakeclock.New(local(10, 31, 12))
				ctx := context.Background()
				var nodes []*Namespace
				for range 3 {
					n, err := provisionAt(t, caddy.NewUsagePool(), mode.cfg, clock.UnixNano)
					if err != nil {
						t.Fatal(err)
					}
					if err := n.app.Start(); err != nil {
						t.Fatal(err)
					}
					ns := n.ns("api")
					neverStall(ns.road.hits)
					if err := ns.AddWindowSizes(size); err != nil {
						t.Fatal(err)
					}
					nodes = append(nodes, ns)
				}
				for _, ns := range nodes { // connected before counting
					ns.Increment(ctx, "warm-up", size, 1)
					poll.Until(t, 5*time.Second, "the store to be in use", func() bool { return ns.Sync(ctx) == nil && !ns.health.down() })
				}
				key := "client-" + mode.name
				out := make([]window.Sample, 1)
				syncAll := func() {
					for _, ns := range nodes {
						if err := ns.Sync(ctx); err != nil {
							t.Fatal(err)
						}
					}
				}
				// hit sends one request through node i and reports whether
				// the fleet admitted it.
				hit := func(i int) bool {
					return nodes[i%3].Hit(ctx, key, limits, 1, false, true, out) < 0
				}
				spend := func(at time.Time) int {
					clock.Set(at)
					admitted := 0
					for i := range tries {
						if i%9 == 0 {
							syncAll()
						}
						if hit(i) {
							admitted++
						}
						clock.Advance(time.Second)
					}
					syncAll()
					return admitted
				}
				for _, month := range []struct {
					spendAt   time.Time
					start     time.Time // of the month spent
					lastLocal time.Time // a minute before the next month, local time
				}{
					{local(10, 31, 12), local(10, 1, 0), local(10, 31, 23).Add(59 * time.Minute)},
					{local(11, 15, 12), local(11, 1, 0), local(11, 30, 23).Add(59 * time.Minute)},
				} {
					if got := spend(month.spendAt); got != limit {
						t.Errorf("%s: admitted %d of %d, want exactly %d", month.spendAt.Format("January"), got, tries, limit)
					}
					if got := s.totalAt(t, key, size, month.spendAt); got != limit {
						t.Errorf("%s: the store counts %v, want %d (rejections undone)", month.spendAt.Format("January"), got, limit)
					}
					// Still this month a minute before local midnight (in
					// UTC, November ends an hour later than October).
					clock.Set(month.lastLocal)
					for i := range 3 {
						if hit(i) {
							t.Errorf("admitted at %v, before the month's end", month.lastLocal)
						}
					}
					if s := out[0]; s.Start != month.start.UnixNano() || s.Current != limit {
						t.Errorf("at %v: the period starts at %v with %v, want %v with %d", month.lastLocal, time.Unix(0, s.Start).In(ny), s.Current, month.start, limit)
					}
					syncAll()
				}
				// December: the count restarts at local midnight.
				clock.Set(local(12, 1, 0))
				for i := range 3 {
					if !hit(i) {
						t.Errorf("rejected at %v, the first instant of December", local(12, 1, 0))
					}
				}
			})
		}
	})
}
