package postgres

import (
	"bytes"
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
			input: `postgres {
				dsn postgres://rl:secret@127.0.0.1:5432/ratelimit?sslmode=disable
				table rl.counters
				max_conns 10
			}`,
			want: `{"dsn":"postgres://rl:secret@127.0.0.1:5432/ratelimit?sslmode=disable","table":"rl.counters","max_conns":10}`,
		},
		{name: "placeholder", input: `postgres {
				dsn {env.DATABASE_URL}
			}`, want: `{"dsn":"{env.DATABASE_URL}"}`},
		{name: "keyword/value dsn, quoted", input: `postgres {
				dsn "host=db.internal dbname=ratelimit sslmode=verify-full"
			}`, want: `{"dsn":"host=db.internal dbname=ratelimit sslmode=verify-full"}`},
		{name: "max_conns 0 is the default", input: `postgres {
				max_conns 0
			}`, want: `{}`},
		{name: "empty", input: `postgres`, want: `{}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Postgres
			if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(p)
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
	d := caddyfile.NewTestDispenser(`strategy postgres {
		dsn {env.DATABASE_URL}
		max_conns 4
	}`)
	d.Next() // "strategy"
	d.Next() // "postgres"
	mod, err := caddyfile.UnmarshalModule(d, "rate_limit.strategies.postgres")
	if err != nil {
		t.Fatal(err)
	}
	p, ok := mod.(*Postgres)
	if !ok {
		t.Fatalf("module is a %T", mod)
	}
	if p.DSN != "{env.DATABASE_URL}" || p.MaxConns != 4 {
		t.Errorf("got %+v", p)
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  string // in the error
	}{
		{"unknown subdirective", `postgres {
				host 127.0.0.1
			}`, "unrecognized subdirective 'host'"},
		{"an argument", `postgres postgres://localhost/db`, "wrong argument count"},
		{"dsn without a value", `postgres {
				dsn
			}`, "wrong argument count"},
		{"dsn with two values", `postgres {
				dsn host=a dbname=b
			}`, "wrong argument count"},
		{"an unquoted keyword/value dsn", `postgres {
				dsn host=127.0.0.1 password=S3cretPW sslmode=bogus
			}`, "so quote it"},
		{"duplicate", `postgres {
				table a
				table b
			}`, "duplicate subdirective 'table'"},
		{"negative max_conns", `postgres {
				max_conns -1
			}`, `max_conns: want a whole number from 0 to 2147483647, got "-1"`},
		{"max_conns not a number", `postgres {
				max_conns ten
			}`, `max_conns: want a whole number from 0 to 2147483647, got "ten"`},
		{"max_conns too large", `postgres {
				max_conns 3000000000
			}`, `max_conns: want a whole number from 0 to 2147483647, got "3000000000"`},
		{"max_conns twice", `postgres {
				max_conns 1 2
			}`, "wrong argument count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p Postgres
			err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one containing %q", err, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "S3cretPW") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// compact removes the insignificant space of a JSON text.
func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
