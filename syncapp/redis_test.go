package syncapp

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy/redis"
	"github.com/ratesync/caddy-ratelimit/window"
)

// nsConfig is the app config of one namespace "api" on a Redis server.
func nsConfig(addr, syncRate string, windows ...string) string {
	sizes := ""
	for i, w := range windows {
		if i > 0 {
			sizes += ","
		}
		sizes += strconv.Quote(w)
	}
	return fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": %q, "window_sizes": [%s],
		"strategy": {"module": "redis", "addresses": [%q]}}}}`, syncRate, sizes, addr)
}

// storeTotal reads the store's counts of key's current and previous
// windows, through a client of its own.
func storeTotal(t *testing.T, addr, key string, size time.Duration) float64 {
	t.Helper()
	// Generous: it reads right after a server resumes or restarts.
	s := fleetStore{strategy: fmt.Sprintf(`{"module": "redis", "addresses": [%q], "read_timeout": "10s"}`, addr)}
	return s.total(t, key, size)
}

// warmUp has a synchronous node connect and load its script, so that the
// hits a test counts do not pay for that within the hit timeout.
func warmUp(t *testing.T, ns *Namespace) {
	t.Helper()
	if _, err := ns.store.(*redis.Store).GetWindow(context.Background(), ns.name, "warm-up", time.Hour, 0); err != nil {
		t.Fatalf("warming up: %v", err)
	}
	ns.Increment(context.Background(), "warm-up", time.Hour, 1)
	// Had that hit timed out anyway, the store would be skipped a moment.
	poll.Until(t, 5*time.Second, "the store to be in use", func() bool { return !ns.health.down() })
}

// TestReloadKeepsCountersAndPendingDiffs counts on a namespace that has not
// synced yet, reloads with a changed namespace config, and checks that the
// counters stayed and every hit reached the store exactly once.
func TestReloadKeepsCountersAndPendingDiffs(t *testing.T) {
	srv := redistest.Start(t)
	pool := caddy.NewUsagePool()
	ctx := context.Background()
	old := start(t, pool, nsConfig(srv.Addr, "1h", "1h")) // never syncs on its own
	for range 10 {
		old.ns("api").Increment(ctx, "k", time.Hour, 1)
	}
	next := start(t, pool, nsConfig(srv.Addr, "100ms", "1h", "1m"))
	for range 5 {
		next.ns("api").Increment(ctx, "k", time.Hour, 1)
	}
	old.stop() // pushes what is pending, then hands the loop over
	if got := both(next.ns("api").SlidingWindow("k", time.Hour, nil)); got != 15 {
		t.Fatalf("after reload: %v, want 15", got)
	}
	poll.Until(t, 5*time.Second, "the store to hold 15 hits", func() bool {
		return storeTotal(t, srv.Addr, "k", time.Hour) == 15
	})
	// A few more runs must not push anything twice.
	awaitRuns(t, "api", 3)
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 15 {
		t.Fatalf("store holds %v after more runs, want 15", got)
	}
	// An unchanged config reloaded keeps them too.
	again := start(t, pool, nsConfig(srv.Addr, "100ms", "1h", "1m"))
	next.stop()
	if got := both(again.ns("api").SlidingWindow("k", time.Hour, nil)); got != 15 {
		t.Fatalf("after an identical reload: %v, want 15", got)
	}
}

// TestPausedStoreLosesNothing freezes Redis (SIGSTOP) while hits go on,
// then resumes it (SIGCONT): the store ends up with every hit, once.
func TestPausedStoreLosesNothing(t *testing.T) {
	srv := redistest.Start(t)
	ns := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "50ms", "1h")).ns("api")
	ctx := context.Background()
	hits := 0
	hit := func(n int) {
		for i := range n {
			ns.Increment(ctx, "k"+strconv.Itoa(i%7), time.Hour, 1)
			hits++
		}
	}
	total := func() float64 {
		sum := 0.0
		for i := range 7 {
			sum += storeTotal(t, srv.Addr, "k"+strconv.Itoa(i), time.Hour)
		}
		return sum
	}
	hit(100)
	poll.Until(t, 10*time.Second, "the store to hold the first 100 hits", func() bool { return total() == 100 })
	// Paused until a run fails, which takes a run's timeout (minRunTimeout),
	// so that a push times out after Redis has it in its socket, is applied
	// on resume, and is retried as the same batch: the store must not count
	// it twice. Hits go on meanwhile.
	srv.Pause()
	awaitFailedRuns(t, 1, func() { hit(3) }, ns)
	srv.Resume()
	hit(50)
	poll.Until(t, 30*time.Second, fmt.Sprintf("the store to hold all %d hits", hits), func() bool {
		return total() == float64(hits)
	})
	awaitRuns(t, "api", 3) // more runs must not push anything twice
	if got := total(); got != float64(hits) {
		t.Fatalf("store holds %v, want %d: a hit was pushed twice", got, hits)
	}
}

// TestRestartedStoreGetsNewHits kills Redis, hits on, and restarts it empty:
// every hit counted after the kill reaches the new server.
func TestRestartedStoreGetsNewHits(t *testing.T) {
	srv := redistest.Start(t)
	ns := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "50ms", "1h")).ns("api")
	ctx := context.Background()
	for range 40 {
		ns.Increment(ctx, "k", time.Hour, 1)
	}
	if err := ns.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for i := range 25 {
		ns.Increment(ctx, "k", time.Hour, 1)
		if i == 12 { // half the hits before a run finds the store gone, half after
			awaitFailedRuns(t, 1, func() {}, ns)
		}
	}
	if got := both(ns.SlidingWindow("k", time.Hour, nil)); got != 65 {
		t.Fatalf("local count while the store is down: %v, want 65", got)
	}
	srv.Restart()
	poll.Until(t, 40*time.Second, "the new server to hold the 25 hits since the kill", func() bool {
		return storeTotal(t, srv.Addr, "k", time.Hour) == 25
	})
}

// TestSynchronousModeFallsBackToLocal stops Redis under a synchronous
// namespace: hits count locally and reach the store once it is back.
func TestSynchronousModeFallsBackToLocal(t *testing.T) {
	srv := redistest.Start(t)
	ns := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "0", "1h")).ns("api")
	warmUp(t, ns)
	ctx := context.Background()
	for range 3 {
		ns.Increment(ctx, "k", time.Hour, 1)
	}
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 3 {
		t.Fatalf("store holds %v before the kill, want the 3 synchronous hits", got)
	}
	srv.Kill()
	var s window.Sample
	for range 4 {
		s = ns.Increment(ctx, "k", time.Hour, 1)
	}
	if both(s) != 7 { // both windows: the hour may end during the test
		t.Fatalf("answer while the store is down: %v + %v, want 7 (3 from the store, 4 local)", s.Current, s.Previous)
	}
	srv.Restart()
	poll.Until(t, 40*time.Second, "the 4 local hits to reach the new server", func() bool {
		return storeTotal(t, srv.Addr, "k", time.Hour) == 4
	})
}

// TestValidateNeverDials provisions and cleans up a config, as caddy
// validate does: no connection reaches Redis and no goroutine is left.
func TestValidateNeverDials(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client("")
	connections := func() string {
		info, err := client.Info(context.Background(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		return statLine(info, "total_connections_received")
	}
	before, goroutines := connections(), runtime.NumGoroutine()
	n, err := provision(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "100ms", "1m"))
	if err != nil {
		t.Fatal(err)
	}
	n.cleanup()
	if after := connections(); after != before {
		t.Fatalf("provisioning dialed Redis: connections %s -> %s", before, after)
	}
	// Goroutines that a closed client or an earlier test ends take a
	// moment to exit; one the config left behind would never go.
	poll.Until(t, 10*time.Second, fmt.Sprintf("goroutines back to %d", goroutines), func() bool {
		return runtime.NumGoroutine() <= goroutines
	})
}

// TestReloadsLeaveNoGoroutine reloads fifty times, each config replacing
// the last as Caddy does, and checks that every goroutine went.
func TestReloadsLeaveNoGoroutine(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	baseline := runtime.NumGoroutine()
	pool := caddy.NewUsagePool()
	var cur *node
	for i := range 50 {
		cfg := nsConfig(srv.Addr, []string{"50ms", "0", "20ms"}[i%3], "1m")
		next := start(t, pool, cfg)
		next.ns("api").Increment(ctx, "k", time.Minute, 1)
		if cur != nil {
			cur.stop()
		}
		cur = next
	}
	cur.stop()
	poll.Until(t, 10*time.Second, fmt.Sprintf("goroutines back to %d", baseline), func() bool {
		return runtime.NumGoroutine() <= baseline
	})
	if got := storeTotal(t, srv.Addr, "k", time.Minute); got != 50 {
		t.Fatalf("store holds %v, want the 50 hits", got)
	}
}

// statLine returns the value of one "name:value" line of INFO output.
func statLine(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// TestStoreOutageIsLoggedRarely keeps a fast namespace running against a
// dead store: failures are logged about once per interval, not per run or
// per hit, and the recovery is logged once.
func TestStoreOutageIsLoggedRarely(t *testing.T) {
	srv := redistest.Start(t)
	n, err := provision(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "0", "1h"))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	ns := n.ns("api")
	ns.health.logger = zap.New(core)
	if err := n.app.Start(); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	ctx := context.Background()
	for range 200 {
		ns.Increment(ctx, "k", time.Hour, 1)
	}
	if got := logs.FilterMessageSnippet("store unreachable").Len(); got != 1 {
		t.Fatalf("200 failed hits logged %d times, want once", got)
	}
	srv.Restart()
	poll.Until(t, 30*time.Second, "the recovery to be logged", func() bool {
		return logs.FilterMessageSnippet("reachable again").Len() == 1
	})
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 200 {
		t.Fatalf("store holds %v, want the 200 hits counted while it was down", got)
	}
}

// TestOddWindowsDoNotBlockTheSync counts, through the Go API, in a window
// no store can keep: those diffs are dropped, and the rest still sync.
func TestOddWindowsDoNotBlockTheSync(t *testing.T) {
	srv := redistest.Start(t)
	ns := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "1h", "1h")).ns("api")
	ctx := context.Background()
	ns.Increment(ctx, "k", 1500*time.Microsecond, 1)
	ns.Increment(ctx, "k", time.Hour, 2)
	if err := ns.Sync(ctx); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 2 {
		t.Fatalf("store holds %v, want 2", got)
	}
}

// TestFailedReloadKeepsTheRunningConfig starts a new config that shrinks
// the zone and points the namespace at another store, then stops it as
// Caddy does when another app fails to start: the running config keeps its
// zone, its keys and its store.
func TestFailedReloadKeepsTheRunningConfig(t *testing.T) {
	inUse, other := redistest.Start(t), redistest.Start(t)
	pool := caddy.NewUsagePool()
	ctx := context.Background()
	cfg := func(addr string, maxKeys int) string {
		return fmt.Sprintf(`{"zones": {"default": {"max_keys": %d}}, "namespaces": {"api": {"sync_rate": "1h",
			"window_sizes": ["1h"], "strategy": {"module": "redis", "addresses": [%q]}}}}`, maxKeys, addr)
	}
	running := start(t, pool, cfg(inUse.Addr, 1000))
	for i := range 40 {
		running.ns("api").Increment(ctx, "k"+strconv.Itoa(i), time.Hour, 1)
	}
	failed := start(t, pool, cfg(other.Addr, 16))
	failed.stop()
	zone := running.app.zones["default"].zone
	if zone.Capacity() != 1000 || zone.Len() != 40 {
		t.Fatalf("after the failed reload the zone holds %d of %d keys, want 40 of 1000", zone.Len(), zone.Capacity())
	}
	if got := storeTotal(t, other.Addr, "k0", time.Hour); got != 0 {
		t.Fatalf("the failed config's store got %v hits", got)
	}
	running.stop()
	total := 0.0
	for i := range 40 {
		total += storeTotal(t, inUse.Addr, "k"+strconv.Itoa(i), time.Hour)
	}
	if total != 40 {
		t.Fatalf("the running config's store got %v hits, want 40", total)
	}
}

// TestHitsAfterStopArePushedAtCleanup counts after the app stopped, as
// requests still finishing while the http app stops do: the cleanup that
// follows pushes them before it closes the store.
func TestHitsAfterStopArePushedAtCleanup(t *testing.T) {
	srv := redistest.Start(t)
	n := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "1h", "1h"))
	ns := n.ns("api")
	ctx := context.Background()
	ns.Increment(ctx, "k", time.Hour, 1)
	if err := n.app.Stop(); err != nil {
		t.Fatal(err)
	}
	ns.Increment(ctx, "k", time.Hour, 1)
	n.cleanup()
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 2 {
		t.Fatalf("store holds %v, want both hits", got)
	}
}

// TestSynchronousAnswersCountHitsOnTheirWay recovers a synchronous
// namespace whose local hits are still on their way to the store: the
// first answers count them already.
func TestSynchronousAnswersCountHitsOnTheirWay(t *testing.T) {
	srv := redistest.Start(t)
	ns := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "0", "1h")).ns("api")
	ctx := context.Background()
	srv.Kill()
	for range 5 {
		ns.Increment(ctx, "k", time.Hour, 1)
	}
	// Let a retry run take hits and fail with them. A run may take the
	// first hits alone; the others then wait in the zone until the store
	// is back (a run takes nothing new while a failed batch waits), and
	// the answers count both.
	poll.Until(t, 10*time.Second, "a failed retry run", func() bool {
		return ns.runner.pendingDiffs() >= 1
	})
	srv.Restart()
	// Hits try the store again once a run found it back.
	poll.Until(t, 10*time.Second, "the store to be in use again", func() bool { return !ns.health.down() })
	s := ns.Increment(ctx, "k", time.Hour, 1)
	if s.Current+s.Previous != 6 { // both windows: the hour may have ended
		t.Fatalf("first answer after recovery: %v + %v, want 6 (5 on their way, 1 now)", s.Current, s.Previous)
	}
	poll.Until(t, 10*time.Second, "the store to hold 6", func() bool {
		return storeTotal(t, srv.Addr, "k", time.Hour) == 6
	})
}

// TestSynchronousPauseCountsOnce freezes Redis under a synchronous
// namespace: the hit caught in the freeze is applied when Redis resumes and
// is not pushed again; the hits counted locally meanwhile are pushed once.
func TestSynchronousPauseCountsOnce(t *testing.T) {
	srv := redistest.Start(t)
	ns := start(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "0", "1h")).ns("api")
	warmUp(t, ns)
	ctx := context.Background()
	for range 3 {
		ns.Increment(ctx, "k", time.Hour, 1)
	}
	srv.Pause()
	ns.Increment(ctx, "k", time.Hour, 1) // times out in Redis's socket
	for range 3 {
		ns.Increment(ctx, "k", time.Hour, 1) // the store is marked down: local
	}
	srv.Resume()
	poll.Until(t, 15*time.Second, "the store to hold 7", func() bool {
		return storeTotal(t, srv.Addr, "k", time.Hour) == 7
	})
	awaitRuns(t, "api", 2) // a retry run must not push anything again
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 7 {
		t.Fatalf("store holds %v, want 7", got)
	}
	// Both windows: the hour may have ended during the test.
	if got := ns.SlidingWindow("k", time.Hour, nil); got.Current+got.Previous != 7 {
		t.Fatalf("local count %v + %v, want 7", got.Current, got.Previous)
	}
}

// TestReloadElsewhereFlushes reloads a namespace into another zone, and
// into local only: the diffs the new config will not take over are pushed
// when the old one stops, and those counted after its Stop at cleanup.
func TestReloadElsewhereFlushes(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, tc := range []struct {
		next string
		late float64 // what a hit counted after Stop adds to the store
	}{
		{`{"zones": {"z2": {}}, "namespaces": {"api": {"zone": "z2", "sync_rate": "1h", "window_sizes": ["1h"],
			"strategy": {"module": "redis", "addresses": ["` + srv.Addr + `"]}}}}`, 1},
		// The counters are local only from now on: a late hit stays here.
		{`{"namespaces": {"api": {"sync_rate": "off"}}}`, 0},
	} {
		next := tc.next
		pool := caddy.NewUsagePool()
		old := start(t, pool, nsConfig(srv.Addr, "1h", "1h"))
		key := "moved-" + strconv.Itoa(int(time.Now().UnixNano()))
		old.ns("api").Increment(ctx, key, time.Hour, 1)
		start(t, pool, next)
		if err := old.app.Stop(); err != nil {
			t.Fatal(err)
		}
		if got := storeTotal(t, srv.Addr, key, time.Hour); got != 1 {
			t.Fatalf("next %s: after the old config's stop the store holds %v, want 1", next, got)
		}
		old.ns("api").Increment(ctx, key, time.Hour, 1) // a request finishing late
		old.cleanup()
		if got := storeTotal(t, srv.Addr, key, time.Hour); got != 1+tc.late {
			t.Fatalf("next %s: after cleanup the store holds %v, want %v", next, got, 1+tc.late)
		}
	}
}

// TestStopFlushesWithinOneTimeout stops a config of five namespaces whose
// store hangs: they give up together, after one flush_timeout, not five.
func TestStopFlushesWithinOneTimeout(t *testing.T) {
	srv := redistest.Start(t)
	cfg := `{"flush_timeout": "2s", "namespaces": {`
	for i := range 5 {
		if i > 0 {
			cfg += ","
		}
		cfg += fmt.Sprintf(`"ns%d": {"sync_rate": "1h", "window_sizes": ["1h"], "strategy": {"module": "redis", "addresses": [%q]}}`, i, srv.Addr)
	}
	n := start(t, caddy.NewUsagePool(), cfg+"}}")
	for i := range 5 {
		n.ns("ns"+strconv.Itoa(i)).Increment(context.Background(), "k", time.Hour, 1)
	}
	srv.Pause()
	defer srv.Resume()
	began := time.Now()
	n.stop()
	// One after another, the five would take 10s.
	if took := time.Since(began); took > 8*time.Second {
		t.Fatalf("stop and cleanup took %v with a flush_timeout of 2s for five namespaces", took)
	}
}

// TestIdleRunsDoNotHideAnOutage pauses Redis under a synchronous namespace
// whose failed hits leave nothing to push: the loop's idle runs must not
// take the store for recovered, so the outage is logged once, and its end
// not at all until the store answers.
func TestIdleRunsDoNotHideAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	n, err := provision(t, caddy.NewUsagePool(), nsConfig(srv.Addr, "0", "1h"))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	ns := n.ns("api")
	ns.health.logger = zap.New(core)
	// The paused hits below take about 7s; a slow machine must not stretch
	// them past the log interval.
	ns.health.logEvery = time.Minute
	if err := n.app.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns.Increment(ctx, "k", time.Hour, 1)
	srv.Pause()
	for range 3 {
		ns.Increment(ctx, "k", time.Hour, 1) // times out: maybe applied
		awaitRuns(t, "api", 2)               // an idle run ends after it
	}
	if got := logs.FilterMessageSnippet("reachable again").Len(); got != 0 {
		t.Fatalf("the store was reported back %d times while paused", got)
	}
	if got := logs.FilterMessageSnippet("store unreachable").Len(); got != 1 {
		t.Fatalf("the outage was logged %d times, want once", got)
	}
	srv.Resume()
	ns.Increment(ctx, "k", time.Hour, 1)
	// The hits that timed out are pushed again under their own IDs, which
	// Redis skips: it ran them when it resumed.
	poll.Until(t, 20*time.Second, "the store to hold 5", func() bool {
		return storeTotal(t, srv.Addr, "k", time.Hour) == 5
	})
	poll.Until(t, 20*time.Second, "the recovery to be logged", func() bool {
		return logs.FilterMessageSnippet("reachable again").Len() == 1
	})
	poll.Until(t, 20*time.Second, "the retries to be pushed", func() bool {
		return ns.runner.pendingDiffs() == 0
	})
	if got := storeTotal(t, srv.Addr, "k", time.Hour); got != 5 {
		t.Fatalf("store holds %v after the retries, want 5", got)
	}
}
