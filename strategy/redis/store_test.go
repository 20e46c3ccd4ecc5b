package redis

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/internal/testpki"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// provisioned returns r after the setup that Provision does, holding
// nothing.
func provisioned(t *testing.T, r *Redis) *Redis {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: testCtx(t)})
	defer cancel()
	if err := r.Provision(ctx); err != nil {
		t.Fatalf("provisioning: %v", err)
	}
	return r
}

// Two settings share a store exactly when they would connect the same way.
func TestStoreKey(t *testing.T) {
	dir := t.TempDir()
	p := testpki.Write(t, dir)
	base := func() *Redis {
		return &Redis{Addresses: []string{"127.0.0.1:6379"}, Password: "pw", TLS: &TLSConfig{CA: p.CA}}
	}
	key := provisioned(t, base()).StoreKey()
	if got := provisioned(t, base()).StoreKey(); got != key {
		t.Errorf("the same settings have two keys:\n%s\n%s", key, got)
	}

	// Placeholders and defaults are applied first.
	t.Setenv("REDIS_TEST_STORE_PASSWORD", "pw")
	same := base()
	same.Password = "{env.REDIS_TEST_STORE_PASSWORD}"
	same.KeyPrefix, same.DialTimeout = defaultKeyPrefix, caddy.Duration(defaultDialTimeout)
	if got := provisioned(t, same).StoreKey(); got != key {
		t.Errorf("a placeholder and explicit defaults changed the key:\n%s\n%s", key, got)
	}
	if empty, def := provisioned(t, &Redis{}).StoreKey(), provisioned(t, &Redis{Addresses: []string{defaultAddress}}).StoreKey(); empty != def {
		t.Errorf("the default address changed the key:\n%s\n%s", empty, def)
	}

	// Every connection setting changes it.
	for name, change := range map[string]func(r *Redis){
		"addresses":            func(r *Redis) { r.Addresses = []string{"127.0.0.1:6380"} },
		"master_name":          func(r *Redis) { r.MasterName = "mymaster" },
		"username":             func(r *Redis) { r.Username = "alice" },
		"password":             func(r *Redis) { r.Password = "other" },
		"sentinel_username":    func(r *Redis) { r.MasterName, r.SentinelUsername = "mymaster", "bob" },
		"sentinel_password":    func(r *Redis) { r.MasterName, r.SentinelPassword = "mymaster", "x" },
		"db":                   func(r *Redis) { r.DB = 3 },
		"no tls":               func(r *Redis) { r.TLS = nil },
		"tls.ca":               func(r *Redis) { r.TLS.CA = "" },
		"tls.cert, tls.key":    func(r *Redis) { r.TLS.Cert, r.TLS.Key = p.ClientCert, p.ClientKey },
		"tls.server_name":      func(r *Redis) { r.TLS.ServerName = "redis.internal" },
		"insecure_skip_verify": func(r *Redis) { r.TLS.InsecureSkipVerify = true },
		"dial_timeout":         func(r *Redis) { r.DialTimeout = caddy.Duration(3 * time.Second) },
		"read_timeout":         func(r *Redis) { r.ReadTimeout = caddy.Duration(3 * time.Second) },
		"write_timeout":        func(r *Redis) { r.WriteTimeout = caddy.Duration(3 * time.Second) },
		"pool_size":            func(r *Redis) { r.PoolSize = 7 },
		"key_prefix":           func(r *Redis) { r.KeyPrefix = "edge" },
	} {
		r := base()
		change(r)
		if got := provisioned(t, r).StoreKey(); got == key {
			t.Errorf("changing %s left the key as it was: %s", name, got)
		}
	}

	// So does a new CA in the same file, as a reload after a rotation.
	rotated := testpki.Write(t, t.TempDir())
	pem, err := os.ReadFile(rotated.CA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.CA, pem, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := provisioned(t, base()).StoreKey(); got == key {
		t.Errorf("a new CA in %s left the key as it was", filepath.Base(p.CA))
	}
}

// The module opens stores of its own client each; closing one leaves the
// others working.
func TestOpenStore(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := (&Redis{}).OpenStore(); err == nil || !strings.Contains(err.Error(), "provisioned") {
		t.Errorf("OpenStore of settings never provisioned: err = %v, want one saying so", err)
	}
	m := provisioned(t, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(5 * time.Second)})
	var stores [2]*Store
	for i := range stores {
		s, err := m.OpenStore()
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s.(*Store)
		t.Cleanup(func() { s.Close() })
	}
	if stores[0] == stores[1] || stores[0].client == stores[1].client {
		t.Fatalf("the stores share a client: %p, %p", stores[0].client, stores[1].client)
	}
	for i, s := range stores {
		if err := roundTrip(t, s); err != nil {
			t.Fatalf("store %d: %v", i, err)
		}
	}
	if err := stores[0].Close(); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(t, stores[1]); err != nil {
		t.Fatalf("store 1 after store 0 was closed: %v", err)
	}
}

func TestValidateWindow(t *testing.T) {
	var r Redis // settings are not needed
	for _, size := range []time.Duration{time.Millisecond, time.Second, 1500 * time.Millisecond, time.Hour, 24 * time.Hour} {
		if err := r.ValidateWindow(size); err != nil {
			t.Errorf("ValidateWindow(%v) = %v, want nil", size, err)
		}
	}
	for _, size := range []time.Duration{0, -time.Second, time.Microsecond, 1500 * time.Microsecond, time.Second + 1} {
		err := r.ValidateWindow(size)
		if !errors.Is(err, ErrInvalidWindow) || !errors.Is(err, strategy.ErrInvalidWindow) || !errors.Is(err, strategy.ErrRejected) || !strings.Contains(err.Error(), size.String()) {
			t.Errorf("ValidateWindow(%v) = %v, want ErrInvalidWindow naming the size", size, err)
		}
	}
}

// Every call made after Close fails with ErrNotSent, without reaching
// Redis.
func TestClosedStore(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	now := steadyNow()
	size := time.Minute
	start := window.Start(now.UnixNano(), size)
	if err := roundTrip(t, r); err != nil { // opens a connection
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
	resetStats(t, c)
	check := func(call string, err error) {
		t.Helper()
		if !errors.Is(err, strategy.ErrNotSent) || !errors.Is(err, goredis.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrNotSent and ErrClosed", call, err)
		}
	}
	check("PushDiffs", r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "closed", Diffs: []window.Diff{
		{Key: "k", Size: size, Start: start, Value: 1},
	}}))
	_, err := r.GetCounters(ctx, "closed", []string{"k"}, []time.Duration{size}, now)
	check("GetCounters", err)
	check("Reset", r.Reset(ctx, "closed", "k", []time.Duration{size}, now))
	_, _, err = r.Hit(ctx, "closed", "k", newID(), []strategy.WindowHit{{Size: size, Start: start, Value: 1, Max: math.Inf(1)}}, false)
	check("Hit", err)
	_, err = r.GetWindow(ctx, "closed", "k", size, start)
	check("GetWindow", err)
	if calls := serverCalls(t, c); len(calls) != 0 {
		t.Errorf("calls after Close reached Redis: %v", calls)
	}
}
