package redis

import (
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/internal/testpki"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// roundTrip pushes one diff and reads it back.
func roundTrip(t *testing.T, r *Store) error {
	t.Helper()
	ctx := testCtx(t)
	size := time.Minute
	start := window.Start(steadyNow().UnixNano(), size)
	key := newID()
	if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "auth", Diffs: []window.Diff{
		{Key: key, Size: size, Start: start, Value: 2},
	}}); err != nil {
		return err
	}
	v, err := r.GetWindow(ctx, "auth", key, size, start)
	if err != nil {
		return err
	}
	if v != 2 {
		t.Errorf("read back %v, want 2", v)
	}
	return nil
}

func TestAuth(t *testing.T) {
	withPassword := redistest.Start(t, "--requirepass", "s3cret")
	withACL := redistest.Start(t, "--user", "alice", "on", ">pw", "~*", "&*", "+@all", "--user", "default", "off")
	for _, tc := range []struct {
		name     string
		addr     string
		user, pw string
		wantErr  string // empty: must work
	}{
		{"password", withPassword.Addr, "", "s3cret", ""},
		{"wrong password", withPassword.Addr, "", "nope", "WRONGPASS"},
		{"no password", withPassword.Addr, "", "", "NOAUTH"},
		{"ACL user", withACL.Addr, "alice", "pw", ""},
		{"ACL user, wrong password", withACL.Addr, "alice", "nope", "WRONGPASS"},
		{"unknown ACL user", withACL.Addr, "bob", "pw", "WRONGPASS"},
		{"disabled default user", withACL.Addr, "", "pw", "WRONGPASS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := open(t, &Redis{Addresses: []string{tc.addr}, Username: tc.user, Password: tc.pw})
			err := roundTrip(t, r)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("want success, got %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("want an error with %s, got none", tc.wantErr)
			case tc.wantErr != "" && (!strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), `namespace "auth"`)):
				t.Fatalf("err = %q, want it to say %s and name the namespace", err, tc.wantErr)
			}
		})
	}
}

func TestPasswordPlaceholder(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "from-env")
	t.Setenv("REDIS_TEST_PASSWORD", "from-env")
	t.Setenv("REDIS_TEST_ADDR", srv.Addr)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: testCtx(t)})
	defer cancel()
	r := &Redis{Addresses: []string{"{env.REDIS_TEST_ADDR}"}, Password: "{env.REDIS_TEST_PASSWORD}"}
	if err := r.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if r.Password != "from-env" || r.Addresses[0] != srv.Addr {
		t.Errorf("placeholders not replaced: password %q, addresses %q", r.Password, r.Addresses)
	}
	store, err := r.OpenStore()
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := roundTrip(t, store.(*Store)); err != nil {
		t.Fatal(err)
	}

	// Braces that are not a known placeholder are part of the password.
	withBraces := redistest.Start(t, "--requirepass", "p{x}q")
	b := open(t, &Redis{Addresses: []string{withBraces.Addr}, Password: "p{x}q"})
	if err := roundTrip(t, b); err != nil {
		t.Fatalf("a password with braces: %v", err)
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	p := testpki.Write(t, dir)
	other := testpki.Write(t, t.TempDir()) // a CA that did not sign the server
	tlsPort := redistest.FreePort(t)
	redistest.Start(t, "--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", p.ServerCert, "--tls-key-file", p.ServerKey,
		"--tls-ca-cert-file", p.CA, "--tls-auth-clients", "yes")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))

	for _, tc := range []struct {
		name    string
		tls     *TLSConfig
		wantErr bool
	}{
		{"CA and client certificate", &TLSConfig{CA: p.CA, Cert: p.ClientCert, Key: p.ClientKey}, false},
		{"server name", &TLSConfig{CA: p.CA, Cert: p.ClientCert, Key: p.ClientKey, ServerName: "redis.internal"}, false},
		{"wrong server name", &TLSConfig{CA: p.CA, Cert: p.ClientCert, Key: p.ClientKey, ServerName: "other.internal"}, true},
		{"no client certificate", &TLSConfig{CA: p.CA}, true},
		{"untrusted server", &TLSConfig{CA: other.CA, Cert: p.ClientCert, Key: p.ClientKey}, true},
		{"insecure_skip_verify", &TLSConfig{CA: other.CA, Cert: p.ClientCert, Key: p.ClientKey, InsecureSkipVerify: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := open(t, &Redis{Addresses: []string{addr}, TLS: tc.tls, DialTimeout: caddy.Duration(5 * time.Second)})
			err := roundTrip(t, r)
			if tc.wantErr != (err != nil) {
				t.Fatalf("err = %v, want error: %v", err, tc.wantErr)
			}
		})
	}
	t.Run("plain TCP to a TLS port fails", func(t *testing.T) {
		r := open(t, &Redis{Addresses: []string{addr}, DialTimeout: caddy.Duration(2 * time.Second), ReadTimeout: caddy.Duration(2 * time.Second)})
		if err := roundTrip(t, r); err == nil {
			t.Fatal("plain TCP to a TLS port worked")
		}
	})
}

// TestConformanceWithTheDocumentedRights runs the conformance suite as an
// ACL user that has only the rights docs/stores.md lists (its Rights
// paragraph, read here), on the keys under the store's prefix: a command
// the store sends, inside a script or not, that the page does not list
// fails here.
func TestConformanceWithTheDocumentedRights(t *testing.T) {
	page, err := os.ReadFile("../../docs/stores.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rights, ok := strings.Cut(string(page), "**Rights.** The store reads and writes only keys under its prefix.")
	if !ok {
		t.Fatal("docs/stores.md has no Rights paragraph for Redis")
	}
	rights, _, _ = strings.Cut(rights, "A test runs")
	acl := []string{"--user", "limiter", "on", ">pw", "~rl:*"}
	for _, m := range regexp.MustCompile("`([A-Z][A-Z ]*|\\+@[a-z]+)`").FindAllStringSubmatch(rights, -1) {
		cmd := strings.ToLower(m[1])
		if !strings.HasPrefix(cmd, "+@") {
			cmd = "+" + strings.ReplaceAll(cmd, " ", "|") // CLUSTER SLOTS: +cluster|slots
		}
		acl = append(acl, cmd)
	}
	t.Logf("ACL from docs/stores.md: %s", strings.Join(acl[2:], " "))
	srv := redistest.Start(t, acl...)
	settings := provisioned(t, &Redis{Addresses: []string{srv.Addr}, Username: "limiter", Password: "pw", ReadTimeout: caddy.Duration(5 * time.Second)})
	if settings.KeyPrefix != "rl" {
		t.Fatalf("the default prefix is %q, not the ACL's rl", settings.KeyPrefix)
	}
	h := harness(t, []string{srv.Addr}, []*goredis.Client{srv.Client("")}, nil) // the default user inspects
	h.Open = func(t *testing.T) strategy.Store {
		s, err := settings.OpenStore()
		if err != nil {
			t.Fatalf("opening a store: %v", err)
		}
		return s
	}
	strategytest.Run(t, h)
}
