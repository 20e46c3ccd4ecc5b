package syncapp

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/ratesync/caddy-ratelimit/internal/cfargs"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("rate_limit", parseGlobalOption)
}

// parseGlobalOption turns the rate_limit global option into the app's
// JSON. Repeated blocks merge; a zone or namespace defined twice is an
// error.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	app := new(App)
	if prev, ok := existing.(httpcaddyfile.App); ok {
		if err := json.Unmarshal(prev.Value, app); err != nil {
			return nil, fmt.Errorf("merging rate_limit options: %v", err)
		}
	}
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "rate_limit", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from the rate_limit global option.
// Syntax:
//
//	rate_limit {
//	    zone <name> {
//	        max_keys <n>
//	    }
//	    namespace <name> {
//	        zone <name>
//	        sync_rate off|0|<duration>
//	        sync_above <fraction>
//	        on_store_failure allow|share|deny
//	        window_sizes <duration>...
//	        strategy <module> {
//	            ...
//	        }
//	    }
//	    flush_timeout <duration>
//	}
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	return cfargs.Block(d, "", map[string]func() error{
		"zone":          func() error { return a.unmarshalZone(d) },
		"namespace":     func() error { return a.unmarshalNamespace(d) },
		"flush_timeout": func() error { return cfargs.Duration(d, "flush_timeout", &a.FlushTimeout) },
	}, "zone", "namespace")
}

func (a *App) unmarshalZone(d *caddyfile.Dispenser) error {
	var name string
	if err := cfargs.One(d, &name); err != nil {
		return err
	}
	if _, ok := a.Zones[name]; ok {
		return d.Errf("zone %q is defined twice", name)
	}
	z := new(ZoneConfig)
	err := cfargs.Block(d, "", map[string]func() error{
		"max_keys": func() error { return cfargs.Int(d, "max_keys", 1, &z.MaxKeys) },
	})
	if err != nil {
		return err
	}
	if a.Zones == nil {
		a.Zones = make(map[string]*ZoneConfig)
	}
	a.Zones[name] = z
	return nil
}

func (a *App) unmarshalNamespace(d *caddyfile.Dispenser) error {
	var name string
	if err := cfargs.One(d, &name); err != nil {
		return err
	}
	if _, ok := a.Namespaces[name]; ok {
		return d.Errf("namespace %q is defined twice", name)
	}
	ns := new(NamespaceConfig)
	err := cfargs.Block(d, "", map[string]func() error{
		"zone": func() error { return cfargs.One(d, &ns.Zone) },
		"sync_rate": func() error {
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			rate, err := ParseSyncRate(v)
			if err == nil {
				err = rate.Validate()
			}
			if err != nil {
				return d.Errf("namespace %q: %v", name, err)
			}
			ns.SyncRate = &rate
			return nil
		},
		"sync_above": func() error {
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0 && f <= 1) {
				return d.Errf("namespace %q: sync_above: %q is not a fraction of a limit: want a number in (0, 1], such as 0.8", name, v)
			}
			ns.SyncAbove = &f
			return nil
		},
		"on_store_failure": func() error {
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			p, err := ParseFailurePolicy(v)
			if err != nil {
				return d.Errf("namespace %q: %v", name, err)
			}
			ns.OnStoreFailure = string(p)
			return nil
		},
		"window_sizes": func() error {
			var args []string
			if err := cfargs.List(d, &args); err != nil {
				return err
			}
			for _, arg := range args {
				dur, err := caddy.ParseDuration(arg)
				if err != nil || dur <= 0 {
					return d.Errf("namespace %q: window_sizes: invalid window %q: want a positive duration", name, arg)
				}
				ns.WindowSizes = append(ns.WindowSizes, caddy.Duration(dur))
			}
			return nil
		},
		"strategy": func() error {
			if !d.NextArg() {
				return d.ArgErr()
			}
			module := d.Val()
			unm, err := caddyfile.UnmarshalModule(d, "rate_limit.strategies."+module)
			if err != nil {
				return err
			}
			ns.StrategyRaw = caddyconfig.JSONModuleObject(unm, "module", module, nil)
			return nil
		},
	}, "window_sizes")
	if err != nil {
		return err
	}
	if a.Namespaces == nil {
		a.Namespaces = make(map[string]*NamespaceConfig)
	}
	a.Namespaces[name] = ns
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*App)(nil)
