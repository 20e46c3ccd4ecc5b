// Package cfargs holds the Caddyfile argument helpers that the handler
// directive, the global option and the strategies share.
package cfargs

import "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

// One reads the single argument of the current subdirective into dst: a
// missing or an extra argument is an error.
func One(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}
