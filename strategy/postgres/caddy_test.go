package postgres

import (
	"encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// host is a stand-in for the app's namespace config: it holds a strategy
// the way Caddy modules hold guest modules.
type host struct {
	StrategyRaw json.RawMessage `json:"strategy,omitempty" caddy:"namespace=rate_limit.strategies inline_key=module"`
}

// load loads a strategy from the JSON of a namespace's strategy, as Caddy
// does: unmarshal, Provision, Validate.
func load(t *testing.T, cfg string) (*Postgres, error) {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: ctxT(t)})
	t.Cleanup(cancel)
	var h host
	if err := json.Unmarshal([]byte(`{"strategy": `+cfg+`}`), &h); err != nil {
		t.Fatal(err)
	}
	mod, err := ctx.LoadModule(&h, "StrategyRaw")
	if err != nil {
		return nil, err
	}
	p, ok := mod.(*Postgres)
	if !ok {
		t.Fatalf("module is a %T, not a *Postgres", mod)
	}
	return p, nil
}

func TestLoadFromJSON(t *testing.T) {
	p, err := load(t, `{"module": "postgres", "dsn": "postgres://rl:secret@db.internal:6432/ratelimit?sslmode=verify-full",
		"table": "Edge.Counters", "max_conns": 7}`)
	if err != nil {
		t.Fatalf("loading the module: %v", err)
	}
	var s strategy.Strategy = p
	if p.Table != "edge.counters" {
		t.Errorf("table = %q, want it folded to lower case as SQL does", p.Table)
	}
	if p.poolConfig.MaxConns != 7 || p.poolConfig.ConnConfig.Port != 6432 || p.poolConfig.ConnConfig.TLSConfig == nil {
		t.Errorf("settings not applied: max_conns %d, port %d, tls %v", p.poolConfig.MaxConns, p.poolConfig.ConnConfig.Port, p.poolConfig.ConnConfig.TLSConfig != nil)
	}
	if got := p.poolConfig.ConnConfig.RuntimeParams["application_name"]; got != applicationName {
		t.Errorf("application_name = %q", got)
	}
	if p.names.counters != `"edge"."counters"` || p.names.qualified("_ids") != `"edge"."counters_ids"` || p.names.qualified("_hits") != `"edge"."counters_hits"` {
		t.Errorf("names = %+v", p.names)
	}
	key := s.StoreKey()
	if !strings.Contains(key, "secret@db.internal:6432") || !strings.Contains(key, "edge.counters") || !strings.Contains(key, "7") {
		t.Errorf("StoreKey = %s: want the DSN, the table and max_conns", key)
	}
	opened, err := s.OpenStore()
	if err != nil {
		t.Fatal(err)
	}
	store := opened.(*Store)
	if store.pool != nil {
		t.Error("OpenStore made a pool")
	}
	if err := store.Close(); err != nil {
		t.Errorf("closing a store never used: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	p, err := load(t, `{"module": "postgres", "dsn": "postgres://localhost/ratelimit"}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.Table != defaultTable || p.names.counters != `"rate_limit_counters"` {
		t.Errorf("table = %q (%s), want %s", p.Table, p.names.counters, defaultTable)
	}
	if p.MaxConns != 0 || p.poolConfig.MaxConns < 4 {
		t.Errorf("max_conns = %d, pool max %d: want the driver's default", p.MaxConns, p.poolConfig.MaxConns)
	}
	// pool_max_conns in the DSN is the driver's setting; max_conns wins.
	p, err = load(t, `{"module": "postgres", "dsn": "postgres://localhost/ratelimit?pool_max_conns=3"}`)
	if err != nil || p.poolConfig.MaxConns != 3 {
		t.Fatalf("pool_max_conns in the DSN: %v, %+v", err, p)
	}
	p, err = load(t, `{"module": "postgres", "dsn": "postgres://localhost/ratelimit?pool_max_conns=3", "max_conns": 5}`)
	if err != nil || p.poolConfig.MaxConns != 5 {
		t.Fatalf("max_conns over pool_max_conns: %v, %+v", err, p)
	}
}

// TestBadInput checks that every invalid setting is refused at load, with
// an error that names the field and the value, and never the password.
func TestBadInput(t *testing.T) {
	const pw = "Hunter2-s3cret"
	for _, tc := range []struct {
		name string
		cfg  string
		want []string // in the error
	}{
		{"no dsn", `{}`, []string{"dsn: required"}},
		{"empty placeholder", `{"dsn": "{env.RL_PG_TEST_UNSET_VARIABLE}"}`, []string{"dsn: required"}},
		{"url with a bad port", `{"dsn": "postgres://rl:` + pw + `@127.0.0.1:notaport/ratelimit"}`,
			[]string{"dsn: ", "does not parse", "postgres://rl:xxxxx@127.0.0.1:notaport/ratelimit"}},
		{"url with an unescaped @ in the password", `{"dsn": "postgres://rl:` + pw + `@x@127.0.0.1:99999/db"}`,
			[]string{"dsn: ", "does not parse"}},
		{"url with a bad sslmode", `{"dsn": "postgres://rl:` + pw + `@127.0.0.1/db?sslmode=sometimes"}`,
			[]string{"dsn: ", "does not parse", "sslmode"}},
		{"url with a password parameter", `{"dsn": "postgres://127.0.0.1:bad/db?password=` + pw + `"}`,
			[]string{"dsn: ", "does not parse"}},
		{"keyword/value with a bad port", `{"dsn": "host=127.0.0.1 password=` + pw + ` port=notaport"}`,
			[]string{"dsn: ", "does not parse", "password=xxxxx"}},
		{"keyword/value, quoted password", `{"dsn": "host=127.0.0.1 password='` + pw + ` x' port=notaport"}`,
			[]string{"dsn: ", "does not parse"}},
		{"keyword/value, unterminated quote", `{"dsn": "host=127.0.0.1 password='` + pw + `"}`,
			[]string{"dsn: ", "does not parse"}},
		{"table with SQL", `{"dsn": "postgres://localhost/db", "table": "t; DROP TABLE x"}`,
			[]string{`table: "t; DROP TABLE x" is not a plain SQL identifier`}},
		{"table quoted", `{"dsn": "postgres://localhost/db", "table": "\"t\""}`, []string{`table: "\"t\""`}},
		{"table starting with a digit", `{"dsn": "postgres://localhost/db", "table": "1t"}`, []string{`table: "1t"`}},
		{"table with two dots", `{"dsn": "postgres://localhost/db", "table": "a.b.c"}`, []string{`table: "a.b.c"`}},
		{"table with an empty schema", `{"dsn": "postgres://localhost/db", "table": ".t"}`, []string{`table: ".t"`}},
		{"table too long", `{"dsn": "postgres://localhost/db", "table": "` + strings.Repeat("t", 56) + `"}`,
			[]string{`table: "` + strings.Repeat("t", 56) + `"`, "55 bytes"}},
		{"table not ASCII", `{"dsn": "postgres://localhost/db", "table": "zähler"}`, []string{`table: "zähler"`}},
		{"negative max_conns", `{"dsn": "postgres://localhost/db", "max_conns": -1}`,
			[]string{"max_conns: must not be negative, got -1"}},
		{"several", `{"dsn": "postgres://localhost:x/db", "table": "a-b", "max_conns": -2}`,
			[]string{"dsn: ", `table: "a-b"`, "max_conns: must not be negative, got -2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := `{"module": "postgres"}`
			if tc.cfg != "{}" {
				cfg = `{"module": "postgres", ` + strings.TrimPrefix(tc.cfg, "{")
			}
			_, err := load(t, cfg)
			if err == nil {
				t.Fatal("the config loaded")
			}
			msg := err.Error()
			for _, want := range tc.want {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if strings.Contains(msg, pw) || strings.Contains(msg, "Hunter2") {
				t.Errorf("error %q shows the password", msg)
			}
		})
	}
}

func TestTableNames(t *testing.T) {
	for _, table := range []string{"t", "_t", "T1", "rate_limit_counters", "s.t", strings.Repeat("t", 55),
		strings.Repeat("s", 63) + "." + strings.Repeat("t", 55)} {
		if err := checkTable(table); err != nil {
			t.Errorf("checkTable(%q) = %v, want nil", table, err)
		}
	}
	for _, table := range []string{"", "t-1", "t$", "1t", "a.b.c", "s.", ".t", "t t", `"t"`, strings.Repeat("s", 64) + ".t"} {
		if err := checkTable(table); err == nil {
			t.Errorf("checkTable(%q) = nil, want an error", table)
		}
	}
}

func TestRedactDSN(t *testing.T) {
	for _, tc := range []struct {
		dsn, want string
		secrets   []string
	}{
		{"postgres://rl:pw@h/db", "postgres://rl:xxxxx@h/db", []string{"pw"}},
		{"postgresql://rl:p%40w@h:1/db", "postgresql://rl:xxxxx@h:1/db", []string{"p%40w", "p@w"}},
		{"postgres://rl:p@w@h/db", "postgres://rl:xxxxx@h/db", []string{"p@w"}},
		{"postgres://rl@h/db", "postgres://rl@h/db", nil},
		{"postgres://h/db?password=pw&sslmode=disable", "postgres://h/db?password=xxxxx&sslmode=disable", []string{"pw"}},
		{"host=h password=pw port=1", "host=h password=xxxxx port=1", []string{"pw"}},
		{"host=h password = 'p w' port=1", "host=h password = xxxxx port=1", []string{"p w", "'p w'"}},
		{"host=h PASSWORD='p\\'w'", "host=h PASSWORD=xxxxx", []string{`p\'w`, `'p\'w'`}},
	} {
		got, secrets := redactDSN(tc.dsn)
		if got != tc.want {
			t.Errorf("redactDSN(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
		for _, s := range tc.secrets {
			found := false
			for _, g := range secrets {
				found = found || g == s
			}
			if !found {
				t.Errorf("redactDSN(%q) found secrets %q, want %q among them", tc.dsn, secrets, s)
			}
		}
	}
}

// TestEnvPlaceholder loads a DSN from the environment, and uses it.
func TestEnvPlaceholder(t *testing.T) {
	srv, dsn := startServer(t)
	t.Setenv("RL_PG_TEST_DSN", dsn)
	p, err := load(t, `{"module": "postgres", "dsn": "{env.RL_PG_TEST_DSN}"}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.DSN != dsn || !strings.Contains(p.StoreKey(), dsn) {
		t.Fatalf("dsn = %q, store key %s: want %q", p.DSN, p.StoreKey(), dsn)
	}
	s := openStore(t, p)
	at := time.Now().UnixNano()
	d := window.Diff{Key: "k", Size: time.Hour, Start: window.Start(at, time.Hour), Value: 2}
	if err := s.PushDiffs(ctxT(t), strategy.Batch{ID: "b", Namespace: "env", Diffs: []window.Diff{d}}); err != nil {
		t.Fatal(err)
	}
	if n := counters(t, srv, s, "env"); n != 1 {
		t.Fatalf("%d counters, want 1", n)
	}
}

// openStore opens a store of provisioned settings as the app does, and
// closes it when the test ends.
func openStore(t *testing.T, p *Postgres) *Store {
	t.Helper()
	st, err := p.OpenStore()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st.(*Store)
}

// TestProvisionDoesNotConnect checks that loading, validating and opening
// a store connects to nothing and starts no goroutine, as `caddy validate`
// needs, and that the first use does both, creating the tables.
func TestProvisionDoesNotConnect(t *testing.T) {
	srv, dsn := startServer(t)
	before := srv.Connections(t, testDB)
	goroutines := runtime.NumGoroutine()

	p, err := load(t, `{"module": "postgres", "dsn": "`+dsn+`", "max_conns": 2}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	_ = p.StoreKey()
	if err := p.ValidateWindow(time.Second); err != nil {
		t.Fatal(err)
	}
	s1, s2 := openStore(t, p), openStore(t, p)
	// No pool exists, so nothing can connect in the background.
	for _, s := range []*Store{s1, s2} {
		s.mu.Lock()
		pool := s.pool
		s.mu.Unlock()
		if pool != nil {
			t.Error("opening a store made its connection pool")
		}
	}
	if n := srv.Connections(t, testDB); n != before {
		t.Errorf("%d connections after loading and opening stores, %d before", n, before)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Errorf("%d goroutines after loading and opening stores, %d before", n, goroutines)
	}
	if n := count(t, srv, "SELECT count(*) FROM pg_class WHERE relname LIKE 'rate_limit_counters%'"); n != 0 {
		t.Errorf("the tables exist before first use (%d relations)", n)
	}
	if err := s2.Close(); err != nil {
		t.Errorf("closing a store never used: %v", err)
	}

	// The first use connects, and creates the tables and the function.
	if _, err := s1.GetCounters(ctxT(t), "ns", []string{"k"}, []time.Duration{time.Second}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if n := srv.Connections(t, testDB); n <= before {
		t.Errorf("%d connections after first use, %d before", n, before)
	}
	if n := count(t, srv, `SELECT count(*) FROM pg_class WHERE relname IN
		('rate_limit_counters', 'rate_limit_counters_ids', 'rate_limit_counters_exp', 'rate_limit_counters_ids_exp')`); n != 4 {
		t.Errorf("%d of the 4 tables and indexes exist after first use", n)
	}
	if n := count(t, srv, `SELECT count(*) FROM pg_proc WHERE proname LIKE 'rate_limit_counters_%'`); n != 0 {
		t.Errorf("%d functions exist after a first use that sent no hit, want none", n)
	}
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "the store's connections to close", func() bool {
		return srv.Connections(t, testDB) == before
	})
	poll.Until(t, 5*time.Second, "the store's goroutines to end", func() bool {
		return runtime.NumGoroutine() <= goroutines
	})
}

func TestValidateWindow(t *testing.T) {
	var p Postgres
	for _, size := range []time.Duration{time.Millisecond, time.Second, 90 * time.Minute} {
		if err := p.ValidateWindow(size); err != nil {
			t.Errorf("ValidateWindow(%v) = %v, want nil", size, err)
		}
	}
	for _, size := range []time.Duration{0, -time.Second, 1500 * time.Microsecond, time.Nanosecond} {
		err := p.ValidateWindow(size)
		if !errors.Is(err, ErrInvalidWindow) || !errors.Is(err, strategy.ErrInvalidWindow) || !errors.Is(err, strategy.ErrRejected) || !strings.Contains(err.Error(), size.String()) {
			t.Errorf("ValidateWindow(%v) = %v, want ErrInvalidWindow naming the size", size, err)
		}
	}
}

func TestStoreKey(t *testing.T) {
	key := func(cfg string) string {
		t.Helper()
		p, err := load(t, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p.StoreKey()
	}
	base := key(`{"module": "postgres", "dsn": "postgres://a/db"}`)
	if got := key(`{"module": "postgres", "dsn": "postgres://a/db", "table": "RATE_LIMIT_COUNTERS"}`); got != base {
		t.Errorf("the default table, spelled out, gives another key: %s and %s", got, base)
	}
	for _, cfg := range []string{
		`{"module": "postgres", "dsn": "postgres://b/db"}`,
		`{"module": "postgres", "dsn": "postgres://a/db", "table": "other"}`,
		`{"module": "postgres", "dsn": "postgres://a/db", "max_conns": 3}`,
	} {
		if got := key(cfg); got == base {
			t.Errorf("%s gives the same key as the defaults: %s", cfg, got)
		}
	}
}

func TestOpenUnprovisioned(t *testing.T) {
	if _, err := new(Postgres).OpenStore(); err == nil {
		t.Fatal("OpenStore of settings never provisioned succeeded")
	}
}
