package accuracy

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/ratesync/caddy-ratelimit/window"
)

// The spread clients' family measures the promise for every key however
// it spreads (SPEC, "Every key, however it spreads"): slow clients, such
// as those of a login page, whose requests a balancer spreads over the
// fleet so that each node sees a client seldom.
//
// Each client first spends most of its quota quickly (its limit − 2
// requests, SpreadFastGap apart), then sends SpreadTail more at its
// spacing (the last two of its quota and three that should be refused),
// each request to the next node in turn (round-robin) or to a node drawn
// at random. A row is SpreadClients such clients of one spacing,
// distribution and limit; the rows of one store, fleet size and sync
// setting run at once on one fleet, with keys of their own and one route
// per limit.
//
// The limits are sliding windows, as users configure them. A sliding
// window weighs the previous window's count in the rate, so a single node
// admits more than the limit over a run that crosses a window's start
// (the previous window's hits fade). So each client's run is placed
// within one window (1m or 1h, starting at a multiple of its size in Unix
// time, as the plugin's windows do), and its keys are new: then the
// sliding rate is the window's count, and one node admits exactly the
// limit, as at sync_rate 0.

// SpreadLimit is a limit of the family: Count per Window, sliding.
type SpreadLimit struct {
	Count  int
	Window time.Duration
}

// Name is the limit in row IDs: "5per1m".
func (l SpreadLimit) Name() string { return fmt.Sprintf("%dper%s", l.Count, shortDuration(l.Window)) }

// Label is the limit in tables: "5 / 1m".
func (l SpreadLimit) Label() string { return fmt.Sprintf("%d / %s", l.Count, shortDuration(l.Window)) }

// Path is the limit's route on the spread fleets' nodes.
func (l SpreadLimit) Path() string { return "/spread-" + l.Name() }

// The family's settings.
var (
	// SpreadNodes are its fleet sizes.
	SpreadNodes = []int{3, 6, 10}
	// SpreadEvery are its clients' spacings.
	SpreadEvery = []time.Duration{100 * time.Millisecond, time.Second, 10 * time.Second}
	// SpreadLimits are its limits: a login page's, and an hourly quota.
	SpreadLimits = []SpreadLimit{{5, time.Minute}, {100, time.Hour}}
	// SpreadModes are its sync settings: sync_rate 0 (the reference),
	// then 100ms with sync_above off, 0.5 and 0.8.
	SpreadModes = []Setting{{0, 0}, {100 * time.Millisecond, 0}, {100 * time.Millisecond, 0.5}, {100 * time.Millisecond, 0.8}}
)

const (
	// SpreadClients is the number of clients of a row.
	SpreadClients = 8
	// SpreadFastGap is the spacing of a client's first requests, which
	// spend its quota but two.
	SpreadFastGap = 25 * time.Millisecond
	// SpreadTail is the requests a client sends at its spacing after its
	// fast ones: the last two of its quota, and three past it.
	SpreadTail = 5
	// spreadFastLoad is how many clients spend their quota at once at
	// most: the fast phases are staggered so that a fleet gets at most
	// spreadFastLoad / SpreadFastGap requests per second (480).
	spreadFastLoad = 12
	// spreadLead is how far after a window's start a client placed there
	// sends its first request, and spreadMargin how far before the
	// window's end its last must be sent.
	spreadLead   = 200 * time.Millisecond
	spreadMargin = 500 * time.Millisecond
)

// SpreadRow is a row of the family: SpreadClients clients of one
// spacing, distribution and limit, on a fleet of one store, size and sync
// setting.
type SpreadRow struct {
	Store string
	Nodes int
	// Every is a client's spacing after its fast requests.
	Every time.Duration
	// Random sends each request to a node drawn at random; otherwise to
	// the next node in turn (round-robin).
	Random    bool
	Limit     SpreadLimit
	SyncRate  time.Duration // 0: synchronous
	SyncAbove float64       // 0: off
}

// setting is the row's sync setting as a Row holds it, for its strings.
func (r SpreadRow) setting() Row { return Row{SyncRate: r.SyncRate, SyncAbove: r.SyncAbove} }

// Periodic reports whether the row's namespace syncs on a timer.
func (r SpreadRow) Periodic() bool { return r.SyncRate > 0 }

// Distribution names how the row's requests reach the nodes.
func (r SpreadRow) Distribution() string {
	if r.Random {
		return "random"
	}
	return "rr"
}

// ID names the row in row filters, file names and keys, such as
// redis-spread6-rr-every1s-5per1m-sync100ms-above05.
func (r SpreadRow) ID() string {
	id := Row{Store: r.Store, Pattern: Pattern{Name: fmt.Sprintf("spread%d-%s-every%s-%s",
		r.Nodes, r.Distribution(), shortDuration(r.Every), r.Limit.Name())}, SyncRate: r.SyncRate, SyncAbove: r.SyncAbove}.ID()
	return id
}

// String describes the row for logs.
func (r SpreadRow) String() string {
	return fmt.Sprintf("%s, %d nodes, %s every %v, %s, sync_rate %s, sync_above %s", r.Store, r.Nodes,
		r.Distribution(), r.Every, r.Limit.Label(), r.setting().SyncRateString(), r.setting().SyncAboveString())
}

// fleetKey is what the rows that share a fleet have in common.
type fleetKey struct {
	Store     string
	Nodes     int
	SyncRate  time.Duration
	SyncAbove float64
}

func (r SpreadRow) fleet() fleetKey { return fleetKey{r.Store, r.Nodes, r.SyncRate, r.SyncAbove} }

// SpreadPlan returns the family's rows for the given stores, those of a
// fleet together. With aboveOK false (a plugin without sync_above), the
// sync_above rows are left out.
func SpreadPlan(stores []string, aboveOK bool) []SpreadRow {
	var rows []SpreadRow
	for _, store := range stores {
		for _, nodes := range SpreadNodes {
			for _, m := range SpreadModes {
				if m.SyncAbove > 0 && !aboveOK {
					continue
				}
				for _, l := range SpreadLimits {
					for _, random := range []bool{false, true} {
						for _, every := range SpreadEvery {
							rows = append(rows, SpreadRow{Store: store, Nodes: nodes, Every: every, Random: random,
								Limit: l, SyncRate: m.SyncRate, SyncAbove: m.SyncAbove})
						}
					}
				}
			}
		}
	}
	return rows
}

// SpreadQuickPlan is the family's quick subset on one store: 6 nodes,
// clients of 5 per minute every second, round-robin and at random, at
// sync_rate 100ms with sync_above off and 0.5 (left out with aboveOK
// false). Two fleets of about 6 s of traffic each.
func SpreadQuickPlan(store string, aboveOK bool) []SpreadRow {
	var rows []SpreadRow
	for _, above := range []float64{0, 0.5} {
		if above > 0 && !aboveOK {
			continue
		}
		for _, random := range []bool{false, true} {
			rows = append(rows, SpreadRow{Store: store, Nodes: 6, Every: time.Second, Random: random,
				Limit: SpreadLimits[0], SyncRate: 100 * time.Millisecond, SyncAbove: above})
		}
	}
	return rows
}

// SpreadSchedule returns one client's requests, At from its first: its
// limit − 2 fast ones SpreadFastGap apart, then SpreadTail at the row's
// spacing, to the nodes in turn from node client (round-robin) or at
// random, drawn from a seed of the row and client so that a rerun sends
// the same.
func SpreadSchedule(row SpreadRow, client int) []Request {
	fast := max(row.Limit.Count-2, 0)
	h := fnv.New64a()
	h.Write([]byte(row.ID()))
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(client)))
	reqs := make([]Request, 0, fast+SpreadTail)
	node := func(i int) int {
		if row.Random {
			return rng.IntN(row.Nodes)
		}
		return (client + i) % row.Nodes
	}
	for i := range fast {
		reqs = append(reqs, Request{At: time.Duration(i) * SpreadFastGap, Node: node(i)})
	}
	last := time.Duration(max(fast-1, 0)) * SpreadFastGap
	for j := range SpreadTail {
		reqs = append(reqs, Request{At: last + time.Duration(j+1)*row.Every, Node: node(fast + j)})
	}
	return reqs
}

// spreadClient is one client of a fleet's plan.
type spreadClient struct {
	row    int // the row's index among the fleet's
	index  int // the client's among its row's
	reqs   []Request
	window time.Duration // its limit's
	// phase offsets the clients of a row from each other within a sync
	// interval, so that their requests meet the nodes' runs at different
	// points.
	phase time.Duration
	start time.Time // planned
}

// length is how long the client's run lasts.
func (c *spreadClient) length() time.Duration { return c.reqs[len(c.reqs)-1].At }

// fast is how long its fast requests last.
func (c *spreadClient) fast() time.Duration {
	n := 0
	for _, r := range c.reqs[1:] {
		if r.At-c.reqs[n].At > SpreadFastGap {
			break
		}
		n++
	}
	return time.Duration(n+1) * SpreadFastGap
}

// planStarts sets each client's start, from ready on: the longest runs
// first, the fast phases staggered so that at most spreadFastLoad overlap,
// and each run within one window of its limit (see the family's comment),
// moved to the next window's start when it would cross one, keeping its
// stagger when that fits. It returns when the last run ends.
func planStarts(clients []*spreadClient, ready time.Time) time.Time {
	order := slices.Clone(clients)
	slices.SortStableFunc(order, func(a, b *spreadClient) int { return cmp.Compare(b.length(), a.length()) })
	var offset time.Duration // the stagger so far
	end := ready
	for _, c := range order {
		s := ready.Add(offset + c.phase)
		offset += c.fast() / spreadFastLoad
		if !withinWindow(s, c.length(), c.window) {
			next := time.Unix(0, window.Start(s.UnixNano(), c.window)).Add(c.window + spreadLead)
			s = next.Add(s.Sub(ready))
			if !withinWindow(s, c.length(), c.window) {
				s = next.Add(c.phase)
			}
		}
		c.start = s
		if e := s.Add(c.length()); e.After(end) {
			end = e
		}
	}
	return end
}

// withinWindow reports whether a run from start lasting length, and
// spreadMargin more, stays within one window of the given size.
func withinWindow(start time.Time, length, size time.Duration) bool {
	return window.Start(start.UnixNano(), size) == window.Start(start.Add(length+spreadMargin).UnixNano(), size)
}

// shortDuration formats d without its zero trailing units: 1m, 1h, 100ms.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
