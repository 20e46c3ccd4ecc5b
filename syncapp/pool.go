package syncapp

import (
	"maps"
	"slices"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/lockorder"
	"github.com/ratesync/caddy-ratelimit/window"
)

// defaultPool holds what outlives a config: zones (the counters), each
// namespace's fleet state (its sync loop, outbox, bans, slots; see
// fleetState) and stores (pooledStore). Each loaded config takes a
// reference to every zone, namespace and store it names and gives it back
// in Cleanup, so an object survives a reload whenever its name (a store's:
// its settings) does. Tests give apps pools of their own to play several nodes in one
// process.
var defaultPool = caddy.NewUsagePool()

// poolKey names a pooled object; each kind has names of its own.
type poolKey struct {
	kind string // "zone", "namespace" or "store"
	name string
}

// sweepInterval is how often a zone forgets keys nobody touches any more.
const sweepInterval = time.Minute

// zoneHolder is a pooled zone, with the goroutine that sweeps it.
type zoneHolder struct {
	name string
	zone *window.Zone

	mu     lockorder.Mutex[zoneHolderLock]
	claims map[*App]int // max_keys by started config

	sweeper worker
}

func newZoneHolder(name string, maxKeys int, clock window.Clock) (*zoneHolder, error) {
	z, err := window.NewZone(maxKeys, clock)
	if err != nil {
		return nil, err
	}
	return &zoneHolder{name: name, zone: z, claims: make(map[*App]int), sweeper: newWorker("sweeping zone")}, nil
}

// claim records the capacity a started config wants. While configs
// overlap the zone keeps the largest, so that a reload which shrinks it,
// or fails, evicts nothing until the config that needed the room is gone.
func (h *zoneHolder) claim(a *App, maxKeys int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claims[a] = maxKeys
	h.resize()
}

// release forgets a stopped config's claim.
func (h *zoneHolder) release(a *App) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.claims, a)
	h.resize()
}

func (h *zoneHolder) resize() {
	if len(h.claims) == 0 {
		return
	}
	// The largest claim; positive: checked at provision.
	_ = h.zone.Resize(slices.Max(slices.Collect(maps.Values(h.claims))))
}

// start arms the sweeper once. It is called from App.Start, so that
// validating a config never starts a goroutine.
func (h *zoneHolder) start(logger *zap.Logger) {
	h.sweeper.start(logger, func() {
		t := time.NewTicker(sweepInterval)
		defer t.Stop()
		for {
			select {
			case <-h.sweeper.stopping():
				return
			case <-t.C:
				func() {
					defer recoverAndLog(logger, "sweeping zone")
					h.zone.Sweep()
				}()
			}
		}
	})
}

// Destruct stops the sweeper; the zone's memory goes with the last
// reference.
func (h *zoneHolder) Destruct() error {
	h.sweeper.close()
	return nil
}

// recoverAndLog keeps a panic in a background loop from taking the server
// down: a worker defers it around its function, and the loop and the
// sweeper around each run, so that a panic in one run spares the next.
func recoverAndLog(logger *zap.Logger, what string) {
	if r := recover(); r != nil {
		logger.Error("panic "+what, zap.Any("panic", r), zap.Stack("stack"))
	}
}
