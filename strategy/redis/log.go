package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/caddyserver/caddy/v2"
)

// logEvery is the least time between two lines of go-redis's log with the
// same format: a store that flaps would otherwise log a line per failed
// dial.
const logEvery = 10 * time.Second

// goredisLog receives go-redis's own log lines, which go-redis would write
// to stderr in a format of its own, outside Caddy's logs.
var goredisLog = &throttledLog{
	logger: func() *zap.Logger { return caddy.Log().Named("redis") },
	every:  logEvery,
	now:    time.Now,
}

// routeOnce makes goredisLog go-redis's logger when the first store opens.
// go-redis has one logger for the whole process.
var routeOnce sync.Once

func routeLogs() {
	routeOnce.Do(func() { goredis.SetLogger(goredisLog) })
}

// throttledLog is a go-redis logger that writes to a zap logger, at most
// one line per format string every so often: the lines it holds back are
// counted, and the next line of that format tells how many
// ("suppressed").
type throttledLog struct {
	every time.Duration
	now   func() time.Time

	mu sync.Mutex
	// logger returns the logger to write to, looked up per line: Caddy's
	// default logger changes when a config loads.
	logger func() *zap.Logger
	// formats are the formats logged, which are go-redis's string
	// constants, so there are few.
	formats map[string]*logFormat
}

// logFormat is what a throttledLog knows of one format.
type logFormat struct {
	last       time.Time // when its last line was written
	suppressed int       // lines held back since
}

// Printf writes a line of go-redis's log as a warning, unless a line of
// the same format was written less than l.every ago.
func (l *throttledLog) Printf(_ context.Context, format string, v ...any) {
	now := l.now()
	l.mu.Lock()
	f := l.formats[format]
	if f == nil {
		if l.formats == nil {
			l.formats = make(map[string]*logFormat)
		}
		f = new(logFormat)
		l.formats[format] = f
	} else if now.Sub(f.last) < l.every {
		f.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := f.suppressed
	f.last, f.suppressed = now, 0
	logger := l.logger()
	l.mu.Unlock()

	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	fields := []zap.Field{zap.String("source", "go-redis")}
	if suppressed > 0 {
		fields = append(fields, zap.Int("suppressed", suppressed))
	}
	logger.Warn(msg, fields...)
}

// setLogger makes l write to logger from now on, and returns the function
// that it wrote to before: for tests.
func (l *throttledLog) setLogger(logger func() *zap.Logger) func() *zap.Logger {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := l.logger
	l.logger, l.formats = logger, nil
	return old
}
