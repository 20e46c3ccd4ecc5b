package redis

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/internal/cfargs"
)

// UnmarshalCaddyfile sets up the strategy from Caddyfile tokens. The
// dispenser starts at the module name, as caddyfile.UnmarshalModule leaves
// it after the strategy subdirective. Syntax:
//
//	redis {
//	    addresses <host:port...>
//	    master_name <name>
//	    username <user>
//	    password <password>
//	    sentinel_username <user>
//	    sentinel_password <password>
//	    db <number>
//	    key_prefix <prefix>
//	    dial_timeout <duration>
//	    read_timeout <duration>
//	    write_timeout <duration>
//	    pool_size <number>
//	    tls
//	    tls {
//	        ca <pem file>
//	        cert <pem file>
//	        key <pem file>
//	        server_name <name>
//	        insecure_skip_verify
//	    }
//	}
//
// addresses may be repeated, and adds to the list; every other
// subdirective may appear once. tls alone enables TLS with the system's
// certificate authorities.
func (r *Redis) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume module name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] && name != "addresses" {
			return d.Errf("duplicate subdirective '%s'", name)
		}
		seen[name] = true
		var err error
		switch name {
		case "addresses":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			r.Addresses = append(r.Addresses, args...)
		case "master_name":
			err = cfargs.One(d, &r.MasterName)
		case "username":
			err = cfargs.One(d, &r.Username)
		case "password":
			err = cfargs.One(d, &r.Password)
		case "sentinel_username":
			err = cfargs.One(d, &r.SentinelUsername)
		case "sentinel_password":
			err = cfargs.One(d, &r.SentinelPassword)
		case "key_prefix":
			err = cfargs.One(d, &r.KeyPrefix)
		case "db":
			err = natural(d, &r.DB)
		case "pool_size":
			err = natural(d, &r.PoolSize)
		case "dial_timeout":
			err = duration(d, &r.DialTimeout)
		case "read_timeout":
			err = duration(d, &r.ReadTimeout)
		case "write_timeout":
			err = duration(d, &r.WriteTimeout)
		case "tls":
			err = r.unmarshalTLS(d)
		default:
			return d.Errf("unrecognized subdirective '%s'", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// unmarshalTLS reads "tls" alone or "tls { ... }".
func (r *Redis) unmarshalTLS(d *caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	t := new(TLSConfig)
	r.TLS = t
	seen := make(map[string]bool)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("duplicate tls subdirective '%s'", name)
		}
		seen[name] = true
		var err error
		switch name {
		case "ca":
			err = cfargs.One(d, &t.CA)
		case "cert":
			err = cfargs.One(d, &t.Cert)
		case "key":
			err = cfargs.One(d, &t.Key)
		case "server_name":
			err = cfargs.One(d, &t.ServerName)
		case "insecure_skip_verify":
			if d.NextArg() {
				return d.ArgErr()
			}
			t.InsecureSkipVerify = true
		default:
			return d.Errf("unrecognized tls subdirective '%s'", name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// natural reads a single non-negative integer argument.
func natural(d *caddyfile.Dispenser, dst *int) error {
	name := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	n, err := strconv.Atoi(d.Val())
	if err != nil || n < 0 {
		return d.Errf("%s: '%s' is not a non-negative integer", name, d.Val())
	}
	*dst = n
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// duration reads a single non-negative duration argument, such as 2s.
func duration(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name := d.Val()
	if !d.NextArg() {
		return d.ArgErr()
	}
	v, err := caddy.ParseDuration(d.Val())
	if err != nil || v < 0 {
		return d.Errf("%s: '%s' is not a non-negative duration", name, d.Val())
	}
	*dst = caddy.Duration(v)
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}
