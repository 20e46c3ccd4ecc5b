package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// With Redis unreachable, go-redis's own lines (its pool's failed dials)
// reach zap, not stderr, at most one per format every ten seconds.
func TestGoRedisLogsToZap(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(core)
	old := goredisLog.setLogger(func() *zap.Logger { return logger })
	t.Cleanup(func() { goredisLog.setLogger(old) })

	r := open(t, &Redis{Addresses: []string{"127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))}})
	ctx := testCtx(t)
	start := window.Start(time.Now().UnixNano(), time.Hour)
	for range 5 {
		err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "ns", Diffs: []window.Diff{{Key: "k", Size: time.Hour, Start: start, Value: 1}}})
		if err == nil {
			t.Fatal("a push to a closed port succeeded")
		}
	}
	var dials []observer.LoggedEntry
	for _, e := range logs.All() {
		if strings.Contains(e.Message, "failed to dial") {
			dials = append(dials, e)
		}
	}
	// Five pushes dial several times each; one line tells of it.
	if len(dials) != 1 {
		t.Fatalf("%d lines of failed dials reached zap, want 1: %v", len(dials), logs.All())
	}
	e := dials[0]
	if e.LoggerName != "" || e.Level != zapcore.WarnLevel || strings.HasPrefix(e.Message, "redis:") || e.ContextMap()["source"] != "go-redis" {
		t.Errorf("the line is %+v, %v", e.Entry, e.ContextMap())
	}
}

// The throttle: one line per format per interval, and the next line of
// that format counts those held back.
func TestThrottledLog(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(core)
	now := time.Unix(1_700_000_000, 0)
	l := &throttledLog{every: 10 * time.Second, now: func() time.Time { return now }, logger: func() *zap.Logger { return logger }}
	ctx := context.Background()
	for i := range 5 {
		l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 2, i)
	}
	l.Printf(ctx, "sentinel: new master=%q addr=%q", "m", "a")
	now = now.Add(9 * time.Second)
	l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 2, 5)
	now = now.Add(time.Second)
	l.Printf(ctx, "redis: connection pool: failed to dial after %d attempts: %v", 2, 6)

	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Message)
		if n, ok := e.ContextMap()["suppressed"]; ok {
			got[len(got)-1] += " +" + strconv.Itoa(int(n.(int64)))
		}
	}
	want := []string{
		"connection pool: failed to dial after 2 attempts: 0",
		`sentinel: new master="m" addr="a"`,
		"connection pool: failed to dial after 2 attempts: 6 +5",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
