package memory

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/internal/cfargs"
)

// UnmarshalCaddyfile sets up the strategy from Caddyfile tokens. The
// dispenser starts at the module name, as caddyfile.UnmarshalModule leaves
// it after the strategy subdirective. Syntax:
//
//	memory [<name>]
//
//	memory {
//	    name <name>
//	}
func (m *Memory) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume module name
	if d.NextArg() {
		m.Name = d.Val()
		if err := cfargs.NoArgs(d); err != nil {
			return err
		}
	}
	return cfargs.Block(d, "", map[string]func() error{
		"name": func() error {
			if m.Name != "" {
				return d.Err("the name is already set")
			}
			return cfargs.One(d, &m.Name)
		},
	})
}
