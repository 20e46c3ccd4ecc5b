package syncapp

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/memory"
)

// pausedSlots is a memory store's slots that a test can pause, as SIGSTOP
// pauses a Redis server: while paused, calls time out without an answer,
// releases and renewals are lost, and acquires are applied when the store
// resumes, after their callers gave up on them.
type pausedSlots struct {
	*memory.Store
	mu      sync.Mutex
	paused  bool
	resumed chan struct{}
	late    sync.WaitGroup
	lost    int // slots whose release was lost
}

func (p *pausedSlots) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused, p.resumed = true, make(chan struct{})
}

func (p *pausedSlots) resume() {
	p.mu.Lock()
	p.paused = false
	close(p.resumed)
	p.mu.Unlock()
	p.late.Wait()
}

// isPaused returns whether the store is paused, and a channel closed when
// it resumes.
func (p *pausedSlots) isPaused() (bool, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused, p.resumed
}

func (p *pausedSlots) AcquireSlot(ctx context.Context, namespace, key, id string, max int, lease time.Duration) (int, bool, error) {
	if paused, resumed := p.isPaused(); paused {
		p.late.Go(func() {
			<-resumed
			_, _, _ = p.Store.AcquireSlot(context.Background(), namespace, key, id, max, lease)
		})
		return 0, false, context.DeadlineExceeded
	}
	return p.Store.AcquireSlot(ctx, namespace, key, id, max, lease)
}

func (p *pausedSlots) ReleaseSlots(ctx context.Context, namespace string, slots []strategy.Slot) error {
	if paused, _ := p.isPaused(); paused {
		p.mu.Lock()
		p.lost += len(slots)
		p.mu.Unlock()
		return context.DeadlineExceeded
	}
	return p.Store.ReleaseSlots(ctx, namespace, slots)
}

func (p *pausedSlots) RenewSlots(ctx context.Context, namespace string, slots []strategy.Slot, lease time.Duration) error {
	if paused, _ := p.isPaused(); paused {
		return context.DeadlineExceeded
	}
	return p.Store.RenewSlots(ctx, namespace, slots, lease)
}

// TestSlotsFreeAfterAnOutage: requests that ended while the store was
// paused, and acquires that timed out then and were applied when it
// resumed, leave no slot behind for their leases (25 s): the key is free
// again within a few retries of the store coming back.
func TestSlotsFreeAfterAnOutage(t *testing.T) {
	initMetrics()
	store := &pausedSlots{Store: memoryDataSet(t.Name())}
	h := newSlotHolder(zap.NewNop(), newHealth("api", zap.NewNop()))
	defer h.close()
	ctx := context.Background()
	const max = 5

	var held []heldSlot
	for range max {
		slot, ok, decided := h.acquire(ctx, store, nil, "api", "k", max)
		if !ok || !decided {
			t.Fatal("a free slot was not taken")
		}
		held = append(held, slot)
	}
	store.pause()
	for _, slot := range held { // their requests end during the outage
		h.release(slot)
	}
	for range 3 { // acquires that time out, and land when the store resumes
		if _, _, decided := h.acquire(ctx, store, nil, "api", "k", max); decided {
			t.Fatal("a paused store decided an acquire")
		}
	}
	// Let the loop try the releases while the store is paused.
	poll.Until(t, 10*time.Second, "the releases to fail", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return store.lost >= max+3
	})
	store.resume()

	poll.Until(t, 10*time.Second, "the key's slots to be free after the outage", func() bool {
		n, _, err := store.Store.AcquireSlot(ctx, "api", "k", "probe", max, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		_ = store.Store.ReleaseSlots(ctx, "api", []strategy.Slot{{Key: "k", ID: "probe"}})
		return n == 1 // the probe's own
	})
}
