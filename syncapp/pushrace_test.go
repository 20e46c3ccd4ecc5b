package syncapp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	caddy.RegisterModule(new(pushGateStrategy))
}

// pushGateStrategy opens the pushGateStore registered under its name.
type pushGateStrategy struct {
	Name string `json:"name"`
}

var pushGateStores sync.Map // by name

func (*pushGateStrategy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: strategy.Namespace + ".test_push_gate", New: func() caddy.Module { return new(pushGateStrategy) }}
}
func (g *pushGateStrategy) StoreKey() string                 { return g.Name }
func (*pushGateStrategy) ValidateWindow(time.Duration) error { return nil }
func (g *pushGateStrategy) OpenStore() (strategy.Store, error) {
	v, ok := pushGateStores.Load(g.Name)
	if !ok {
		return nil, fmt.Errorf("no gated store %q", g.Name)
	}
	return v.(*pushGateStore), nil
}

// pushGateStore is a real store whose first push and first read (a hit
// of the hit queue) wait for the test. The push closes pushing when it
// starts, waits for release, and closes pushed once the store has it.
// The read is answered by the store at once, then closes readAnswered and
// is handed back when the test closes readRelease.
type pushGateStore struct {
	strategy.BatchHitter
	pushing, release, pushed  chan struct{}
	readAnswered, readRelease chan struct{}
	firstPush, firstRead      sync.Once
}

func newPushGateStore(t *testing.T, inner strategy.Store) (name string, g *pushGateStore) {
	name = fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
	g = &pushGateStore{
		BatchHitter: inner.(strategy.BatchHitter),
		pushing:     make(chan struct{}), release: make(chan struct{}), pushed: make(chan struct{}),
		readAnswered: make(chan struct{}), readRelease: make(chan struct{}),
	}
	pushGateStores.Store(name, g)
	t.Cleanup(func() { // a test that failed early must not leave its node's flush waiting
		for _, ch := range []chan struct{}{g.release, g.readRelease} {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	})
	return name, g
}

func (g *pushGateStore) PushDiffs(ctx context.Context, b strategy.Batch) error {
	first := false
	g.firstPush.Do(func() { first = true })
	if !first {
		return g.BatchHitter.PushDiffs(ctx, b)
	}
	close(g.pushing)
	<-g.release
	err := g.BatchHitter.PushDiffs(ctx, b)
	close(g.pushed)
	return err
}

func (g *pushGateStore) HitBatch(ctx context.Context, namespace, id string, hits []strategy.HitRequest, results []strategy.HitResult) {
	g.BatchHitter.HitBatch(ctx, namespace, id, hits, results)
	g.firstRead.Do(func() {
		close(g.readAnswered)
		<-g.readRelease
	})
}

// wait waits for ch, or fails the test after a generous bound.
func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestSlowFirstPushKeepsTheNodesOwnHits has a periodic node reject a key
// that no run has fetched yet, and read it from the store, while the
// node's first run takes the key's hits and pushes them slowly (as to a
// fresh PostgreSQL, which makes its tables first): the store answers the
// read without the node's hits. The node must not forget them, whether
// the push is still on its way when the answer is seen, or landed
// meanwhile: of 20 hits of a key with a limit of 5, one node admits 5,
// at any sync rate.
func TestSlowFirstPushKeepsTheNodesOwnHits(t *testing.T) {
	awayFromHourEnd(time.Minute)
	eachStore(t, func(t *testing.T, s fleetStore) {
		for _, rate := range []string{"100ms", "1s"} {
			for _, landed := range []bool{false, true} {
				t.Run(fmt.Sprintf("sync_rate=%s/push_landed_before_the_answer_is_seen=%v", rate, landed), func(t *testing.T) {
					name, g := newPushGateStore(t, s.open(t))
					cfg := fmt.Sprintf(`{"namespaces": {"api": {"sync_rate": %q, "window_sizes": ["1h"], "strategy": {"module": "test_push_gate", "name": %q}}}}`, rate, name)
					ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
					key := fmt.Sprintf("k-%d", rand.Uint64())
					ctx := context.Background()
					limits := []Limit{{Size: time.Hour, Max: 5}}
					var admitted atomic.Int64
					hit := func() {
						out := make([]window.Sample, 1)
						if ns.Hit(ctx, key, limits, 1, false, true, out) < 0 {
							admitted.Add(1)
						}
					}
					for range 5 {
						hit()
					}
					sixth := make(chan struct{})
					go func() { defer close(sixth); hit() }()
					wait(t, g.readAnswered, "the store's answer to the read of the rejected key")
					wait(t, g.pushing, "the first run's push")
					if landed {
						close(g.release)
						wait(t, g.pushed, "the push to land")
						poll.Until(t, 10*time.Second, "the push to leave the outbox", func() bool {
							m, _ := ns.runner.outbox.inflight.load()
							return m == nil
						})
					}
					close(g.readRelease)
					wait(t, sixth, "the sixth hit")
					for range 14 {
						hit()
					}
					if !landed {
						close(g.release)
						wait(t, g.pushed, "the push to land")
					}
					if n := admitted.Load(); n != 5 {
						t.Fatalf("one node admitted %d of 20 hits with a limit of 5", n)
					}
					if err := ns.Sync(ctx); err != nil {
						t.Fatal(err)
					}
					got := s.total(t, key, time.Hour)
					t.Logf("admitted %d of 20; the store counts %v", admitted.Load(), got)
					if got != 5 {
						t.Fatalf("the store counts %v hits, want 5 (disable_penalty)", got)
					}
				})
			}
		}
	})
}
