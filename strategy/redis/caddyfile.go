package redis

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/internal/cfargs"
)

// quoteIt is how to write a password that errors never show.
const quoteIt = `a password with spaces must be quoted: password "..."`

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
	return cfargs.Module(d, map[string]func() error{
		"addresses":         func() error { return cfargs.List(d, &r.Addresses) },
		"master_name":       func() error { return cfargs.One(d, &r.MasterName) },
		"username":          func() error { return cfargs.One(d, &r.Username) },
		"password":          func() error { return cfargs.Secret(d, "password", quoteIt, &r.Password) },
		"sentinel_username": func() error { return cfargs.One(d, &r.SentinelUsername) },
		"sentinel_password": func() error { return cfargs.Secret(d, "sentinel_password", quoteIt, &r.SentinelPassword) },
		"key_prefix":        func() error { return cfargs.One(d, &r.KeyPrefix) },
		"db":                func() error { return cfargs.Int(d, "db", 0, &r.DB) },
		"pool_size":         func() error { return cfargs.Int(d, "pool_size", 0, &r.PoolSize) },
		"dial_timeout":      func() error { return cfargs.Duration(d, "dial_timeout", &r.DialTimeout) },
		"read_timeout":      func() error { return cfargs.Duration(d, "read_timeout", &r.ReadTimeout) },
		"write_timeout":     func() error { return cfargs.Duration(d, "write_timeout", &r.WriteTimeout) },
		"tls":               func() error { return r.unmarshalTLS(d) },
	}, "addresses")
}

// unmarshalTLS reads "tls" alone or "tls { ... }".
func (r *Redis) unmarshalTLS(d *caddyfile.Dispenser) error {
	if err := cfargs.NoArgs(d); err != nil {
		return err
	}
	t := new(TLSConfig)
	r.TLS = t
	return cfargs.Block(d, "tls", map[string]func() error{
		"ca":                   func() error { return cfargs.One(d, &t.CA) },
		"cert":                 func() error { return cfargs.One(d, &t.Cert) },
		"key":                  func() error { return cfargs.One(d, &t.Key) },
		"server_name":          func() error { return cfargs.One(d, &t.ServerName) },
		"insecure_skip_verify": func() error { return cfargs.Flag(d, &t.InsecureSkipVerify) },
	})
}
