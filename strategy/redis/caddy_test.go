package redis

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
)

// host is a stand-in for the app's namespace config: it holds a strategy
// the way Caddy modules hold guest modules.
type host struct {
	StrategyRaw json.RawMessage `json:"strategy,omitempty" caddy:"namespace=rate_limit.strategies inline_key=module"`
}

func TestLoadFromJSON(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: testCtx(t)})
	defer cancel()
	var h host
	cfg := `{"strategy": {"module": "redis", "addresses": ["` + srv.Addr + `"], "key_prefix": "edge",
		"dial_timeout": "3s", "read_timeout": 500000000, "pool_size": 4}}`
	if err := json.Unmarshal([]byte(cfg), &h); err != nil {
		t.Fatal(err)
	}
	mod, err := ctx.LoadModule(&h, "StrategyRaw")
	if err != nil {
		t.Fatalf("loading the module: %v", err)
	}
	s, ok := mod.(strategy.Strategy)
	if !ok {
		t.Fatalf("module is a %T, not a strategy.Strategy", mod)
	}
	r := mod.(*Redis)
	if r.KeyPrefix != "edge" || r.DialTimeout != caddy.Duration(3*time.Second) ||
		r.ReadTimeout != caddy.Duration(500*time.Millisecond) || r.WriteTimeout != caddy.Duration(time.Second) || r.PoolSize != 4 {
		t.Errorf("configuration not applied: %+v", r)
	}
	opened, err := s.OpenStore()
	if err != nil {
		t.Fatalf("opening the store: %v", err)
	}
	store, ok := opened.(*Store)
	if !ok {
		t.Fatalf("the store is a %T, not a *Store", opened)
	}
	if _, ok := opened.(strategy.Hitter); !ok {
		t.Error("the store is not a strategy.Hitter")
	}
	if store.client == nil {
		t.Errorf("OpenStore did not build a client: store %p (client %v)", store, store.client)
	}
	if err := roundTrip(t, store); err != nil {
		t.Fatal(err)
	}
	if keys := keysOf(t, srv.Client(""), "*"); len(keys) == 0 || !strings.HasPrefix(keys[0], "edge:{") {
		t.Errorf("keys %q do not use the key prefix", keys)
	}
	// Unloading the config cleans the module up, which leaves the store
	// alone: the rate_limit app closes the stores it opened.
	cancel()
	if err := roundTrip(t, store); err != nil {
		t.Fatalf("after the config was unloaded: %v", err)
	}
	// Closing the store closes its client.
	if err := opened.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = store.GetWindow(testCtx(t), "auth", "k", time.Minute, 0)
	if !errors.Is(err, goredis.ErrClosed) || !errors.Is(err, strategy.ErrNotSent) {
		t.Errorf("after the store was closed, err = %v, want ErrClosed and ErrNotSent", err)
	}
}

func TestLoadByID(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: testCtx(t)})
	defer cancel()
	mod, err := ctx.LoadModuleByID("rate_limit.strategies.redis", json.RawMessage(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	r := mod.(*Redis)
	if len(r.Addresses) != 1 || r.Addresses[0] != "127.0.0.1:6379" || r.KeyPrefix != "rl" ||
		r.DialTimeout != caddy.Duration(2*time.Second) || r.ReadTimeout != caddy.Duration(time.Second) ||
		r.WriteTimeout != caddy.Duration(time.Second) || r.DB != 0 || r.TLS != nil {
		t.Errorf("defaults not applied: %+v", r)
	}
	// A bad config fails to load, naming the field.
	_, err = ctx.LoadModuleByID("rate_limit.strategies.redis", json.RawMessage(`{"db": -1}`))
	if err == nil || !strings.Contains(err.Error(), "db") || !strings.Contains(err.Error(), "-1") {
		t.Errorf("loading db -1: err = %v, want one naming db and -1", err)
	}
}

// caddy validate provisions modules: that must never dial the store.
func TestProvisionDoesNotDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The remote addresses of the connections accepted, in order.
	var accepted struct {
		sync.Mutex
		from []string
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Lock()
			accepted.from = append(accepted.from, c.RemoteAddr().String())
			accepted.Unlock()
			c.Close()
		}
	}()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: testCtx(t)})
	raw := `{"addresses": ["` + l.Addr().String() + `"], "password": "x"}`
	mod, err := ctx.LoadModuleByID("rate_limit.strategies.redis", json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	cancel() // Cleanup, as caddy validate does
	// Opening a store (the app does, in Start) does not dial either.
	store, err := mod.(strategy.Strategy).OpenStore()
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	opened, err := (&Redis{Addresses: []string{l.Addr().String()}}).Open()
	if err != nil {
		t.Fatal(err)
	}
	if err := opened.Close(); err != nil {
		t.Fatal(err)
	}
	if err := opened.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	// The test dials the listener itself, which shows that it works, and
	// waits until its own connection is accepted: the listener accepts in
	// the order connections arrive, so a stray dial of the stores made
	// before would be accepted first.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	own := c.LocalAddr().String()
	c.Close()
	from := func() []string {
		accepted.Lock()
		defer accepted.Unlock()
		return slices.Clone(accepted.from)
	}
	if !poll.For(10*time.Second, func() bool { return slices.Contains(from(), own) }) {
		t.Fatal("the listener never saw the test's own dial")
	}
	if got := from(); len(got) != 1 {
		t.Errorf("provisioning or opening dialed the store %d times (accepted %q, the test's own dial from %s)", len(got)-1, got, own)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name string
		r    Redis
		want []string // all in the error
	}{
		{"negative db", Redis{DB: -1}, []string{"db", "-1"}},
		{"db on a cluster", Redis{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}, DB: 2}, []string{"db", "Cluster", "2"}},
		{"negative pool_size", Redis{PoolSize: -3}, []string{"pool_size", "-3"}},
		{"key_prefix with {", Redis{KeyPrefix: "rl{x"}, []string{"key_prefix", "rl{x"}},
		{"key_prefix with }", Redis{KeyPrefix: "}"}, []string{"key_prefix", "}"}},
		{"negative dial_timeout", Redis{DialTimeout: caddy.Duration(-time.Second)}, []string{"dial_timeout", "-1s"}},
		{"negative read_timeout", Redis{ReadTimeout: caddy.Duration(-time.Second)}, []string{"read_timeout", "-1s"}},
		{"negative write_timeout", Redis{WriteTimeout: caddy.Duration(-time.Second)}, []string{"write_timeout", "-1s"}},
		{"address without port", Redis{Addresses: []string{"localhost"}}, []string{"addresses[0]", "localhost"}},
		{"empty address", Redis{Addresses: []string{"127.0.0.1:6379", "{env.REDIS_TEST_UNSET_VARIABLE}"}}, []string{"addresses[1]", `""`}},
		{"sentinel password without master_name", Redis{SentinelPassword: "x"}, []string{"sentinel_password", "master_name"}},
		{"missing CA file", Redis{TLS: &TLSConfig{CA: missing}}, []string{"tls.ca", missing}},
		{"CA file without a certificate", Redis{TLS: &TLSConfig{CA: garbage}}, []string{"tls.ca", garbage}},
		{"cert without key", Redis{TLS: &TLSConfig{Cert: garbage}}, []string{"cert", "key", garbage}},
		{"unreadable key pair", Redis{TLS: &TLSConfig{Cert: missing, Key: garbage}}, []string{"tls.cert", missing}},
		{"several errors", Redis{DB: -1, PoolSize: -1}, []string{"db", "pool_size"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			s, err := r.Open()
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %q, want it to contain %q", err, w)
				}
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		r := Redis{Addresses: []string{"[::1]:6379", "redis-1.internal:6380"}, KeyPrefix: "rl:eu", PoolSize: 5}
		s, err := r.Open()
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	})
}

// go-redis picks the client from the options; check that the options say
// what the configuration means. Nothing is dialed.
func TestClientKind(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Redis
		want string
	}{
		{"one address", Redis{Addresses: []string{"127.0.0.1:1"}}, "standalone 127.0.0.1:1"},
		{"default address", Redis{}, "standalone 127.0.0.1:6379"},
		{"several addresses", Redis{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}}, "cluster"},
		{"sentinel", Redis{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}, MasterName: "mymaster", DB: 2}, "sentinel"},
		{"one sentinel", Redis{Addresses: []string{"127.0.0.1:1"}, MasterName: "mymaster"}, "sentinel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			s, err := r.Open()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var got string
			switch c := s.client.(type) {
			case *goredis.ClusterClient:
				got = "cluster"
			case *goredis.Client:
				if got = "standalone " + c.Options().Addr; c.Options().Addr == "FailoverClient" {
					got = "sentinel"
				}
			default:
				got = fmt.Sprintf("%T", c)
			}
			if got != tc.want {
				t.Errorf("client is %s, want %s", got, tc.want)
			}
		})
	}
}
