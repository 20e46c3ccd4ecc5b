package syncapp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
)

// TestEvictedKeysArePushedEarly floods a zone of 1,000 keys with 200,000
// one-hit keys, in a namespace whose timer would push once an hour: once
// the diffs of evicted keys waiting reach the zone's capacity, the loop
// pushes them at once, so that with a healthy store none is dropped and
// the store counts every hit. The flood goes in rounds of 1,000 keys, each
// after the waiting diffs fell below the capacity (bounded by events, so
// the test holds on a loaded machine, however late the loop runs); with
// no early push they never do.
func TestEvictedKeysArePushedEarly(t *testing.T) {
	name := fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
	cfg := fmt.Sprintf(`{"zones": {"small": {"max_keys": 1000}}, "namespaces": {"api": {"zone": "small", "sync_rate": "1h", "window_sizes": ["1h"], "strategy": {"module": "memory", "name": %q}}}}`, name)
	ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
	zone := ns.counters.Zone()
	ctx := context.Background()
	const rounds, perRound = 200, 1000
	for r := range rounds {
		for i := range perRound {
			ns.Increment(ctx, "k"+strconv.Itoa(r*perRound+i), time.Hour, 1)
		}
		poll.Until(t, 10*time.Second, "an early push of the evicted keys' diffs", func() bool {
			return ns.counters.Orphaned() < zone.Capacity()
		})
	}
	if err := ns.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := zone.Dropped(); n != 0 {
		t.Fatalf("%d diffs of evicted keys dropped with a healthy store, want 0", n)
	}
	store := memoryDataSet(name)
	total := 0.0
	keys := make([]string, 0, perRound)
	for r := range rounds {
		keys = keys[:0]
		for i := range perRound {
			keys = append(keys, "k"+strconv.Itoa(r*perRound+i))
		}
		counts, err := store.GetCounters(ctx, "api", keys, []time.Duration{time.Hour}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range counts {
			total += c.Value
		}
	}
	if want := float64(rounds * perRound); total != want {
		t.Fatalf("the store counts %v hits of %v", total, want)
	}
}
