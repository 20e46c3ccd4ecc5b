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
		"zone": func() error {
			return unmarshalNamed(d, "zone", &a.Zones, func(_ string, z *ZoneConfig) map[string]func() error {
				return map[string]func() error{"max_keys": func() error { return cfargs.Int(d, "max_keys", 1, &z.MaxKeys) }}
			})
		},
		"namespace": func() error {
			return unmarshalNamed(d, "namespace", &a.Namespaces, func(name string, ns *NamespaceConfig) map[string]func() error {
				return ns.subdirectives(d, name)
			}, "window_sizes")
		},
		"flush_timeout": func() error { return cfargs.Duration(d, "flush_timeout", &a.FlushTimeout) },
	}, "zone", "namespace")
}

// unmarshalNamed reads the block of a zone or a namespace (kind) into a
// new config, and adds it to configs under its name, which must be new:
// parse returns the parsers of the block's subdirectives (see
// cfargs.Block).
func unmarshalNamed[T any](d *caddyfile.Dispenser, kind string, configs *map[string]*T, parse func(name string, cfg *T) map[string]func() error, repeatable ...string) error {
	var name string
	if err := cfargs.One(d, &name); err != nil {
		return err
	}
	if _, ok := (*configs)[name]; ok {
		return d.Errf("%s %q is defined twice", kind, name)
	}
	cfg := new(T)
	if err := cfargs.Block(d, "", parse(name, cfg), repeatable...); err != nil {
		return err
	}
	if *configs == nil {
		*configs = make(map[string]*T)
	}
	(*configs)[name] = cfg
	return nil
}

// subdirectives returns the parser of each subdirective of the block of
// the namespace name, which reads its arguments into ns. The errors of
// the values they refuse name the namespace.
func (ns *NamespaceConfig) subdirectives(d *caddyfile.Dispenser, name string) map[string]func() error {
	// value reads the single argument of a subdirective through parse.
	value := func(parse func(string) error) func() error {
		return func() error {
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			if err := parse(v); err != nil {
				return d.Errf("namespace %q: %v", name, err)
			}
			return nil
		}
	}
	return map[string]func() error{
		"zone": func() error { return cfargs.One(d, &ns.Zone) },
		"sync_rate": value(func(v string) error {
			rate, err := ParseSyncRate(v)
			if err == nil {
				err = rate.Validate()
			}
			ns.SyncRate = &rate
			return err
		}),
		"sync_above": value(func(v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !isFraction(f) {
				return fmt.Errorf("sync_above: %q is not a fraction of a limit: want a number in (0, 1], such as 0.8", v)
			}
			ns.SyncAbove = &f
			return nil
		}),
		"on_store_failure": value(func(v string) error {
			p, err := ParseFailurePolicy(v)
			ns.OnStoreFailure = string(p)
			return err
		}),
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
	}
}

// Interface guards
var _ caddyfile.Unmarshaler = (*App)(nil)
