package syncapp

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// steppedHealth returns a health whose clock moves only when the test
// moves it.
func steppedHealth(logger *zap.Logger) (*health, *time.Time) {
	initMetrics()
	h := newHealth("test", logger)
	now := time.Unix(1_700_000_000, 0)
	h.now = func() time.Time { return now }
	return h, &now
}

// Once the skip window after a failure ends, one request probes the
// store and the others keep skipping it, instead of every request in
// flight waiting out its own timeout.
func TestOneRequestProbesAFailedStore(t *testing.T) {
	h, now := steppedHealth(zap.NewNop())
	errDown := errors.New("store paused")
	h.failed(errDown, 0)
	if !h.down() {
		t.Fatal("the store is not skipped right after a failure")
	}

	probes := func() int32 {
		var n atomic.Int32
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() {
				if !h.down() {
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return n.Load()
	}
	*now = now.Add(retryInterval)
	if got := probes(); got != 1 {
		t.Fatalf("%d of 100 requests tried the store after the skip window, want 1", got)
	}
	// The probe fails: the store is skipped for another window.
	h.failed(errDown, 0)
	if got := probes(); got != 0 {
		t.Fatalf("%d requests tried the store right after the probe failed, want 0", got)
	}
	// A probe that never reports (it had nothing to ask) gives way to
	// another once a hit's timeout passed.
	*now = now.Add(retryInterval)
	if got := probes(); got != 1 {
		t.Fatalf("%d requests probed, want 1", got)
	}
	if got := probes(); got != 0 {
		t.Fatalf("%d requests tried the store while a probe was out, want 0", got)
	}
	*now = now.Add(hitTimeout)
	if got := probes(); got != 1 {
		t.Fatalf("%d requests probed after the silent probe's time ran out, want 1", got)
	}
	// The probe succeeds: nobody skips the store.
	h.succeeded()
	if got := probes(); got != 100 {
		t.Fatalf("%d of 100 requests tried the store once it worked, want 100", got)
	}
}

// A store that flaps (down 2 s, up 1 s, for 45 s) gets at most one
// failure line per log interval, and a recovery line only after a
// failure line.
func TestFlappingStoreLogsOncePerInterval(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	h, now := steppedHealth(zap.New(core))
	start := *now
	for now.Sub(start) < 45*time.Second {
		for range 4 { // down for 2 s: a few failures
			h.failed(errors.New("connection refused"), 0)
			*now = now.Add(500 * time.Millisecond)
		}
		h.succeeded()
		*now = now.Add(time.Second)
	}
	failures := logs.FilterMessageSnippet("store unreachable").Len()
	recoveries := logs.FilterMessageSnippet("reachable again").Len()
	if most := 5; failures < 1 || failures > most { // at 0, 12, 24, 36 s (and one to spare)
		t.Errorf("%d failure lines in 45 s of flapping, want 1 to %d (one per %v)", failures, most, minLogInterval)
	}
	if recoveries > failures {
		t.Errorf("%d recovery lines for %d failure lines", recoveries, failures)
	}
	// The failures not logged are counted in the next line.
	last := logs.FilterMessageSnippet("store unreachable").All()
	if n := last[len(last)-1].ContextMap()["failures_since_last_log"]; n.(int64) < 2 {
		t.Errorf("the last failure line counts %v failures since the one before, want the failures in between", n)
	}
}

// Failing runs back off, but never so far that a node waits more than
// maxBackoff (and an interval) to sync again once the store is back.
func TestBackoffIsShort(t *testing.T) {
	h, now := steppedHealth(zap.NewNop())
	for _, interval := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second} {
		h.succeeded()
		last := time.Duration(0)
		for failures := 1; failures <= 20; failures++ {
			h.failedRun(errors.New("connection refused"), interval)
			d := h.delay(interval, *now)
			if d > 2*time.Second+interval {
				t.Fatalf("sync_rate %v, %d failed runs: the next run in %v, want at most 2s and an interval", interval, failures, d)
			}
			if d+interval < last {
				t.Fatalf("sync_rate %v, %d failed runs: the next run in %v, sooner than after %d (%v)", interval, failures, d, failures-1, last)
			}
			last = d
		}
	}
}
