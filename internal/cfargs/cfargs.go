// Package cfargs holds the Caddyfile argument helpers that the handler
// directive, the global option and the strategies share.
package cfargs

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

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

// Duration reads the single argument of the subdirective name into dst: a
// duration of 0 or more.
func Duration(d *caddyfile.Dispenser, name string, dst *caddy.Duration) error {
	var v string
	if err := One(d, &v); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil || dur < 0 {
		return d.Errf("%s: want a duration of 0 or more, got %q", name, v)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// Int reads the single argument of the subdirective name into dst: a
// whole number no less than least.
func Int(d *caddyfile.Dispenser, name string, least int, dst *int) error {
	var v string
	if err := One(d, &v); err != nil {
		return err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		return d.Errf("%s: want a whole number of %d or more, got %q", name, least, v)
	}
	*dst = n
	return nil
}
