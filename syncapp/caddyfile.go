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
//	        window_sizes <duration>...
//	        strategy <module> {
//	            ...
//	        }
//	    }
//	    flush_timeout <duration>
//	}
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "zone":
			if err := a.unmarshalZone(d); err != nil {
				return err
			}
		case "namespace":
			if err := a.unmarshalNamespace(d); err != nil {
				return err
			}
		case "flush_timeout":
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur < 0 {
				return d.Errf("flush_timeout: invalid duration %q", v)
			}
			a.FlushTimeout = caddy.Duration(dur)
		default:
			return d.Errf("unrecognized subdirective '%s'", d.Val())
		}
	}
	return nil
}

func (a *App) unmarshalZone(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if _, ok := a.Zones[name]; ok {
		return d.Errf("zone %q is defined twice", name)
	}
	z := new(ZoneConfig)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "max_keys":
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("zone %q: max_keys must be a positive integer, got %q", name, v)
			}
			z.MaxKeys = n
		default:
			return d.Errf("zone %q: unrecognized subdirective '%s'", name, d.Val())
		}
	}
	if a.Zones == nil {
		a.Zones = make(map[string]*ZoneConfig)
	}
	a.Zones[name] = z
	return nil
}

func (a *App) unmarshalNamespace(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if _, ok := a.Namespaces[name]; ok {
		return d.Errf("namespace %q is defined twice", name)
	}
	ns := new(NamespaceConfig)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "zone":
			if err := cfargs.One(d, &ns.Zone); err != nil {
				return err
			}
		case "sync_rate":
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
		case "sync_above":
			var v string
			if err := cfargs.One(d, &v); err != nil {
				return err
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0 && f <= 1) {
				return d.Errf("namespace %q: sync_above: %q is not a fraction of a limit: want a number in (0, 1], such as 0.8", name, v)
			}
			ns.SyncAbove = &f
		case "window_sizes":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			for _, arg := range args {
				dur, err := caddy.ParseDuration(arg)
				if err != nil || dur <= 0 {
					return d.Errf("namespace %q: window_sizes: invalid window %q: want a positive duration", name, arg)
				}
				ns.WindowSizes = append(ns.WindowSizes, caddy.Duration(dur))
			}
		case "strategy":
			if !d.NextArg() {
				return d.ArgErr()
			}
			module := d.Val()
			unm, err := caddyfile.UnmarshalModule(d, "rate_limit.strategies."+module)
			if err != nil {
				return err
			}
			ns.StrategyRaw = caddyconfig.JSONModuleObject(unm, "module", module, nil)
		default:
			return d.Errf("namespace %q: unrecognized subdirective '%s'", name, d.Val())
		}
	}
	if a.Namespaces == nil {
		a.Namespaces = make(map[string]*NamespaceConfig)
	}
	a.Namespaces[name] = ns
	return nil
}

// Interface guards
var _ caddyfile.Unmarshaler = (*App)(nil)
