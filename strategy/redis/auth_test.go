package redis

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
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

// pki writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, as PEM files in dir.
type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newPKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	p := pki{ca: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.ca, "CERTIFICATE", caDER)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
			DNSNames:     []string{"redis.internal"},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "PRIVATE KEY", keyDER)
		return certFile, keyFile
	}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	p := newPKI(t, dir)
	other := newPKI(t, t.TempDir()) // a CA that did not sign the server
	tlsPort := redistest.FreePort(t)
	redistest.Start(t, "--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", p.serverCert, "--tls-key-file", p.serverKey,
		"--tls-ca-cert-file", p.ca, "--tls-auth-clients", "yes")
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))

	for _, tc := range []struct {
		name    string
		tls     *TLSConfig
		wantErr bool
	}{
		{"CA and client certificate", &TLSConfig{CA: p.ca, Cert: p.clientCert, Key: p.clientKey}, false},
		{"server name", &TLSConfig{CA: p.ca, Cert: p.clientCert, Key: p.clientKey, ServerName: "redis.internal"}, false},
		{"wrong server name", &TLSConfig{CA: p.ca, Cert: p.clientCert, Key: p.clientKey, ServerName: "other.internal"}, true},
		{"no client certificate", &TLSConfig{CA: p.ca}, true},
		{"untrusted server", &TLSConfig{CA: other.ca, Cert: p.clientCert, Key: p.clientKey}, true},
		{"insecure_skip_verify", &TLSConfig{CA: other.ca, Cert: p.clientCert, Key: p.clientKey, InsecureSkipVerify: true}, false},
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
