package redis

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	strategytest.UnmarshalCaddyfile[Redis](t, []strategytest.CaddyfileCase{
		{
			Name: "everything",
			Input: `redis {
				addresses 127.0.0.1:6379 127.0.0.1:6380
				addresses 127.0.0.1:6381
				master_name mymaster
				username u
				password {env.REDIS_PASSWORD}
				sentinel_username su
				sentinel_password sp
				db 3
				key_prefix rl
				dial_timeout 2s
				read_timeout 1s
				write_timeout 500ms
				pool_size 20
				tls {
					ca /path/ca.pem
					cert /path/c.pem
					key /path/k.pem
					server_name redis.internal
					insecure_skip_verify
				}
			}`,
			Want: `{"addresses":["127.0.0.1:6379","127.0.0.1:6380","127.0.0.1:6381"],"master_name":"mymaster",
				"username":"u","password":"{env.REDIS_PASSWORD}","sentinel_username":"su","sentinel_password":"sp",
				"db":3,"tls":{"ca":"/path/ca.pem","cert":"/path/c.pem","key":"/path/k.pem","server_name":"redis.internal",
				"insecure_skip_verify":true},"dial_timeout":2000000000,"read_timeout":1000000000,
				"write_timeout":500000000,"pool_size":20,"key_prefix":"rl"}`,
		},
		{Name: "empty", Input: `redis`, Want: `{}`},
		{Name: "empty block", Input: `redis {
			}`, Want: `{}`},
		{Name: "tls alone", Input: `redis {
				tls
			}`, Want: `{"tls":{}}`},
		{Name: "tls alone, then more", Input: `redis {
				tls
				db 1
			}`, Want: `{"db":1,"tls":{}}`},
		{Name: "day durations", Input: `redis {
				dial_timeout 1d
			}`, Want: `{"dial_timeout":86400000000000}`},
	})
}

// The app's global option parser hands the strategy over this way.
func TestUnmarshalModule(t *testing.T) {
	d := caddyfile.NewTestDispenser(`strategy redis {
		addresses 10.0.0.1:6379
		tls
	}
	zone default`)
	d.Next() // strategy
	if !d.NextArg() || d.Val() != "redis" {
		t.Fatalf("at %q, want redis", d.Val())
	}
	unm, err := caddyfile.UnmarshalModule(d, "rate_limit.strategies.redis")
	if err != nil {
		t.Fatal(err)
	}
	r := unm.(*Redis)
	if len(r.Addresses) != 1 || r.Addresses[0] != "10.0.0.1:6379" || r.TLS == nil {
		t.Errorf("got %+v", r)
	}
	// The outer dispenser continues after the block.
	if !d.Next() || d.Val() != "zone" {
		t.Errorf("after the block: %q, want zone", d.Val())
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	strategytest.UnmarshalCaddyfileErrors[Redis](t, "S3cret", []strategytest.CaddyfileError{
		{Name: "unknown subdirective", Input: "redis {\n hosts a:1\n}", Want: []string{"unrecognized subdirective 'hosts'", "Testfile:2"}},
		{Name: "unknown tls subdirective", Input: "redis {\n tls {\n  ciphers x\n }\n}", Want: []string{"unrecognized tls subdirective 'ciphers'"}},
		{Name: "argument on the module line", Input: "redis extra", Want: []string{"wrong argument count"}},
		{Name: "bad db", Input: "redis {\n db zero\n}", Want: []string{"db", `"zero"`}},
		{Name: "negative db", Input: "redis {\n db -1\n}", Want: []string{"db", `"-1"`}},
		{Name: "negative pool_size", Input: "redis {\n pool_size -5\n}", Want: []string{"pool_size", `"-5"`}},
		{Name: "bad duration", Input: "redis {\n dial_timeout soon\n}", Want: []string{"dial_timeout", `"soon"`}},
		{Name: "negative duration", Input: "redis {\n read_timeout -1s\n}", Want: []string{"read_timeout", `"-1s"`}},
		{Name: "duplicate subdirective", Input: "redis {\n db 1\n db 2\n}", Want: []string{"duplicate subdirective 'db'"}},
		{Name: "duplicate tls", Input: "redis {\n tls\n tls\n}", Want: []string{"duplicate subdirective 'tls'"}},
		{Name: "missing argument", Input: "redis {\n password\n}", Want: []string{"wrong argument count"}},
		{Name: "a password with a space, unquoted", Input: "redis {\n password my S3cret\n}", Want: []string{"password: wrong argument count", "quoted"}},
		{Name: "a sentinel password with a space, unquoted", Input: "redis {\n sentinel_password my S3cret\n}", Want: []string{"sentinel_password: wrong argument count"}},
		{Name: "extra argument", Input: "redis {\n username a b\n}", Want: []string{"wrong argument count"}},
		{Name: "addresses without any", Input: "redis {\n addresses\n}", Want: []string{"wrong argument count"}},
		{Name: "insecure_skip_verify with a value", Input: "redis {\n tls {\n  insecure_skip_verify yes\n }\n}", Want: []string{"wrong argument count"}},
		{Name: "tls with an argument", Input: "redis {\n tls on\n}", Want: []string{"wrong argument count"}},
	})
}
