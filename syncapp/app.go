package syncapp

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/ratesync/caddy-ratelimit/internal/promreg"
	"github.com/ratesync/caddy-ratelimit/window"
)

func init() {
	caddy.RegisterModule(App{})
}

// DefaultName is the namespace and the zone that always exist. Unless
// configured otherwise, the default namespace is local only and lives in
// the default zone.
const DefaultName = "default"

// DefaultFlushTimeout bounds the push of pending diffs at a graceful stop.
const DefaultFlushTimeout = 5 * time.Second

// App is the rate_limit app: counter zones and namespaces that sync their
// counts with a central store, so that a fleet of Caddy servers enforces
// one shared limit.
//
// Every node counts hits in memory, in a zone. Each namespace pushes its
// per-key diffs to its store and fetches the merged counts, on a timer
// (periodic), on every hit (synchronous), or never (local). Zones and
// sync loops survive config reloads: a zone whose name is unchanged keeps
// every counter, and a namespace's unpushed diffs carry over.
type App struct {
	// Zones by name. A zone holds the counters of the namespaces that use
	// it, bounded in keys. The zone "default" always exists.
	Zones map[string]*ZoneConfig `json:"zones,omitempty"`

	// Namespaces by name. A namespace is a set of counters that syncs with
	// one store at one rate. The namespace "default" always exists: local
	// only, in the default zone, unless configured here.
	Namespaces map[string]*NamespaceConfig `json:"namespaces,omitempty"`

	// How long a graceful stop waits for pending diffs to reach the store.
	// Default: 5s.
	FlushTimeout caddy.Duration `json:"flush_timeout,omitempty"`

	namespaces map[string]*Namespace
	loops      map[string]*loop // by namespace
	zones      map[string]*zoneHolder
	maxKeys    map[string]int
	acquired   []poolKey
	unflushed  map[*Namespace]bool // whose push at Stop failed
	pool       *caddy.UsagePool
	clock      window.Clock // of the zones the app makes; nil: the system's (tests set one)
	logger     *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rate_limit",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision checks the config, takes the zones, namespaces and stores it
// names from the pool (creating those that are new) and loads the
// strategies. It starts nothing and dials nothing: that waits for Start
// and the first sync.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	if a.pool == nil {
		a.pool = defaultPool
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	if err := promreg.Register(ctx.GetMetricsRegistry(), buildInfo); err != nil {
		return fmt.Errorf("registering metrics: %v", err)
	}
	if a.FlushTimeout < 0 {
		return fmt.Errorf("flush_timeout: must not be negative, got %v", time.Duration(a.FlushTimeout))
	}
	if err := a.provisionZones(); err != nil {
		return err
	}
	namespaces := map[string]*NamespaceConfig{DefaultName: nil} // nil: the defaults
	maps.Copy(namespaces, a.Namespaces)
	a.namespaces = make(map[string]*Namespace, len(namespaces))
	a.loops = make(map[string]*loop, len(namespaces))
	for _, name := range slices.Sorted(maps.Keys(namespaces)) {
		ns, err := a.provisionNamespace(ctx, name, namespaces[name])
		if err != nil {
			return fmt.Errorf("namespace %q: %w", name, err)
		}
		a.namespaces[name] = ns
	}
	return nil
}

func (a *App) provisionZones() error {
	a.zones = make(map[string]*zoneHolder)
	a.maxKeys = map[string]int{DefaultName: DefaultMaxKeys}
	for name, z := range a.Zones {
		if name == "" {
			return fmt.Errorf("zones: a zone needs a name")
		}
		switch {
		case z == nil || z.MaxKeys == 0:
			a.maxKeys[name] = DefaultMaxKeys
		case z.MaxKeys < 0:
			return fmt.Errorf("zone %q: max_keys must be positive, got %d", name, z.MaxKeys)
		default:
			a.maxKeys[name] = z.MaxKeys
		}
	}
	for _, name := range slices.Sorted(maps.Keys(a.maxKeys)) {
		key := poolKey{"zone", name}
		v, _, err := a.pool.LoadOrNew(key, func() (caddy.Destructor, error) {
			return newZoneHolder(name, a.maxKeys[name], a.clock)
		})
		if err != nil {
			return fmt.Errorf("zone %q: %w", name, err)
		}
		a.acquired = append(a.acquired, key)
		a.zones[name] = v.(*zoneHolder)
	}
	return nil
}

func (a *App) provisionNamespace(ctx caddy.Context, name string, cfg *NamespaceConfig) (*Namespace, error) {
	if name == "" {
		return nil, fmt.Errorf("a namespace needs a name")
	}
	if cfg == nil {
		cfg = &NamespaceConfig{}
	}
	zoneName := cmp.Or(cfg.Zone, DefaultName)
	zh, ok := a.zones[zoneName]
	if !ok {
		return nil, fmt.Errorf("zone: unknown zone %q (zones: %s)", zoneName, strings.Join(slices.Sorted(maps.Keys(a.zones)), ", "))
	}
	if err := cfg.SyncRate.Validate(); err != nil {
		return nil, err
	}
	ns := &Namespace{name: name, mode: cfg.SyncRate.Mode()}
	if err := validateSyncAbove(cfg.SyncAbove, ns.mode); err != nil {
		return nil, err
	}
	var err error
	if ns.onFailure, err = validateFailurePolicy(cfg.OnStoreFailure, ns.mode); err != nil {
		return nil, err
	}
	if ns.mode == Periodic {
		ns.rate = time.Duration(*cfg.SyncRate)
	}
	if cfg.SyncAbove != nil {
		ns.syncAbove = *cfg.SyncAbove
	}
	if ns.counters, err = zh.zone.Namespace(name); err != nil {
		return nil, err
	}
	ns.sizes = &windowSizes{namespace: name} // openStore adds its store's check

	var storeKey poolKey // of the store in the pool, unless local
	switch {
	case cfg.SyncRate == nil && cfg.StrategyRaw != nil:
		// Without sync_rate a namespace is local only, so the strategy
		// would never be used: most likely sync_rate was forgotten.
		return nil, fmt.Errorf("strategy: a namespace without sync_rate is local only and never uses its strategy: set sync_rate (0 or a duration such as 100ms), or remove the strategy")
	case ns.mode == Local && cfg.StrategyRaw != nil:
		// sync_rate off, written out: the store is switched off on purpose.
		a.logger.Warn("namespace is local only: its strategy is not used (sync_rate is off)", zap.String("namespace", name))
	case ns.mode != Local && cfg.StrategyRaw == nil:
		return nil, fmt.Errorf("sync_rate %v needs a strategy, such as redis", cfg.SyncRate)
	case ns.mode != Local:
		if storeKey, err = a.openStore(ctx, ns, cfg); err != nil {
			return nil, err
		}
	}

	key := poolKey{"namespace", name}
	v, _, err := a.pool.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newFleetState(name, a.logger.Named("sync"), a.pool), nil
	})
	if err != nil {
		return nil, err
	}
	a.acquired = append(a.acquired, key)
	state := v.(*fleetState)
	ns.use(state, storeKey, a.logger.Named("sync"))
	a.loops[name] = state.loop
	for _, d := range cfg.WindowSizes {
		if err := ns.AddWindowSizes(time.Duration(d)); err != nil {
			return nil, fmt.Errorf("window_sizes: %v", err)
		}
	}
	return ns, nil
}

// Start applies the config to the pooled zones and namespaces: zones take
// their new capacity, and each namespace's sync loop starts working for
// this config.
func (a *App) Start() error {
	for name, zh := range a.zones {
		zh.claim(a, a.maxKeys[name])
		zh.start(a.logger)
	}
	for name, ns := range a.namespaces {
		ns.health.onStore(ns.storeHealth)
		ns.health.shareOnFailure(ns.shareOnFailure())
		ns.runner.track()
		a.loops[name].attach(ns.runner)
		if sizes := ns.WindowSizes(); ns.mode == Periodic && len(sizes) > 0 && ns.rate > sizes[0] {
			a.logger.Warn("sync_rate is longer than the namespace's smallest window: other nodes will see its hits late, or not at all",
				zap.String("namespace", ns.name), zap.Duration("sync_rate", ns.rate), zap.Duration("window", sizes[0]))
		}
	}
	a.register() // for the admin API
	a.logger.Info("rate limiting started", zap.String("version", Version), zap.Int("namespaces", len(a.namespaces)))
	return nil
}

// takesOver reports whether next, the runner that runs after r, pushes
// what r has pending: it counts in the same zone and syncs with a store.
func takesOver(next, r *runner) bool {
	return next != nil && next.counters == r.counters && next.store != nil
}

// Stop hands the namespaces' sync loops back to the config that runs next,
// if any. A namespace whose next config counts in the same zone and syncs
// with a store leaves its pending diffs to that config's loop (on a failed
// reload, that is the config that keeps running). Every other namespace
// (at the final stop, or moved to another zone, or made local) pushes what
// it has through its own store now; all of them within one flush_timeout.
func (a *App) Stop() error {
	a.unregister()
	var flush []*Namespace
	for _, name := range slices.Sorted(maps.Keys(a.namespaces)) {
		ns := a.namespaces[name]
		next := a.loops[name].detach(ns.runner)
		if next != nil {
			next.track() // on a failed reload, the config that keeps running
		}
		if !takesOver(next, ns.runner) {
			flush = append(flush, ns)
		}
	}
	a.unflushed = a.flush(flush)
	for _, zh := range a.zones {
		zh.release(a)
	}
	return nil
}

// flush pushes what the namespaces have pending, all at once, within
// flush_timeout, and returns those it could not push.
func (a *App) flush(namespaces []*Namespace) map[*Namespace]bool {
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(time.Duration(a.FlushTimeout), DefaultFlushTimeout))
	defer cancel()
	var mu sync.Mutex
	failed := make(map[*Namespace]bool)
	var wg sync.WaitGroup
	for _, ns := range namespaces {
		if ns.store == nil {
			continue
		}
		wg.Go(func() {
			if err := ns.runner.run(ctx, false); err != nil {
				a.logger.Error("pushing pending diffs", zap.String("namespace", ns.name), zap.Error(err))
				mu.Lock()
				failed[ns] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// Cleanup gives back the pooled objects this config took. Namespaces that
// no later config took over first push what requests counted after Stop
// (other apps, such as http, may stop after this one), unless their Stop
// could not reach the store. The last reference to a zone, a namespace's
// sync loop or a store destroys it: a store closes its connections once
// neither a config nor a sync loop uses it.
func (a *App) Cleanup() error {
	var flush []*Namespace
	for _, name := range slices.Sorted(maps.Keys(a.namespaces)) {
		ns := a.namespaces[name]
		if !a.unflushed[ns] && !takesOver(a.loops[name].current(), ns.runner) && ns.runner.hasPending() {
			flush = append(flush, ns)
		}
	}
	a.flush(flush)
	for _, key := range a.acquired {
		if _, err := a.pool.Delete(key); err != nil {
			a.logger.Error("releasing "+key.kind, zap.String("name", key.name), zap.Error(err))
		}
	}
	a.acquired = nil
	return nil
}

// Namespace returns the namespace of the given name. An unknown name is an
// error that lists the namespaces that exist.
func (a *App) Namespace(name string) (*Namespace, error) {
	if ns, ok := a.namespaces[name]; ok {
		return ns, nil
	}
	return nil, fmt.Errorf("unknown namespace %q (namespaces: %s)", name, strings.Join(slices.Sorted(maps.Keys(a.namespaces)), ", "))
}

// Increment adds value to key's current window of the given size in a
// namespace and returns the window's state after it. It is Kong's
// increment; see Namespace.Increment.
func (a *App) Increment(ctx context.Context, namespace, key string, size time.Duration, value float64) (window.Sample, error) {
	ns, err := a.Namespace(namespace)
	if err != nil {
		return window.Sample{}, err
	}
	return ns.Increment(ctx, key, size, value), nil
}

// SlidingWindow returns key's window state of the given size in a
// namespace, optionally with the current diff replaced. It is Kong's
// sliding_window; see Namespace.SlidingWindow.
func (a *App) SlidingWindow(namespace, key string, size time.Duration, curDiff *float64) (window.Sample, error) {
	ns, err := a.Namespace(namespace)
	if err != nil {
		return window.Sample{}, err
	}
	return ns.SlidingWindow(key, size, curDiff), nil
}

// Sync pushes a namespace's pending diffs and fetches merged counts now.
// It is Kong's sync; see Namespace.Sync.
func (a *App) Sync(ctx context.Context, namespace string) error {
	ns, err := a.Namespace(namespace)
	if err != nil {
		return err
	}
	return ns.Sync(ctx)
}

// Fetch sets the local counts of the given keys of a namespace to the
// store's. It is Kong's fetch, for the keys given rather than the whole
// namespace; see Namespace.Fetch.
func (a *App) Fetch(ctx context.Context, namespace string, keys []string) error {
	ns, err := a.Namespace(namespace)
	if err != nil {
		return err
	}
	return ns.Fetch(ctx, keys)
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
