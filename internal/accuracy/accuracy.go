// Package accuracy is the accuracy harness: it measures how closely a
// fleet of Caddy nodes sharing a real store keeps a rate limit, and what
// that costs the store and the requests.
//
// For each row (a traffic pattern, a sync_rate, a sync_above and a store)
// it starts N Caddy processes on loopback, each with a namespace on the
// store and a fixed-window limit, sends them requests round-robin at
// scheduled times (open loop), and reports the worst window's admitted /
// limit, the store commands per 1,000 requests and the latency the limiter
// adds. Its tests start the stores (internal/redistest, internal/pgtest):
// TestAccuracyQuick runs a few rows in every go test run, and
// TestAccuracyFull, run by scripts/bench-accuracy.sh, the whole table,
// which it prints as the Markdown of docs/accuracy.md and can write into
// that page (between its markers), with its plots. The spread clients'
// family (spread.go) measures slow clients spread over the fleet against
// sliding limits; TestAccuracyQuickSpread is its quick subset.
package accuracy

import (
	"fmt"
	"strings"
	"time"
)

// Pattern is a traffic pattern: what requests go where, and when.
type Pattern struct {
	// Name identifies the pattern in tables and file names.
	Name string
	// Label describes it in the table.
	Label string
	// Rate is the requests per second sent, as a multiple of the limit's
	// rate (limit per window).
	Rate float64
	// Start is when the traffic starts, after the first window's start:
	// 0 aligns it with a window.
	Start time.Duration
	// Length is how long the traffic lasts; 0 means the run's duration.
	Length time.Duration
	// Keys is the number of client keys; 1 for one key. With more, their
	// popularity follows a Zipf law of exponent ZipfS, or with Flood each
	// request has a key of its own (Keys is then the most requests a run
	// can send, a ceiling).
	Keys  int
	ZipfS float64
	Flood bool
	// LimitDiv divides the run's limit for this pattern's route: the many
	// keys pattern uses a smaller per-key limit, so that its hottest keys
	// go over it while the rest stay far below.
	LimitDiv float64
	// Units, when set, makes the limit a budget charged from the
	// response (response_cost): each response reports 1 to Units units,
	// drawn at random, Rate is a multiple of the limit in units, and a
	// window's admitted count is the units its admitted requests cost.
	Units int
}

// MeanUnits is what a request of the pattern costs on average: 1, or the
// mean of 1 to Units.
func (p Pattern) MeanUnits() float64 {
	if p.Units <= 0 {
		return 1
	}
	return float64(p.Units+1) / 2
}

// The traffic patterns of the table. Every limited request goes to the
// next node in turn (round-robin), whatever its key.
var (
	Steady1x = Pattern{Name: "steady1x", Label: "steady 1×", Rate: 1, Keys: 1}
	Steady2x = Pattern{Name: "steady2x", Label: "steady 2×", Rate: 2, Keys: 1}
	Steady5x = Pattern{Name: "steady5x", Label: "steady 5×", Rate: 5, Keys: 1}
	// Burst10x sends ten times the limit's rate for one second, starting
	// a quarter into a window: it overloads the end of one window and the
	// start of the next, two trials at different phases of the syncs.
	Burst10x = Pattern{Name: "burst10x", Label: "burst 10× for 1 s", Rate: 10, Keys: 1,
		Start: 250 * time.Millisecond, Length: time.Second}
	// ManyKeys spreads twice the limit's rate over 100 keys of Zipf
	// popularity, each limited to a fifth of the limit: the hottest key
	// gets about 2.3 times its limit, the second 1.1 times, the third 0.7
	// times, and the other 97 keys, 59 % of the traffic together, at most
	// half their limit each.
	ManyKeys = Pattern{Name: "zipf", Label: "100 keys, Zipf", Rate: 2, Keys: 100, ZipfS: 1.1, LimitDiv: 5}
	// KeyFlood sends twice the limit's rate, each request with a key never
	// seen before (limited to a fifth of the limit, as ManyKeys): what a
	// flood of new clients costs the store, each far from its limit.
	KeyFlood = Pattern{Name: "flood", Label: "a new key each request", Rate: 2, Keys: 1 << 17, Flood: true, LimitDiv: 5}
	// Budget2x sends twice the limit in units, each response reporting 1
	// to 10 units (response_cost): the limit is a budget charged after
	// the response, which the requests in flight when it runs out pass.
	Budget2x = Pattern{Name: "budget2x", Label: "budget 2×, 1–10 units a response", Rate: 2, Keys: 1, Units: 10}
)

// Patterns are all the patterns, in table order.
var Patterns = []Pattern{Steady1x, Steady2x, Steady5x, Burst10x, ManyKeys, KeyFlood, Budget2x}

// Row is one measurement: a pattern on a store with one sync setting.
type Row struct {
	Pattern Pattern
	// Store is the store's name, a key of the runner's stores.
	Store string
	// SyncRate is the namespace's sync_rate: 0 is synchronous, more is
	// periodic.
	SyncRate time.Duration
	// SyncAbove is the namespace's sync_above, 0 for none.
	SyncAbove float64
}

// Periodic reports whether the row's namespace syncs on a timer.
func (r Row) Periodic() bool { return r.SyncRate > 0 }

// SyncRateString is the row's sync_rate as a config writes it.
func (r Row) SyncRateString() string {
	if r.SyncRate == 0 {
		return "0"
	}
	return r.SyncRate.String()
}

// SyncAboveString is the row's sync_above, or "off".
func (r Row) SyncAboveString() string {
	if r.SyncAbove == 0 {
		return "off"
	}
	return fmt.Sprintf("%g", r.SyncAbove)
}

// ID names the row in file names, logs and keys: letters, digits and
// dashes only.
func (r Row) ID() string {
	above := "off"
	if r.SyncAbove > 0 {
		above = strings.ReplaceAll(fmt.Sprintf("%g", r.SyncAbove), ".", "")
	}
	return fmt.Sprintf("%s-%s-sync%s-above%s", r.Store, r.Pattern.Name, r.SyncRateString(), above)
}

// String describes the row for logs.
func (r Row) String() string {
	return fmt.Sprintf("%s, %s, sync_rate %s, sync_above %s", r.Store, r.Pattern.Label, r.SyncRateString(), r.SyncAboveString())
}

// SyncRates are the periodic sync rates of the full table.
var SyncRates = []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second}

// SyncAboves are the sync_above settings of the full table; 0 is off.
var SyncAboves = []float64{0, 0.8, 0.9}

// FullPlan returns every row of the table for the given stores: each
// pattern synchronously (the reference), then at each periodic sync_rate
// with each sync_above. With aboveOK false (a plugin without sync_above),
// the sync_above rows are left out.
func FullPlan(stores []string, aboveOK bool) []Row {
	var rows []Row
	for _, store := range stores {
		for _, p := range Patterns {
			rows = append(rows, Row{Pattern: p, Store: store, SyncRate: 0})
			for _, rate := range SyncRates {
				for _, above := range SyncAboves {
					if above > 0 && !aboveOK {
						continue
					}
					rows = append(rows, Row{Pattern: p, Store: store, SyncRate: rate, SyncAbove: above})
				}
			}
		}
	}
	return rows
}
