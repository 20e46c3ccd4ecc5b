package postgres

import (
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
	return cfargs.Module(d, map[string]func() error{
		"dsn": func() error {
			return cfargs.Secret(d, "dsn", `a keyword/value DSN has spaces, so quote it: dsn "host=... dbname=..."`, &p.DSN)
		},
		"max_conns": func() error { return cfargs.Int32(d, "max_conns", 0, &p.MaxConns) },
		"table":     func() error { return cfargs.One(d, &p.Table) },
	})
}
