package redis

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  string // JSON of the result
	}{
		{
			name: "everything",
			input: `redis {
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
			want: `{"addresses":["127.0.0.1:6379","127.0.0.1:6380","127.0.0.1:6381"],"master_name":"mymaster",
				"username":"u","password":"{env.REDIS_PASSWORD}","sentinel_username":"su","sentinel_password":"sp",
				"db":3,"tls":{"ca":"/path/ca.pem","cert":"/path/c.pem","key":"/path/k.pem","server_name":"redis.internal",
				"insecure_skip_verify":true},"dial_timeout":2000000000,"read_timeout":1000000000,
				"write_timeout":500000000,"pool_size":20,"key_prefix":"rl"}`,
		},
		{name: "empty", input: `redis`, want: `{}`},
		{name: "empty block", input: `redis {
			}`, want: `{}`},
		{name: "tls alone", input: `redis {
				tls
			}`, want: `{"tls":{}}`},
		{name: "tls alone, then more", input: `redis {
				tls
				db 1
			}`, want: `{"db":1,"tls":{}}`},
		{name: "day durations", input: `redis {
				dial_timeout 1d
			}`, want: `{"dial_timeout":86400000000000}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Redis
			if err := r.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			if want := compact(t, tc.want); string(got) != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
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
	for _, tc := range []struct {
		name  string
		input string
		want  []string
	}{
		{"unknown subdirective", "redis {\n hosts a:1\n}", []string{"unrecognized subdirective 'hosts'", "Testfile:2"}},
		{"unknown tls subdirective", "redis {\n tls {\n  ciphers x\n }\n}", []string{"unrecognized tls subdirective 'ciphers'"}},
		{"argument on the module line", "redis extra", []string{"wrong argument count"}},
		{"bad db", "redis {\n db zero\n}", []string{"db", `"zero"`}},
		{"negative db", "redis {\n db -1\n}", []string{"db", `"-1"`}},
		{"negative pool_size", "redis {\n pool_size -5\n}", []string{"pool_size", `"-5"`}},
		{"bad duration", "redis {\n dial_timeout soon\n}", []string{"dial_timeout", `"soon"`}},
		{"negative duration", "redis {\n read_timeout -1s\n}", []string{"read_timeout", `"-1s"`}},
		{"duplicate subdirective", "redis {\n db 1\n db 2\n}", []string{"duplicate subdirective 'db'"}},
		{"duplicate tls", "redis {\n tls\n tls\n}", []string{"duplicate subdirective 'tls'"}},
		{"missing argument", "redis {\n password\n}", []string{"wrong argument count"}},
		{"a password with a space, unquoted", "redis {\n password my S3cret\n}", []string{"password: wrong argument count", "quoted"}},
		{"a sentinel password with a space, unquoted", "redis {\n sentinel_password my S3cret\n}", []string{"sentinel_password: wrong argument count"}},
		{"extra argument", "redis {\n username a b\n}", []string{"wrong argument count"}},
		{"addresses without any", "redis {\n addresses\n}", []string{"wrong argument count"}},
		{"insecure_skip_verify with a value", "redis {\n tls {\n  insecure_skip_verify yes\n }\n}", []string{"wrong argument count"}},
		{"tls with an argument", "redis {\n tls on\n}", []string{"wrong argument count"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r Redis
			err := r.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %q, want it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "S3cret") {
				t.Errorf("err = %q shows the password", err)
			}
		})
	}
}

// compact returns s as json.Marshal writes a Redis: fields in struct
// order, no spaces. A field the struct does not have fails the test.
func compact(t *testing.T, s string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var r Redis
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("bad JSON in test: %v", err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
