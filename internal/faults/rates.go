package faults

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
	pgstore "github.com/ratesync/caddy-ratelimit/strategy/postgres"
	redisstore "github.com/ratesync/caddy-ratelimit/strategy/redis"
)

// Rates at sync_rate 0. RatePath has a rate of one request per RateWindow
// with a burst of RateBurst, and the load sends each of its requests with
// a key of its own. A turn the store counts moves the key's TAT one
// RateWindow past the store's clock, two turns two, and a row lasts far
// less than a RateWindow: so the store's TAT tells, request by request,
// how many times its turn was counted. One key of many turns would sum
// them, and a sum cannot tell the turns a node decided alone while it
// held the store down, which by design the store never counts, from turns
// lost.

// Settings of RatePath: one request per RateWindow, and RateBurst more at
// once, which lets a turn counted twice take its second turn, so that it
// shows. RateLine writes them as a Caddyfile does.
const (
	RateWindow = time.Hour
	RateBurst  = 100
	RateLine   = "rate 1/1h burst 100"
)

// InDoubtAfter is the least time a request waits when its round trip
// timed out (syncapp's hitTimeout, and the Redis strategy's
// read_timeout): a request admitted after that long was decided by its
// node while the store's answer was in doubt, and the node's outbox
// must push its turn.
const InDoubtAfter = time.Second

// Turns sums up the requests of RatePath of a row.
type Turns struct {
	// Admitted are the requests admitted (200), of the keys judged;
	// Counted, the turns the store's TATs hold for those keys.
	Admitted, Counted int
	// InDoubt are the admitted requests answered InDoubtAfter or later
	// after they were sent, whose round trip timed out: each must be
	// counted once. (A round trip that failed sooner, on a broken
	// connection, is in doubt too, but is not told apart from a node
	// deciding alone.)
	InDoubt int
	// Alone are the admitted requests the store does not count whose
	// node may have held the store down while it served them: decided
	// by the node alone, which the store never counts.
	Alone int
	// Lost are the admitted turns the store should count (decided at the
	// store, or in doubt) and does not; Doubled, the turns it counts
	// beyond one per admitted or unanswered request.
	Lost, Doubled int
	// Unanswered are the requests that got no answer, and UnansweredCounted
	// how many of them the store counts: either is right.
	Unanswered, UnansweredCounted int
	// Excluded are the requests not judged: sent before a store that lost
	// its data failed.
	Excluded int
	// Unread are the requests whose key's TAT could not be read
	// (UnreadErr says why): not judged.
	Unread    int
	UnreadErr string

	// Latency of the requests sent during the fault, as Outcome's.
	Latency Latency
}

// judge sums up one request, whose key's TAT holds n turns, given the
// spans in which its node may have held the store down.
func (t *Turns) judge(r *Result, n int, down []timeSpan) {
	t.Counted += n
	switch {
	case r.Status == 0:
		t.Unanswered++
		t.UnansweredCounted += min(n, 1)
		t.Doubled += max(n-1, 0)
		return
	case r.Status != http.StatusOK:
		t.Doubled += n // refused, yet counted
		return
	}
	t.Admitted++
	inDoubt := r.Latency >= InDoubtAfter
	if inDoubt {
		t.InDoubt++
	}
	switch {
	case n > 1:
		t.Doubled += n - 1
	case n == 1:
	case inDoubt || !overlaps(down, r.Sent, r.Sent.Add(r.Latency)):
		t.Lost++
	default:
		t.Alone++
	}
}

// turnsOf returns how many turns a TAT holds, read at the store's now:
// every turn moved it one RateWindow, and they were all taken less than
// a RateWindow ago.
func turnsOf(rep strategy.RateReply) int {
	ahead := rep.TAT - rep.Now
	if ahead <= 0 {
		return 0
	}
	return int((ahead + int64(RateWindow) - 1) / int64(RateWindow))
}

// timeSpan is a span of time, both ends included.
type timeSpan struct{ from, to time.Time }

// overlaps reports whether [from, to] meets one of spans.
func overlaps(spans []timeSpan, from, to time.Time) bool {
	for _, s := range spans {
		if !to.Before(s.from) && !from.After(s.to) {
			return true
		}
	}
	return false
}

// downSpans returns the spans in which a node may have held its store
// down, from its sync metrics. A node holds the store down from a failure
// (sync_errors_total counts every one, before the node marks the store
// down) until a success, which a clean sync run shows: each span runs
// from the sample before the failure to the sample after that run (its
// metrics were read after it), or to end when none came.
func downSpans(ss []SyncSample, end time.Time) []timeSpan {
	var spans []timeSpan
	open := false
	for j := 1; j < len(ss); j++ {
		switch {
		case ss[j].Errors > ss[j-1].Errors:
			if !open {
				spans = append(spans, timeSpan{from: ss[j-1].At})
				open = true
			}
		case open && ss[j].Runs > ss[j-1].Runs:
			spans[len(spans)-1].to = end
			if j+1 < len(ss) {
				spans[len(spans)-1].to = ss[j+1].At
			}
			open = false
		}
	}
	if open {
		spans[len(spans)-1].to = end
	}
	return spans
}

// openRater opens a store of the row's strategy, as the nodes were given
// it, for the harness to read the TATs with.
func openRater(config json.RawMessage) (strategy.RateBatcher, error) {
	var m struct {
		Module string `json:"module"`
	}
	if err := json.Unmarshal(config, &m); err != nil {
		return nil, err
	}
	switch m.Module {
	case "redis":
		var r redisstore.Redis
		if err := json.Unmarshal(config, &r); err != nil {
			return nil, err
		}
		s, err := r.Open()
		// The first store opened routes go-redis's log, one per process,
		// to Caddy's: the harness's stays quiet (see stores.go).
		redis.SetLogger(quiet{})
		return s, err
	case "postgres":
		var p pgstore.Postgres
		if err := json.Unmarshal(config, &p); err != nil {
			return nil, err
		}
		return p.Open()
	}
	return nil, fmt.Errorf("no rates on a %q store", m.Module)
}

// readID returns a new batch ID for a read of a TAT.
func readID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// readTurns reads how many turns the store's TAT of each key holds, with
// a Rate that takes none (an increment of 0, a tolerance of 1µs: a TAT
// ahead of now refuses it), asking again for a key that fails until the
// deadline. Keys it could not read are left out, and the first error is
// returned.
func readTurns(ctx context.Context, rater strategy.RateBatcher, keys []string, deadline time.Time) (map[string]int, error) {
	req := strategy.RateRequest{Window: RateWindow, Tolerance: time.Microsecond}
	turns := make(map[string]int, len(keys))
	var first error
	for _, key := range keys {
		for {
			rep, err := strategy.RateAsBatch(ctx, rater, Namespace, key, readID(), req)
			if err == nil {
				turns[key] = turnsOf(rep)
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				if first == nil {
					first = err
				}
				break
			}
			_ = Sleep(ctx, 250*time.Millisecond)
		}
	}
	return turns, first
}

// accountTurns judges the requests of RatePath: it reads their keys'
// TATs through a store of the row's strategy, and each node's spans of a
// store held down from its sync metrics.
func (o *Outcome) accountTurns(ctx context.Context, results []*Result, config json.RawMessage) error {
	var rs []*Result
	var lat []time.Duration
	fEnd := o.faultEnd()
	for _, r := range results {
		if r.Class != Rate {
			continue
		}
		if !r.Sent.Before(o.Start) && r.Sent.Before(fEnd) {
			if r.Status == 0 {
				o.Turns.Latency.Errors++
			} else {
				lat = append(lat, r.Latency)
			}
		}
		if o.Row.Fault.StoreLoses && r.Sent.Before(o.Start) {
			o.Turns.Excluded++
			continue
		}
		rs = append(rs, r)
	}
	o.Turns.Latency.of(lat)
	if len(rs) == 0 {
		return nil
	}
	rater, err := openRater(config)
	if err != nil {
		return fmt.Errorf("opening the store to read the rates' TATs: %w", err)
	}
	defer rater.Close()
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.Key
	}
	turns, err := readTurns(ctx, rater, keys, time.Now().Add(ReadBudget))
	if err != nil {
		o.Turns.UnreadErr = err.Error()
	}
	end := time.Now()
	down := make([][]timeSpan, len(o.Samples))
	for i, ss := range o.Samples {
		down[i] = downSpans(ss, end)
	}
	for _, r := range rs {
		n, ok := turns[r.Key]
		if !ok {
			o.Turns.Unread++
			continue
		}
		var spans []timeSpan
		if r.Node < len(down) {
			spans = down[r.Node]
		}
		o.Turns.judge(r, n, spans)
	}
	return nil
}

// hasRates reports whether the row's load sent requests of RatePath.
func (o *Outcome) hasRates() bool { return o.Rates[Rate] > 0 }
