package syncapp

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// pooledStore is a store shared, through the app's pool, by every
// namespace of every loaded config that names the same strategy settings,
// as Caddy pools log writers by their WriterKey. Each config's namespace
// takes a reference when it is provisioned and gives it back in Cleanup,
// after its last push; a namespace's sync loop holds one too, for the
// stores of the namespaces attached to it (loop.attach and
// loop.releaseStores). The last reference closes the store's connections.
type pooledStore struct {
	store  strategy.Store
	health *storeHealth // what every namespace on it knows of it
}

// Destruct closes the store when nothing uses it any more.
func (p *pooledStore) Destruct() error { return p.store.Close() }

// storeKey is the pool key of the store a strategy opens: its module and
// its settings.
func storeKey(module caddy.ModuleID, st strategy.Strategy) poolKey {
	return poolKey{kind: "store", name: string(module) + "\x00" + st.StoreKey()}
}

// openStore loads a namespace's strategy module (it checks its settings
// and connects to nothing) and takes the store its settings name from the
// pool, opening it if no loaded config uses it yet, and returns its pool
// key. Stores connect when first used, so a config that is only validated
// never reaches them.
func (a *App) openStore(ctx caddy.Context, ns *Namespace, cfg *NamespaceConfig) (poolKey, error) {
	mod, err := ctx.LoadModule(cfg, "StrategyRaw")
	if err != nil {
		return poolKey{}, fmt.Errorf("strategy: %w", err)
	}
	id := mod.(caddy.Module).CaddyModule().ID
	st, ok := mod.(strategy.Strategy)
	if !ok {
		return poolKey{}, fmt.Errorf("strategy: module %s is not a rate limit strategy", id)
	}
	key := storeKey(id, st)
	v, _, err := a.pool.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := st.OpenStore()
		if err != nil {
			return nil, err
		}
		return &pooledStore{store: s, health: newStoreHealth(s)}, nil
	})
	if err != nil {
		return poolKey{}, fmt.Errorf("strategy %s: opening the store: %w", id.Name(), err)
	}
	a.acquired = append(a.acquired, key)
	ns.store, ns.storeHealth = v.(*pooledStore).store, v.(*pooledStore).health
	ns.storeModule = id.Name()
	ns.sizes = &windowSizes{namespace: ns.name, store: id.Name(), valid: st.ValidateWindow}
	ns.slotter, _ = ns.store.(strategy.Slotter)
	ns.banner, _ = ns.store.(strategy.Banner)
	if _, ok := ns.store.(strategy.Roster); !ok && ns.onFailure == FailShare {
		return poolKey{}, fmt.Errorf("on_store_failure: share needs a store that counts the fleet's nodes; the %s store cannot", id.Name())
	}
	if _, ok := ns.store.(strategy.Hitter); !ok {
		switch {
		case ns.mode == Synchronous:
			return poolKey{}, fmt.Errorf("sync_rate 0: the %s store cannot apply synchronous hits; use a periodic sync_rate such as 100ms", id.Name())
		case ns.syncAbove > 0:
			return poolKey{}, fmt.Errorf("sync_above: the %s store cannot apply synchronous hits, which keys near their limits need", id.Name())
		}
	}
	return key, nil
}
