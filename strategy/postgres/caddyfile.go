package postgres

import (
	"strconv"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/internal/cfargs"
)

// UnmarshalCaddyfile sets up the strategy from Caddyfile tokens. The
// dispenser starts at the module name, as caddyfile.UnmarshalModule leaves
// it after the strategy subdirective. Syntax:
//
//	postgres {
//	    dsn <connection string>
//	    table <[schema.]name>
//	    max_conns <number>
//	}
//
// Every subdirective may appear once. A DSN in keyword/value form has
// spaces, so quote it: dsn "host=db.internal dbname=ratelimit".
func (p *Postgres) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume module name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("duplicate subdirective '%s'", name)
		}
		seen[name] = true
		var err error
		switch name {
		case "dsn":
			err = cfargs.One(d, &p.DSN)
		case "table":
			err = cfargs.One(d, &p.Table)
		case "max_conns":
			err = maxConns(d, &p.MaxConns)
		default:
			return d.Errf("unrecognized subdirective '%s'", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// maxConns reads the single argument of max_conns: a non-negative 32-bit
// integer.
func maxConns(d *caddyfile.Dispenser, dst *int32) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	n, err := strconv.ParseInt(d.Val(), 10, 32)
	if err != nil || n < 0 {
		return d.Errf("max_conns: '%s' is not a non-negative integer", d.Val())
	}
	*dst = int32(n)
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}
