package redis

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// testTimeout bounds every test's calls to Redis: generous, for a shared
// and noisy machine.
const testTimeout = 30 * time.Second

// testCtx returns a context that ends with the test or after testTimeout.
func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// open opens a store of r (filled-in configuration) and closes it when the
// test ends.
func open(t testing.TB, r *Redis) *Store {
	t.Helper()
	return strategytest.Open(t, r.Open)
}

// startStandalone starts a redis-server and returns a store using it.
func startStandalone(t testing.TB) (*redistest.Server, *Store) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, open(t, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(5 * time.Second)})
}

// startFrozen starts a redis-server and a store using it whose clock
// stands still at steadyNow, and returns a plain client of the server, the
// store and that time in Unix nanoseconds.
func startFrozen(t testing.TB) (*goredis.Client, *Store, int64) {
	t.Helper()
	srv, r := startStandalone(t)
	now := steadyNow().UnixNano()
	r.now = func() time.Time { return time.Unix(0, now) }
	return srv.Client(""), r, now
}

// ids gives batch IDs unique within the test binary.
var ids struct {
	sync.Mutex
	n int
}

func newID() string {
	ids.Lock()
	defer ids.Unlock()
	ids.n++
	return fmt.Sprintf("batch-%d-%d", time.Now().UnixNano(), ids.n)
}

// countsByWindow indexes counts by key, size and start.
type winKey struct {
	key   string
	size  time.Duration
	start int64
}

func countsByWindow(t testing.TB, counts []window.Count) map[winKey]float64 {
	t.Helper()
	m := make(map[winKey]float64, len(counts))
	for _, c := range counts {
		k := winKey{c.Key, c.Size, c.Start}
		if _, dup := m[k]; dup {
			t.Fatalf("count reported twice: %+v", c)
		}
		m[k] = c.Value
	}
	return m
}

// keysOf lists the keys that the strategy writes in a standalone server,
// without SCAN's duplicates.
func keysOf(t testing.TB, c *goredis.Client, pattern string) []string {
	t.Helper()
	keys, err := c.Keys(testCtx(t), pattern).Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	return keys
}

// hookCounts counts what a client sends: Process calls (one command, one
// round trip each), ProcessPipeline calls (one round trip per node each)
// and the commands those pipelines carry.
type hookCounts struct {
	mu        sync.Mutex
	process   int
	pipelines int
	piped     int
	names     map[string]int
}

func (h *hookCounts) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.process, h.pipelines, h.piped = 0, 0, 0
	h.names = make(map[string]int)
}

func (h *hookCounts) get() (process, pipelines, piped int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.process, h.pipelines, h.piped
}

func (h *hookCounts) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *hookCounts) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.mu.Lock()
		h.process++
		if h.names == nil {
			h.names = make(map[string]int)
		}
		h.names[cmd.Name()]++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *hookCounts) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.mu.Lock()
		h.pipelines++
		h.piped += len(cmds)
		if h.names == nil {
			h.names = make(map[string]int)
		}
		for _, c := range cmds {
			h.names[c.Name()]++
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// serverCalls returns the server's calls of each command since the last
// CONFIG RESETSTAT, from INFO commandstats, leaving out the INFO and CONFIG
// calls of the test itself. Commands that scripts run count too.
func serverCalls(t testing.TB, c *goredis.Client) map[string]int {
	t.Helper()
	info, err := c.InfoMap(testCtx(t), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	calls := make(map[string]int)
	for name, fields := range info["Commandstats"] {
		name = trimPrefix(name, "cmdstat_")
		if name == "info" || name == "config|resetstat" {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(fields, "calls=%d", &n); err != nil {
			t.Fatalf("parsing commandstats %s=%s: %v", name, fields, err)
		}
		calls[name] = n
	}
	return calls
}

func trimPrefix(s, p string) string {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

func resetStats(t testing.TB, c *goredis.Client) {
	t.Helper()
	if err := c.ConfigResetStat(testCtx(t)).Err(); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
}

// hitOne applies a hit to one window with no limit, and returns the
// window's counts after it.
func hitOne(ctx context.Context, r *Store, ns, key string, size time.Duration, start int64, value float64) (cur, prev float64, err error) {
	counts, _, err := r.Hit(ctx, ns, key, "", []strategy.WindowHit{{Size: size, Start: start, Value: value, Max: math.Inf(1)}}, false)
	if err != nil {
		return 0, 0, err
	}
	return counts[0].Current, counts[0].Previous, nil
}

// steadyNow returns the middle of the current or the next minute,
// whichever is nearer, for tests to count at. The windows of a minute or
// more that hold it, and those before them, stay in Redis for at least
// half a minute from now, and no minute ends around it: a test that takes
// a few seconds cannot see its counters expire or be skipped as ended.
func steadyNow() time.Time {
	const minute = int64(time.Minute)
	now := time.Now().UnixNano()
	start := window.Start(now, time.Minute)
	if now-start >= minute/2 {
		start += minute
	}
	return time.Unix(0, start+minute/2)
}
