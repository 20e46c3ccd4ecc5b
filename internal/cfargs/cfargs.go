// Package cfargs holds the Caddyfile argument helpers that the handler
// directive, the global option and the strategies share.
package cfargs

import (
	"math"
	"slices"
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

// Secret reads the single argument of the subdirective name into dst,
// like One, but its errors never show a token: an unquoted value with
// spaces splits into several, any of which may be part of a password.
// hint tells how to write the value.
func Secret(d *caddyfile.Dispenser, name, hint string, dst *string) error {
	args := d.RemainingArgs()
	if len(args) != 1 {
		return d.Errf("%s: wrong argument count: want one value, got %d arguments (%s)", name, len(args), hint)
	}
	*dst = args[0]
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
	return whole(d, name, least, math.MaxInt, dst)
}

// IntRange reads the single argument of the subdirective name into dst: a
// whole number from least to most.
func IntRange(d *caddyfile.Dispenser, name string, least, most int, dst *int) error {
	return whole(d, name, least, most, dst)
}

// Int32 reads the single argument of the subdirective name into dst: a
// whole number from least to math.MaxInt32.
func Int32(d *caddyfile.Dispenser, name string, least int32, dst *int32) error {
	return whole(d, name, least, math.MaxInt32, dst)
}

// whole reads the single argument of the subdirective name into dst: a
// whole number from least to most. The error names the subdirective, what
// it wants (a number "of least or more" when most is only the limit of
// the Go type) and the value.
func whole[T int | int32](d *caddyfile.Dispenser, name string, least, most T, dst *T) error {
	var v string
	if err := One(d, &v); err != nil {
		return err
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err == nil && n >= int64(least) && n <= int64(most):
		*dst = T(n)
		return nil
	case int64(most) == math.MaxInt:
		return d.Errf("%s: want a whole number of %d or more, got %q", name, least, v)
	}
	return d.Errf("%s: want a whole number from %d to %d, got %q", name, least, most, v)
}

// NoArgs returns an error when the current line has another argument.
func NoArgs(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// List appends the arguments of the current subdirective to dst: one or
// more.
func List(d *caddyfile.Dispenser, dst *[]string) error {
	args := d.RemainingArgs()
	if len(args) == 0 {
		return d.ArgErr()
	}
	*dst = append(*dst, args...)
	return nil
}

// Flag sets dst for a subdirective that takes no argument.
func Flag(d *caddyfile.Dispenser, dst *bool) error {
	if err := NoArgs(d); err != nil {
		return err
	}
	*dst = true
	return nil
}

// Module reads the Caddyfile tokens of a module that takes no argument,
// only a block: the dispenser starts at the module's name, as
// caddyfile.UnmarshalModule leaves it, and Block reads the block with
// parse and repeatable.
func Module(d *caddyfile.Dispenser, parse map[string]func() error, repeatable ...string) error {
	d.Next() // consume module name
	if err := NoArgs(d); err != nil {
		return err
	}
	return Block(d, "", parse, repeatable...)
}

// Block reads the block that opens on the current line, one subdirective
// at a time: parse[name] reads the arguments (and any block) of the
// subdirective name, with the dispenser on its name. Each subdirective may
// appear once, unless it is one of repeatable; an unknown or repeated one
// is an error that names it, and the block's kind ("tls subdirective"), if
// kind is not empty.
func Block(d *caddyfile.Dispenser, kind string, parse map[string]func() error, repeatable ...string) error {
	what := "subdirective"
	if kind != "" {
		what = kind + " subdirective"
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		fn, ok := parse[name]
		if !ok {
			return d.Errf("unrecognized %s '%s'", what, name)
		}
		if seen[name] && !slices.Contains(repeatable, name) {
			return d.Errf("duplicate %s '%s'", what, name)
		}
		seen[name] = true
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}
