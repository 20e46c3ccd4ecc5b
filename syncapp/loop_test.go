package syncapp

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestReloadsDoNotPutRunsOff wakes a namespace's loop, as the configs of
// a reload storm attach and detach, faster than its runs are spaced while
// its store is failing: the run that probes the store still comes on
// time, and finds it back.
func TestReloadsDoNotPutRunsOff(t *testing.T) {
	n := start(t, caddy.NewUsagePool(), memoryStore(t).config("1h", "1h"))
	ns, l := n.ns("api"), n.app.loops["api"]
	// Failed runs, without the probe signal of a first failure: the next
	// run is a probe, maxBackoff from now; the aligned one is up to 1h away.
	ns.health.mu.Lock()
	ns.health.runFailures = 5
	ns.health.mu.Unlock()
	ns.health.store.Load().failing.Store(true)
	woken := time.Now()
	for ns.health.down() {
		if time.Since(woken) > 20*time.Second {
			t.Fatalf("no run in %v of wakes every 20ms, with runs %v apart", time.Since(woken), maxBackoff)
		}
		signal(l.wake)
		time.Sleep(20 * time.Millisecond) // the pace of the wakes, not a wait for an event
	}
}
