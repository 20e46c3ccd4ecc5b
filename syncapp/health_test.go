package syncapp

import (
	"errors"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
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

// While the store fails, no request tries it, however long the outage:
// the loop's runs probe it, and are told at once that it started failing.
// A success, of a run or of a call that was in flight, lets requests use
// it again.
func TestRequestsSkipAFailedStoreUntilASuccess(t *testing.T) {
	h, now := steppedHealth(zap.NewNop())
	if h.down() {
		t.Fatal("a new store is skipped")
	}
	h.fail(errors.New("store paused"), 0)
	select {
	case <-h.probe:
	default:
		t.Fatal("the loop was not told to probe the store that started failing")
	}
	for range 3 {
		*now = now.Add(hitTimeout)
		if !h.down() {
			t.Fatalf("a request tried the store %v after it failed", now.Sub(time.Unix(1_700_000_000, 0)))
		}
	}
	h.fail(errors.New("store paused"), 0)
	select {
	case <-h.probe:
		t.Fatal("the loop was told again to probe a store that was failing already")
	default:
	}
	h.succeeded()
	if h.down() {
		t.Fatal("the store is skipped after a success")
	}
	// A stall skips the store the same way, and counts as a failure.
	errorsSoFar := func() float64 {
		var m dto.Metric
		if err := metrics.syncErrors.WithLabelValues("test").Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	before := errorsSoFar()
	h.stalled()
	if !h.down() {
		t.Fatal("the store is not skipped after a stall")
	}
	if after := errorsSoFar(); after != before+1 {
		t.Fatalf("a stall counted %v sync errors, want 1", after-before)
	}
	h.succeeded()
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
			h.fail(errors.New("connection refused"), 0)
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

// Failing runs probe the store probeInterval after the first failure,
// and back off, but never so far that a node waits more than maxBackoff
// to sync again once the store is back, whatever its sync interval.
func TestBackoffIsShort(t *testing.T) {
	h, now := steppedHealth(zap.NewNop())
	for _, interval := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second, time.Minute} {
		h.succeeded()
		last := time.Duration(0)
		for failures := 1; failures <= 20; failures++ {
			h.failedRun(errors.New("connection refused"), interval)
			d := h.delay(interval, *now)
			if d > maxBackoff || (failures == 1 && d != probeInterval) {
				t.Fatalf("sync_rate %v, %d failed runs: the next run in %v, want %v after one, at most %v", interval, failures, d, probeInterval, maxBackoff)
			}
			if d < last {
				t.Fatalf("sync_rate %v, %d failed runs: the next run in %v, sooner than after %d (%v)", interval, failures, d, failures-1, last)
			}
			last = d
		}
	}
}
