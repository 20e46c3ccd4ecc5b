package faults

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Outcome is what happened in one row.
type Outcome struct {
	Row   Row
	Title string
	Nodes int
	Rates Rates

	// Start is when the fault began; Served, when the store served again
	// (zero for a fault of the nodes); End, when the fault was over;
	// LoadEnd, when the load stopped.
	Start, Served, End, LoadEnd time.Time
	// KilledNode is the node the fault took down (-1: none), at KilledAt.
	KilledNode int
	KilledAt   time.Time

	// Requests by outcome, all classes: sent, answered 5xx, not answered.
	Sent, Status5xx, NoAnswer int
	// NoAnswerErr describes the first request that got no answer.
	NoAnswerErr string
	// Statuses counts the answers by status.
	Statuses map[int]int

	// Hits of CountPath: admitted by the nodes, held by the store, of the
	// keys judged (all, or those sent after the fault began when the
	// store lost data); lost and counted twice, summed over keys.
	Admitted, InStore, Lost, Doubled float64
	// Unread are the admitted hits of keys whose store count no node
	// could read within ReadBudget (UnreadErr says why): not judged.
	Unread    float64
	UnreadErr string
	// Excluded are the admitted hits of keys not judged: sent before a
	// store that lost its data failed.
	Excluded float64
	// LostAllowed is what a node killed outright may lose: the hits it
	// admitted within one sync_rate (and 100 ms) before the kill.
	LostAllowed float64
	// LastSecond is what the killed node admitted in the second before
	// the kill: the quick mode's bound, which a loaded machine's late
	// sync runs do not break.
	LastSecond float64

	// Latency of CountPath and LimitPath requests sent during the fault
	// (from Start to Served, or End).
	P50, P99, Max time.Duration
	// Slow is the share of those that took 900 ms or more.
	Slow       float64
	LatencyN   int
	LatencyErr int

	// LimitDuring and LimitAfter are the worst second's admitted / limit
	// of LimitPath during the fault and from a second after it on.
	LimitDuring, LimitAfter float64
	// LimitFound is LimitDuring from PolicyGrace after the fault began:
	// once every node found the store gone (what share is judged by).
	LimitFound float64
	// Judged and Refused count the requests of CountPath and LimitPath
	// sent from PolicyGrace after the fault began until the store served,
	// and those refused (429): what deny is judged by. Readmitted is the
	// longest any live node took, after the store served, to admit a
	// request of CountPath again (-1: one never did).
	Judged, Refused int
	Readmitted      time.Duration

	// Recovery is, per node, the time from Served to the node's first
	// clean sync run after its last failure; -1 when it never synced
	// again, 0 when it saw no failure at all. RecoveryMax is the worst.
	Recovery    []time.Duration
	RecoveryMax time.Duration
	Failed      []bool // the node saw failures during the row

	// ConcFirst is how long after Served the first request of ConcPath
	// sent from then on was admitted (-1: none).
	ConcFirst time.Duration
	// ConcFrom is when, after Served, the cap is judged from: once every
	// node syncs again (Served + RecoveryMax; ConcFromSync), or a second
	// after Served when the row has no such time. Nodes learn that the
	// store is back only then, and requests they admitted on local counts
	// during the outage may still run: those count against the requests
	// admitted after ConcFrom, but are not judged themselves.
	ConcFrom     time.Duration
	ConcFromSync bool
	// Conc sums up the requests of ConcPath's key the upstream started
	// from ConcFrom on, each by the requests of the key it was running at
	// that start; ConcBefore, those before the fault: the control.
	Conc, ConcBefore Admissions
	// LoadStart is when the load started.
	LoadStart time.Time

	// BanLag is how long after BanFrom (Served, or when it was set off)
	// the ban set off during the fault was held by every live node (-1:
	// not within 20 s). BanKept says, per live node, whether the ban set
	// off before the fault still held after it.
	BanBeforeKey, BanDuringKey string
	BanSetAt, BanFrom          time.Time
	BanLag                     time.Duration
	BanKept                    []bool
	// BanBack is how long after the store served a Redis restarted
	// empty held the ban set off before the fault again, written back by
	// the nodes (-1: not within 20 s; notMeasured in other rows).
	BanBack time.Duration

	// Logs sums up each node's log over the fault and its aftermath.
	Logs []LogLines

	// Goroutines per node before the load and after it (-1: not read);
	// the store's client connections before and after.
	GoroutinesBefore, GoroutinesAfter []int
	ConnsBefore, ConnsAfter           int

	// Samples are each node's sync metrics, every 100 ms.
	Samples [][]SyncSample
	// StuckParts is, in a row that leaves a Cluster slot stuck, how many
	// of the store's parts live in that slot: the most any node may hold
	// down. WholeDown and PartsDownMost are what the nodes held down
	// while it was (Samples).
	StuckParts    int
	WholeDown     bool
	PartsDownMost float64

	// Settled is how long after the load stopped every live node had
	// pushed its pending diffs.
	Settled time.Duration

	Notes   []string
	Elapsed time.Duration

	// Turns sums up the requests of RatePath, at sync_rate 0.
	Turns Turns

	// OnFailed and OnOthers split the judged hits of a Cluster row by
	// where their keys live: on the killed master's slots, or on the
	// other masters'.
	OnFailed, OnOthers SlotShare

	logOffsets  []int64
	failedSlots []slotRange
	slotsFrom   string
}

// SlotShare is the judged hits of keys on some of a Cluster's slots.
type SlotShare struct {
	Keys                    int
	Admitted, Lost, Doubled float64
}

// faultEnd is the end of the fault's window for latency: when the store
// served again, or the fault was over.
func (o *Outcome) faultEnd() time.Time {
	if !o.Served.IsZero() {
		return o.Served
	}
	return o.End
}

// recoveryFrom is when "after the fault" starts.
func (o *Outcome) recoveryFrom() time.Time {
	if !o.Served.IsZero() {
		return o.Served
	}
	return o.End
}

// account sums up the results, and reads the store's counts of the
// CountPath keys through node reader.
func (o *Outcome) account(ctx context.Context, results []*Result, readers []*Node, up *Upstream) error {
	o.Statuses = map[int]int{}
	type keyStat struct {
		admitted float64
		first    time.Time
		unknown  bool // a request of it got no answer
	}
	keys := map[string]*keyStat{}
	var lat []time.Duration
	during := map[int64]float64{} // second → admitted of LimitPath
	after := map[int64]float64{}
	fEnd, from := o.faultEnd(), o.recoveryFrom()
	found := o.Start.Add(PolicyGrace)
	readmitted := map[int]time.Duration{}
	o.ConcFirst = -1
	for _, r := range results {
		o.Sent++
		o.Statuses[r.Status]++
		switch {
		case r.Status == 0:
			o.NoAnswer++
			if o.NoAnswerErr == "" && r.Err != nil {
				o.NoAnswerErr = fmt.Sprintf("%s to node%d, %s after the fault began: %v",
					classPath[r.Class], r.Node+1, secs1(r.Sent.Sub(o.Start)), r.Err)
			}
		case r.Status >= 500:
			o.Status5xx++
		}
		if r.Class == Count {
			k := keys[r.Key]
			if k == nil {
				k = &keyStat{first: r.Sent}
				keys[r.Key] = k
			}
			if r.Sent.Before(k.first) {
				k.first = r.Sent
			}
			if r.Status == http.StatusOK {
				k.admitted++
				if o.KilledNode >= 0 && r.Node == o.KilledNode {
					if !r.Sent.Before(o.KilledAt.Add(-o.Row.SyncRate() - 100*time.Millisecond)) {
						o.LostAllowed++
					}
					if !r.Sent.Before(o.KilledAt.Add(-time.Second)) {
						o.LastSecond++
					}
				}
			}
			if r.Status == 0 {
				k.unknown = true
			}
		}
		if (r.Class == Count || r.Class == Limit) && !r.Sent.Before(found) && r.Sent.Before(fEnd) {
			o.Judged++
			if r.Status == http.StatusTooManyRequests {
				o.Refused++
			}
		}
		if r.Class == Count && r.Status == http.StatusOK && !r.Sent.Before(from) {
			if d, ok := readmitted[r.Node]; !ok || r.Sent.Sub(from) < d {
				readmitted[r.Node] = r.Sent.Sub(from)
			}
		}
		if (r.Class == Count || r.Class == Limit) && !r.Sent.Before(o.Start) && r.Sent.Before(fEnd) {
			if r.Status == 0 {
				o.LatencyErr++
			} else {
				lat = append(lat, r.Latency)
			}
		}
		if r.Class == Limit && r.Status == http.StatusOK && r.ServerMs > 0 {
			at := time.UnixMilli(r.ServerMs)
			sec := r.ServerMs / 1000
			switch {
			case !at.Before(o.Start) && at.Before(fEnd):
				during[sec]++
			case !at.Before(from.Add(time.Second)):
				after[sec]++
			}
		}
		if r.Class == Conc && r.Status == http.StatusOK && !r.Sent.Before(from) {
			if d := r.Sent.Sub(from); o.ConcFirst < 0 || d < o.ConcFirst {
				o.ConcFirst = d
			}
		}
	}
	// Whole seconds only: the first and last second of a span are partial.
	o.LimitDuring = worstSecond(during, o.Start, fEnd)
	o.LimitFound = worstSecond(during, found, fEnd)
	o.LimitAfter = worstSecond(after, from.Add(time.Second), o.LoadEnd)
	o.Readmitted = 0
	for i := range o.Nodes {
		d, ok := readmitted[i]
		if i == o.KilledNode {
			continue
		}
		if !ok {
			o.Readmitted = -1
			break
		}
		o.Readmitted = max(o.Readmitted, d)
	}
	var l Latency
	l.of(lat)
	o.P50, o.P99, o.Max, o.Slow, o.LatencyN = l.P50, l.P99, l.Max, l.Slow, l.N
	o.recovery()
	o.heldDown()
	o.concurrency(up)

	// The store's counts, key by key, through any live node: a node whose
	// client cannot reach the store yet (a Cluster's stale slot map) is
	// asked again, for up to ReadBudget in all.
	deadline := time.Now().Add(ReadBudget)
	var where func(string) (bool, bool)
	if len(o.failedSlots) > 0 {
		where = onFailedSlots(ctx, o.slotsFrom, o.failedSlots)
	}
	for key, k := range keys {
		if o.Row.Fault.StoreLoses && k.first.Before(o.Start) {
			o.Excluded += k.admitted
			continue
		}
		held, err := readCount(ctx, readers, key, deadline)
		if err != nil {
			o.Unread += k.admitted
			if o.UnreadErr == "" {
				o.UnreadErr = err.Error()
			}
			continue
		}
		var lost, doubled float64
		switch {
		case held < k.admitted:
			lost = k.admitted - held
		case held > k.admitted && !k.unknown:
			// A request without an answer may have been admitted: more
			// in the store is not double counting then.
			doubled = held - k.admitted
		}
		o.Admitted += k.admitted
		o.InStore += held
		o.Lost += lost
		o.Doubled += doubled
		if where != nil {
			if on, ok := where(key); ok {
				share := &o.OnOthers
				if on {
					share = &o.OnFailed
				}
				share.Keys++
				share.Admitted += k.admitted
				share.Lost += lost
				share.Doubled += doubled
			}
		}
	}
	return nil
}

// Latency sums up the latencies of some requests.
type Latency struct {
	// P50, P99 and Max are the median, the 99th percentile and the
	// longest; Slow is the share of 900 ms or more.
	P50, P99, Max time.Duration
	Slow          float64
	// N is how many there are; Errors, how many requests got no answer
	// (not among them).
	N, Errors int
}

// of sums up lat, which it sorts.
func (l *Latency) of(lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	fast, _ := slices.BinarySearch(lat, 900*time.Millisecond)
	slow := len(lat) - fast
	l.N = len(lat)
	l.P50 = lat[len(lat)/2]
	l.P99 = lat[min(len(lat)-1, int(math.Ceil(0.99*float64(len(lat))))-1)]
	l.Max = lat[len(lat)-1]
	l.Slow = float64(slow) / float64(len(lat))
}

// concurrency judges max_concurrent's cap from what the upstream ran,
// once recovery has found when every node syncs again: from then on (or
// a second after the store served, when the row has no such time: a node
// never synced again, or no store came back), each request the upstream
// started must have found at most MaxConcurrent of its key running,
// itself included.
func (o *Outcome) concurrency(up *Upstream) {
	o.ConcFrom, o.ConcFromSync = time.Second, false
	if !o.Served.IsZero() && !o.Row.Fault.NodeFault && o.RecoveryMax >= 0 {
		o.ConcFrom, o.ConcFromSync = o.RecoveryMax, true
	}
	key := o.Row.Fault.keyPrefix(o)
	o.Conc = up.Admissions(key, o.recoveryFrom().Add(o.ConcFrom), o.LoadEnd, MaxConcurrent)
	o.ConcBefore = up.Admissions(key, o.LoadStart, o.Start, MaxConcurrent)
}

// ReadBudget bounds how long the harness tries to read the store's
// counts of a row: longer than go-redis's 60 s reload of a Cluster's
// slots.
const ReadBudget = 75 * time.Second

// readCount reads a key's count through the readers in turn until one
// answers or the deadline passes.
func readCount(ctx context.Context, readers []*Node, key string, deadline time.Time) (float64, error) {
	for i := 0; ; i++ {
		held, err := readers[i%len(readers)].StoreCount(ctx, key, CountWindow)
		if err == nil {
			return held, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, err
		}
		if i%len(readers) == len(readers)-1 {
			_ = Sleep(ctx, 250*time.Millisecond)
		}
	}
}

// keyPrefix returns the ConcPath key of the row.
func (f *Fault) keyPrefix(o *Outcome) string {
	return strings.TrimSuffix(o.BanBeforeKey, "ban-before") + "conc"
}

// worstSecond returns the highest count of a whole second within
// [from, to), over the limit.
func worstSecond(counts map[int64]float64, from, to time.Time) float64 {
	first := (from.UnixMilli() + 999) / 1000
	last := to.UnixMilli()/1000 - 1 // the second ending at or before to
	worst := 0.0
	for sec, n := range counts {
		if sec >= first && sec <= last {
			worst = max(worst, n)
		}
	}
	return worst / LimitPerSecond
}

// recovery computes each node's time from Served to its first clean sync
// run after its last failure.
func (o *Outcome) recovery() {
	o.Recovery = make([]time.Duration, len(o.Samples))
	o.Failed = make([]bool, len(o.Samples))
	for i, ss := range o.Samples {
		if i == o.KilledNode || len(ss) < 2 {
			o.Recovery[i] = 0
			continue
		}
		o.Failed[i] = ss[len(ss)-1].Errors > ss[0].Errors
		if o.Served.IsZero() {
			continue
		}
		lastErr := -1
		for j := 1; j < len(ss); j++ {
			if ss[j].Errors > ss[j-1].Errors {
				lastErr = j
			}
		}
		if lastErr < 0 {
			continue // no failure seen: nothing to recover from
		}
		rec := time.Duration(-1)
		for j := lastErr + 1; j < len(ss); j++ {
			if ss[j].Runs > ss[j-1].Runs && ss[j].Errors == ss[j-1].Errors {
				// A clean run between samples j-1 and j: count it at j.
				rec = max(ss[j].At.Sub(o.Served), 0)
				break
			}
		}
		o.Recovery[i] = rec
	}
	o.RecoveryMax = 0
	for _, r := range o.Recovery {
		if r < 0 {
			o.RecoveryMax = -1
			break
		}
		o.RecoveryMax = max(o.RecoveryMax, r)
	}
}

// heldDown finds what the nodes held down from the fault's start until
// the store served: the whole store, and the most parts.
func (o *Outcome) heldDown() {
	for _, ss := range o.Samples {
		for _, x := range ss {
			if x.OK && !x.At.Before(o.Start) && x.At.Before(o.Served) {
				o.WholeDown = o.WholeDown || x.Down > 0
				o.PartsDownMost = max(o.PartsDownMost, x.PartsDown)
			}
		}
	}
}

// Check is one promise of docs/faults.md, as this row measured
// it.
type Check struct {
	// Promise says what is promised; Figure, what was measured.
	Promise, Figure string
	Held            bool
}

// Checks returns the promises that apply to the row, and whether each
// held.
func (o *Outcome) Checks() []Check {
	var cs []Check
	lostOK := o.Lost == 0
	lostPromise := "0 hits lost"
	if o.Row.Fault.StoreLoses {
		lostPromise = "0 hits lost beyond the store's own loss"
	}
	if o.Row.Fault.Name == "node-kill" && !o.Row.Sync {
		lostPromise = fmt.Sprintf("lost ≤ the killed node's last sync_rate of hits (%g)", o.LostAllowed)
		lostOK = o.Lost <= o.LostAllowed
	}
	cs = append(cs,
		Check{lostPromise, fmt.Sprintf("%g lost", o.Lost), lostOK},
		Check{"0 counted twice", fmt.Sprintf("%g counted twice", o.Doubled), o.Doubled == 0},
		Check{"the store's counts can be read through a node", fmt.Sprintf("%g hits of unreadable keys", o.Unread), o.Unread == 0},
		Check{"0 responses 5xx", fmt.Sprintf("%d 5xx", o.Status5xx), o.Status5xx == 0},
	)
	if !o.Row.Fault.NodeFault {
		fig := "never"
		if o.RecoveryMax >= 0 {
			fig = secs1(o.RecoveryMax)
		}
		cs = append(cs, Check{"every node syncs again ≤ 5 s after the store serves", fig, o.RecoveryMax >= 0 && o.RecoveryMax <= 5*time.Second})
	}
	banFig := "not within 20 s"
	if o.BanLag >= 0 {
		banFig = secs1(o.BanLag)
	}
	// Under deny nothing is counted while the store is away, so no ban
	// starts.
	if o.Row.Fault.Policy != "deny" {
		cs = append(cs, Check{"a ban set off during the fault on every node ≤ 5 s after the store serves", banFig, o.BanLag >= 0 && o.BanLag <= 5*time.Second})
	}
	// A store that lost its data lost the bans it held too: the nodes
	// that hold them write them back.
	kept := !slices.Contains(o.BanKept, false)
	cs = append(cs, Check{"a ban set off before the fault still held on every node", fmt.Sprintf("%v", o.BanKept), kept})
	if o.BanBack != notMeasured {
		// The first run that reaches the store writes the bans back: by
		// one sync interval after the first node syncs again (its
		// /metrics read every 100 ms, hence as much slack).
		first := time.Duration(-1)
		for _, r := range o.Recovery {
			if r >= 0 && (first < 0 || r < first) {
				first = r
			}
		}
		bound := first + o.Row.Interval() + 100*time.Millisecond
		fig := "not within 20 s"
		if o.BanBack >= 0 {
			fig = fmt.Sprintf("%s (first node syncing again: %s)", secs1(o.BanBack), secs1(first))
		}
		cs = append(cs, Check{"Redis restarted empty: the ban set off before the fault back in the store ≤ one sync interval after the first node syncs again",
			fig, o.BanBack >= 0 && first >= 0 && o.BanBack <= bound})
	}
	if o.Row.Fault.PartialOutage {
		rec := "never"
		if o.RecoveryMax >= 0 {
			rec = secs1(o.RecoveryMax)
		}
		cs = append(cs,
			// Judged against the fleet's own accuracy with every master
			// up (its worst second after the fault, 1 at least): a
			// periodic fleet admits some over a one-second window.
			Check{"a key on a live master: admitted / limit ≤ 1.10 × the fleet's with every master up (after), in every whole second from the kill until the promotion",
				fmt.Sprintf("%.2f (after: %.2f)", o.LimitDuring, o.LimitAfter), o.LimitDuring <= 1.10*max(1, o.LimitAfter)},
			Check{"the dead master's keys: every node syncs them again ≤ 1 s after the promotion", rec, o.RecoveryMax >= 0 && o.RecoveryMax <= time.Second},
		)
	}
	if o.Row.Fault.Stuck {
		cs = append(cs, Check{fmt.Sprintf("a stuck slot: no node holds the whole store down, nor more than the slot's parts (%d) while it is stuck", o.StuckParts),
			fmt.Sprintf("whole store down: %v; parts down: %g at most", o.WholeDown, o.PartsDownMost), !o.WholeDown && o.PartsDownMost <= float64(o.StuckParts)})
	}
	if o.Row.Fault.Migrates {
		cs = append(cs, Check{"admitted / limit ≤ 1.10 × the fleet's once every slot is moved (after), in every whole second while slots move",
			fmt.Sprintf("%.2f (after: %.2f)", o.LimitDuring, o.LimitAfter), o.LimitDuring <= 1.10*max(1, o.LimitAfter)})
	}
	switch o.Row.Fault.Policy {
	case "share":
		cs = append(cs, Check{fmt.Sprintf("share: admitted / limit ≤ 1.10 in every whole second from %s after the store went away until it serves", secs(PolicyGrace)),
			fmt.Sprintf("%.2f", o.LimitFound), o.LimitFound <= 1.10})
	case "deny":
		readmitted := "never"
		if o.Readmitted >= 0 {
			readmitted = secs1(o.Readmitted)
		}
		cs = append(cs,
			Check{fmt.Sprintf("deny: every request refused (429) from %s after the store went away until it serves", secs(PolicyGrace)),
				fmt.Sprintf("%d of %d", o.Refused, o.Judged), o.Judged > 0 && o.Refused == o.Judged},
			Check{"deny: every node admits again ≤ 1 s after the store serves", readmitted, o.Readmitted >= 0 && o.Readmitted <= time.Second},
		)
	}
	if o.Row.Fault.Name == "redis-pause" && o.Row.Sync {
		cs = append(cs,
			Check{"p99 ≤ read_timeout + 50 ms (1,050 ms)", ms(o.P99), o.P99 <= ReadTimeout+50*time.Millisecond},
			Check{"≤ 1 % of requests wait ≥ 900 ms", pct(o.Slow), o.Slow <= 0.01},
		)
	}
	if !o.Row.Fault.NodeFault {
		fig := "none admitted"
		if o.ConcFirst >= 0 {
			fig = secs1(o.ConcFirst)
		}
		cs = append(cs,
			Check{"max_concurrent: first request admitted ≤ 3 s after the store serves", fig, o.ConcFirst >= 0 && o.ConcFirst <= 3*time.Second},
			Check{fmt.Sprintf("max_concurrent: once every node syncs again, every request is admitted with ≤ %d of its key in flight, itself included", MaxConcurrent),
				concFigure(o), o.Conc.Worst <= MaxConcurrent},
		)
	}
	if o.Row.Fault.Name == "redis-flap" {
		span := o.End.Sub(o.Start)
		allowed := int(math.Ceil(span.Seconds() / 10))
		worst, foreign := 0, 0
		for _, l := range o.Logs {
			worst = max(worst, l.Failures)
			foreign += l.Foreign
		}
		cs = append(cs,
			Check{fmt.Sprintf("≤ 1 failure line per 10 s per node (%d in %s)", allowed, secs1(span)), fmt.Sprintf("%d", worst), worst <= allowed},
			Check{"nothing on stderr from dependencies", fmt.Sprintf("%d lines", foreign), foreign == 0},
		)
	}
	if o.hasRates() {
		t := &o.Turns
		cs = append(cs,
			Check{"rates: 0 turns lost (admitted at the store or in doubt, not in its TAT)", fmt.Sprintf("%d lost", t.Lost), t.Lost == 0},
			Check{"rates: 0 turns counted twice", fmt.Sprintf("%d counted twice", t.Doubled), t.Doubled == 0},
			Check{"rates: the store's TATs can be read", fmt.Sprintf("%d requests of unreadable keys", t.Unread), t.Unread == 0},
		)
		if o.Row.Fault.Name == "redis-pause" {
			cs = append(cs,
				Check{"rates: p99 ≤ read_timeout + 50 ms (1,050 ms)", ms(t.Latency.P99), t.Latency.P99 <= ReadTimeout+50*time.Millisecond},
				Check{"rates: ≤ 1 % of requests wait ≥ 900 ms", pct(t.Latency.Slow), t.Latency.Slow <= 0.01},
			)
		}
	}
	return cs
}

// AllHeld reports whether every check held.
func (o *Outcome) AllHeld() bool {
	for _, c := range o.Checks() {
		if !c.Held {
			return false
		}
	}
	return true
}

// LogPerMinute returns the most failure lines per minute of one node
// over the fault and its aftermath, and the non-JSON lines of all.
func (o *Outcome) LogPerMinute() (perMin float64, foreign int) {
	span := o.LoadEnd.Sub(o.Start).Minutes()
	for _, l := range o.Logs {
		if span > 0 {
			perMin = max(perMin, float64(l.Failures)/span)
		}
		foreign += l.Foreign
	}
	return perMin, foreign
}

// Summary is a line of progress.
func (o *Outcome) Summary() string {
	var failed []string
	for _, c := range o.Checks() {
		if !c.Held {
			failed = append(failed, c.Promise+": "+c.Figure)
		}
	}
	verdict := "all promises held"
	if len(failed) > 0 {
		verdict = "FAILED " + strings.Join(failed, "; ")
	}
	turns := ""
	if o.hasRates() {
		t := &o.Turns
		turns = fmt.Sprintf(" turns %d/%d alone %d lost %d doubled %d p99 %s", t.Admitted, t.Counted, t.Alone, t.Lost, t.Doubled, ms(t.Latency.P99))
	}
	return fmt.Sprintf("admitted %g lost %g doubled %g 5xx %d p99 %s%s sync-again %s  %s",
		o.Admitted, o.Lost, o.Doubled, o.Status5xx, ms(o.P99), turns, recoveryString(o), verdict)
}

func recoveryString(o *Outcome) string {
	if o.Row.Fault.NodeFault {
		return "–"
	}
	if o.RecoveryMax < 0 {
		return "never"
	}
	return secs1(o.RecoveryMax)
}

// concFigure describes the requests of ConcPath's key in flight at each
// admission once every node synced again.
func concFigure(o *Outcome) string {
	from := "every node syncing again"
	if !o.ConcFromSync {
		from = "the store serving + 1 s: no syncing-again time"
	}
	if o.Conc.N == 0 {
		return fmt.Sprintf("no request admitted from +%s (%s)", secs1(o.ConcFrom), from)
	}
	f := fmt.Sprintf("at most %d in flight at an admission, from +%s (%s) on", o.Conc.Worst, secs1(o.ConcFrom), from)
	if o.Conc.Over > 0 {
		f += fmt.Sprintf("; %d of %d admissions over the cap, the last at +%s", o.Conc.Over, o.Conc.N, secs1(o.Conc.LastOver.Sub(o.recoveryFrom())))
	}
	return f + fmt.Sprintf("; %d before the fault", o.ConcBefore.Worst)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func secs1(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func pct(f float64) string { return fmt.Sprintf("%.2f %%", 100*f) }
