package redis

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

func init() {
	caddy.RegisterModule(Redis{})
}

// Defaults of the connection settings.
const (
	defaultAddress      = "127.0.0.1:6379"
	defaultKeyPrefix    = "rl"
	defaultDialTimeout  = 2 * time.Second
	defaultReadTimeout  = time.Second
	defaultWriteTimeout = time.Second
)

// Redis is a rate-limit strategy that keeps the shared counters of a
// namespace in Redis: a standalone server, a primary managed by Redis
// Sentinel, or a Redis Cluster, chosen by the configuration the way go-redis
// chooses: several addresses mean a Cluster, unless master_name is set,
// which means Sentinel.
//
// Each counter is one key that expires on its own, spread over 1024 hash
// tags so that a Cluster shares the load of a namespace among all its
// nodes. A periodic sync pushes the diffs of a batch in one round trip and
// never applies a retried batch twice; a synchronous hit costs one round
// trip, and so does taking a concurrency slot (max_concurrent), which
// expires by the server's clock. Connections are made when first needed:
// loading or validating a configuration never dials Redis.
//
// The addresses, credentials, master_name and TLS file names may hold
// global placeholders such as {env.REDIS_PASSWORD}, replaced when the
// configuration loads.
type Redis struct {
	// Addresses are the host:port addresses of Redis. One address is a
	// standalone server; several are the seed nodes of a Redis Cluster;
	// with master_name set, they are the Sentinels to ask for the primary.
	// Default: ["127.0.0.1:6379"].
	Addresses []string `json:"addresses,omitempty"`

	// MasterName is the name of the primary that Redis Sentinel monitors.
	// Setting it makes addresses the Sentinels' addresses. Default: unset
	// (no Sentinel).
	MasterName string `json:"master_name,omitempty"`

	// Username is the ACL user to authenticate as (Redis 6 and later).
	// Default: unset, which authenticates as the default user when a
	// password is set.
	Username string `json:"username,omitempty"`

	// Password authenticates to Redis, with username if set. Use a
	// placeholder such as {env.REDIS_PASSWORD} to keep it out of the
	// configuration. Default: unset (no authentication).
	Password string `json:"password,omitempty"`

	// SentinelUsername is the ACL user to authenticate to the Sentinels as.
	// Default: unset.
	SentinelUsername string `json:"sentinel_username,omitempty"`

	// SentinelPassword authenticates to the Sentinels. Default: unset (the
	// Sentinels need no authentication).
	SentinelPassword string `json:"sentinel_password,omitempty"`

	// DB is the number of the logical database to use. A Redis Cluster has
	// only database 0. Default: 0.
	DB int `json:"db,omitempty"`

	// TLS, when present, makes every connection to Redis (and to the
	// Sentinels) use TLS. An empty object uses TLS with the system's
	// certificate authorities. Default: unset (plain TCP).
	TLS *TLSConfig `json:"tls,omitempty"`

	// DialTimeout bounds the time to open a connection. A call tries to
	// connect at most twice and resends a command at most once after a
	// network error (a synchronous hit never, as it could count twice), so
	// a store that is down fails calls quickly; the caller's deadline
	// bounds them too. On a Cluster, a call that failed on a master whose
	// slots a promoted replica serves by then is sent to it once more
	// (a hit only if it surely was not sent). Default: 2s.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// ReadTimeout bounds the wait for a reply to a command or a pipeline.
	// Default: 1s.
	ReadTimeout caddy.Duration `json:"read_timeout,omitempty"`

	// WriteTimeout bounds the time to send a command or a pipeline.
	// Default: 1s.
	WriteTimeout caddy.Duration `json:"write_timeout,omitempty"`

	// PoolSize is the most connections kept open to each Redis node.
	// Default: 0, which means go-redis's default of 10 per CPU.
	PoolSize int `json:"pool_size,omitempty"`

	// KeyPrefix starts the name of every key this strategy writes, so that
	// several deployments can share one Redis. It may not contain '{' or
	// '}', which would choose the Cluster slot. Default: "rl".
	KeyPrefix string `json:"key_prefix,omitempty"`

	// The checked settings, made by Provision or Open.
	tlsConfig *tls.Config
	tlsDigest string // of the TLS files' contents
	layout    *layout
}

// TLSConfig configures TLS for the connections to Redis.
type TLSConfig struct {
	// CA is the path of a PEM file of the certificate authorities that may
	// sign the server's certificate. Default: the system's authorities.
	CA string `json:"ca,omitempty"`

	// Cert is the path of a PEM client certificate, for servers that
	// authenticate clients by certificate. It needs key. Default: unset (no
	// client certificate).
	Cert string `json:"cert,omitempty"`

	// Key is the path of the PEM private key of cert. Default: unset.
	Key string `json:"key,omitempty"`

	// ServerName is the name expected in the server's certificate.
	// Default: the host of the address being dialed.
	ServerName string `json:"server_name,omitempty"`

	// InsecureSkipVerify accepts any server certificate. It makes TLS
	// useless against an active attacker; use it only for testing.
	// Default: false.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Redis) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rate_limit.strategies.redis",
		New: func() caddy.Module { return new(Redis) },
	}
}

// Provision replaces placeholders, applies defaults and checks the result
// (as Validate does), reading the TLS files it names. It holds nothing: the
// rate_limit app opens the store (OpenStore), which connects when first
// used.
func (r *Redis) Provision(ctx caddy.Context) error {
	if err := r.setup(); err != nil {
		return err
	}
	ctx.Logger().Debug("redis strategy configured",
		zap.Strings("addresses", r.Addresses),
		zap.String("master_name", r.MasterName),
		zap.Int("db", r.DB),
		zap.Bool("tls", r.TLS != nil),
		zap.String("key_prefix", r.KeyPrefix))
	return nil
}

// Open prepares r's settings and opens a store of them for use outside
// Caddy, from Go code or tests: it does what Provision and Validate do
// (placeholders, defaults, checks), then what OpenStore does, without
// dialing Redis. Fill in the configuration fields first, and close the
// store when done:
//
//	r := &redis.Redis{Addresses: []string{"10.0.0.5:6379"}, Password: "secret"}
//	s, err := r.Open()
//	if err != nil { ... }
//	defer s.Close()
func (r *Redis) Open() (*Store, error) {
	if err := r.setup(); err != nil {
		return nil, err
	}
	return r.openStore()
}

// OpenStore returns a new store for r's settings (see strategy.Strategy),
// with a client of its own, which the caller closes with Close. It does
// not dial: connections are opened when first used. r must be provisioned
// (or opened).
func (r *Redis) OpenStore() (strategy.Store, error) {
	return strategy.OpenStore(r.openStore)
}

func (r *Redis) openStore() (*Store, error) {
	if r.layout == nil {
		return nil, errs.Settings(errors.New("opening a store of settings that were not provisioned"))
	}
	return newStore(r), nil
}

// StoreKey identifies the store that r's settings open (see
// strategy.Strategy): every setting, after placeholders and defaults, and
// a digest of the TLS files' contents, so that a reload after a
// certificate changed opens a new store. It holds the passwords.
func (r *Redis) StoreKey() string {
	b, err := json.Marshal(struct {
		Settings *Redis `json:"settings"`
		TLSFiles string `json:"tls_files,omitempty"`
	}{r, r.tlsDigest})
	if err != nil { // a struct of strings, numbers and bools always encodes
		panic(fmt.Sprintf("redis strategy: encoding the store key: %v", err))
	}
	return string(b)
}

// ValidateWindow refuses a window size that the key layout cannot express:
// one that is not a positive whole number of milliseconds. The error names
// the size and wraps ErrInvalidWindow.
func (r *Redis) ValidateWindow(size time.Duration) error {
	return errs.Settings(strategy.CheckSize(size))
}

// setup is the part of Provision that needs no Caddy context.
func (r *Redis) setup() error {
	repl := caddy.NewReplacer()
	// ReplaceKnown, not ReplaceAll: a password may contain braces that are
	// not a placeholder, and they must survive.
	expand := func(s string) string { return repl.ReplaceKnown(s, "") }
	addrs := make([]string, 0, len(r.Addresses))
	for _, a := range r.Addresses {
		addrs = append(addrs, expand(a))
	}
	if len(addrs) == 0 {
		addrs = append(addrs, defaultAddress)
	}
	r.Addresses = addrs
	r.MasterName = expand(r.MasterName)
	r.Username = expand(r.Username)
	r.Password = expand(r.Password)
	r.SentinelUsername = expand(r.SentinelUsername)
	r.SentinelPassword = expand(r.SentinelPassword)
	if r.KeyPrefix == "" {
		r.KeyPrefix = defaultKeyPrefix
	}
	if r.DialTimeout == 0 {
		r.DialTimeout = caddy.Duration(defaultDialTimeout)
	}
	if r.ReadTimeout == 0 {
		r.ReadTimeout = caddy.Duration(defaultReadTimeout)
	}
	if r.WriteTimeout == 0 {
		r.WriteTimeout = caddy.Duration(defaultWriteTimeout)
	}
	// Check before a client is built: go-redis panics on some bad values,
	// such as a negative pool size.
	if err := r.Validate(); err != nil {
		return err
	}
	if r.TLS != nil {
		var err error
		if r.tlsConfig, r.tlsDigest, err = r.TLS.build(expand); err != nil {
			return errs.Settings(err)
		}
	}
	r.layout = newLayout(r.KeyPrefix)
	return nil
}

// build makes the tls.Config, reading the files it names. It returns too
// a digest of the files' contents, for the store key.
func (t *TLSConfig) build(expand func(string) string) (*tls.Config, string, error) {
	t.CA, t.Cert, t.Key = expand(t.CA), expand(t.Cert), expand(t.Key)
	t.ServerName = expand(t.ServerName)
	digest := sha256.New()
	read := func(path string) ([]byte, error) {
		b, err := os.ReadFile(path)
		fmt.Fprintf(digest, "%d:", len(b))
		digest.Write(b)
		return b, err
	}
	c := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify,
	}
	if t.CA != "" {
		pem, err := read(t.CA)
		if err != nil {
			return nil, "", fmt.Errorf("tls.ca: reading %s: %w", t.CA, err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("tls.ca: no PEM certificate in %s", t.CA)
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, "", fmt.Errorf("tls: cert %q and key %q must be set together", t.Cert, t.Key)
	}
	if t.Cert != "" {
		cert, err := read(t.Cert)
		if err != nil {
			return nil, "", fmt.Errorf("tls.cert: reading %s: %w", t.Cert, err)
		}
		key, err := read(t.Key)
		if err != nil {
			return nil, "", fmt.Errorf("tls.key: reading %s: %w", t.Key, err)
		}
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, "", fmt.Errorf("tls.cert, tls.key: loading %s and %s: %w", t.Cert, t.Key, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	return c, hex.EncodeToString(digest.Sum(nil)), nil
}

// Validate checks the configuration, with errors that name the field and
// the value. It never dials Redis. Provision runs it too.
func (r *Redis) Validate() error {
	var problems []error
	for i, a := range r.Addresses {
		if host, port, err := net.SplitHostPort(a); err != nil || host == "" || port == "" {
			problems = append(problems, fmt.Errorf("addresses[%d]: %q is not host:port", i, a))
		}
	}
	if r.DB < 0 {
		problems = append(problems, fmt.Errorf("db: must not be negative, got %d", r.DB))
	}
	if r.DB != 0 && r.MasterName == "" && len(r.Addresses) > 1 {
		problems = append(problems, fmt.Errorf("db: a Redis Cluster (several addresses) has only database 0, got %d", r.DB))
	}
	if r.PoolSize < 0 {
		problems = append(problems, fmt.Errorf("pool_size: must not be negative, got %d", r.PoolSize))
	}
	if strings.ContainsAny(r.KeyPrefix, "{}") {
		problems = append(problems, fmt.Errorf("key_prefix: %q may not contain '{' or '}', which would choose the Redis Cluster slot", r.KeyPrefix))
	}
	for _, d := range []struct {
		field string
		val   caddy.Duration
	}{{"dial_timeout", r.DialTimeout}, {"read_timeout", r.ReadTimeout}, {"write_timeout", r.WriteTimeout}} {
		if d.val < 0 {
			problems = append(problems, fmt.Errorf("%s: must not be negative, got %v", d.field, time.Duration(d.val)))
		}
	}
	if (r.SentinelUsername != "" || r.SentinelPassword != "") && r.MasterName == "" {
		problems = append(problems, errors.New("sentinel_username, sentinel_password: need master_name"))
	}
	return errs.Settings(problems...)
}

// Interface guards
var (
	_ caddy.Provisioner     = (*Redis)(nil)
	_ caddy.Validator       = (*Redis)(nil)
	_ caddyfile.Unmarshaler = (*Redis)(nil)
	_ strategy.Strategy     = (*Redis)(nil)
)
