package syncapp

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	caddy.RegisterModule(new(slowStrategy))
}

// slowStrategy opens a slowStore. Every load of it opens a store of its
// own (its StoreKey is new each time), so that every config's store is
// closed when that config and the sync runs that used it are done.
type slowStrategy struct{ key string }

func (*slowStrategy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  strategy.Namespace + ".test_slow",
		New: func() caddy.Module { return &slowStrategy{key: newBatchID()} },
	}
}

func (s *slowStrategy) StoreKey() string                     { return s.key }
func (s *slowStrategy) OpenStore() (strategy.Store, error)   { return new(slowStore), nil }
func (s *slowStrategy) ValidateWindow(d time.Duration) error { return nil }

// slowStore is a store whose pushes take a while, and which records any
// use after it was closed. Every instance adds to the same totals.
type slowStore struct {
	mu     sync.Mutex
	closed bool
}

var (
	slowStoreTotal atomic.Int64 // diff values pushed
	slowStoreLate  atomic.Int64 // calls after a Close
)

func (s *slowStore) use() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		slowStoreLate.Add(1)
	}
}

func (s *slowStore) PushDiffs(ctx context.Context, b strategy.Batch) error {
	s.use()
	time.Sleep(20 * time.Millisecond) // not a wait: the push is slow, as a far store's is
	s.use()
	for _, d := range b.Diffs {
		slowStoreTotal.Add(int64(d.Value))
	}
	return nil
}

func (s *slowStore) GetCounters(context.Context, string, []string, []time.Duration, time.Time) ([]window.Count, error) {
	s.use()
	return nil, nil
}

func (s *slowStore) Reset(context.Context, string, string, []time.Duration, time.Time) error {
	s.use()
	return nil
}

func (s *slowStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// TestStoresOutliveTheirRuns reloads a fast-syncing namespace over and
// over while hits go on, with pushes slow enough that a reload often lands
// during one: no store is used after it was closed, and every hit
// is pushed once.
func TestStoresOutliveTheirRuns(t *testing.T) {
	slowStoreTotal.Store(0)
	slowStoreLate.Store(0)
	cfg := `{"namespaces": {"api": {"sync_rate": "5ms", "window_sizes": ["1h"], "strategy": {"module": "test_slow"}}}}`
	hits := reloadUnderLoad(t, caddy.NewUsagePool(), cfg, 30, nil)
	if n := slowStoreLate.Load(); n != 0 {
		t.Errorf("stores were used %d times after they were closed", n)
	}
	if got := slowStoreTotal.Load(); got != int64(hits) {
		t.Errorf("pushed %d hits, want every one of the %d, once", got, hits)
	}
}
