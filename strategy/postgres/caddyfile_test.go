package postgres

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	strategytest.UnmarshalCaddyfile[Postgres](t, []strategytest.CaddyfileCase{
		{
			Name: "everything",
			Input: `postgres {
				dsn postgres://rl:secret@127.0.0.1:5432/ratelimit?sslmode=disable
				table rl.counters
				max_conns 10
			}`,
			Want: `{"dsn":"postgres://rl:secret@127.0.0.1:5432/ratelimit?sslmode=disable","table":"rl.counters","max_conns":10}`,
		},
		{Name: "placeholder", Input: `postgres {
				dsn {env.DATABASE_URL}
			}`, Want: `{"dsn":"{env.DATABASE_URL}"}`},
		{Name: "keyword/value dsn, quoted", Input: `postgres {
				dsn "host=db.internal dbname=ratelimit sslmode=verify-full"
			}`, Want: `{"dsn":"host=db.internal dbname=ratelimit sslmode=verify-full"}`},
		{Name: "max_conns 0 is the default", Input: `postgres {
				max_conns 0
			}`, Want: `{}`},
		{Name: "empty", Input: `postgres`, Want: `{}`},
	})
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
	strategytest.UnmarshalCaddyfileErrors[Postgres](t, "S3cretPW", []strategytest.CaddyfileError{
		{Name: "unknown subdirective", Input: `postgres {
				host 127.0.0.1
			}`, Want: []string{"unrecognized subdirective 'host'"}},
		{Name: "an argument", Input: `postgres postgres://localhost/db`, Want: []string{"wrong argument count"}},
		{Name: "dsn without a value", Input: `postgres {
				dsn
			}`, Want: []string{"wrong argument count"}},
		{Name: "dsn with two values", Input: `postgres {
				dsn host=a dbname=b
			}`, Want: []string{"wrong argument count"}},
		{Name: "an unquoted keyword/value dsn", Input: `postgres {
				dsn host=127.0.0.1 password=S3cretPW sslmode=bogus
			}`, Want: []string{"so quote it"}},
		{Name: "duplicate", Input: `postgres {
				table a
				table b
			}`, Want: []string{"duplicate subdirective 'table'"}},
		{Name: "negative max_conns", Input: `postgres {
				max_conns -1
			}`, Want: []string{`max_conns: want a whole number from 0 to 2147483647, got "-1"`}},
		{Name: "max_conns not a number", Input: `postgres {
				max_conns ten
			}`, Want: []string{`max_conns: want a whole number from 0 to 2147483647, got "ten"`}},
		{Name: "max_conns too large", Input: `postgres {
				max_conns 3000000000
			}`, Want: []string{`max_conns: want a whole number from 0 to 2147483647, got "3000000000"`}},
		{Name: "max_conns twice", Input: `postgres {
				max_conns 1 2
			}`, Want: []string{"wrong argument count"}},
	})
}
