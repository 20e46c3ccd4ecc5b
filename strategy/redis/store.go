package redis

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// errs words the store's errors.
var errs = strategy.Errors{Store: "redis"}

// Store is a store of window counters in Redis, opened from Redis
// settings (see the package documentation for the capabilities it
// implements, and docs/stores.md for its keys). It is safe for
// concurrent use. It dials when first used, not before; Close
// closes its client.
type Store struct {
	client goredis.UniversalClient
	// cluster is set when client is a Cluster client, whose scripts and
	// MGETs must keep to one slot (one bucket); a standalone server or a
	// Sentinel-managed primary takes keys of any buckets in one.
	cluster bool
	layout  *layout
	// prevs remembers the counts that synchronous hits' replies gave, so
	// that a hit can send its previous window's count instead of having
	// the script read it.
	prevs  *prevCache
	closed atomic.Bool // set by Close
	// topo keeps a Cluster client's slot map fresh after failures; nil
	// for a standalone server or a Sentinel-managed primary.
	topo *topology
	// now is the clock that decides which diffs have ended and how long
	// markers live; tests replace it. Counters and slots expire by the
	// server's clock.
	now func() time.Time
}

// newStore returns a store of r's checked settings, with a client of its
// own. It does not dial. The first store routes go-redis's own log lines
// to Caddy's logger (see goredisLog).
func newStore(r *Redis) *Store {
	routeLogs()
	var tlsConfig *tls.Config
	if r.tlsConfig != nil {
		tlsConfig = r.tlsConfig.Clone() // one per client, never shared
	}
	opts := &goredis.UniversalOptions{
		Addrs:            r.Addresses,
		MasterName:       r.MasterName,
		Username:         r.Username,
		Password:         r.Password,
		SentinelUsername: r.SentinelUsername,
		SentinelPassword: r.SentinelPassword,
		DB:               r.DB,
		TLSConfig:        tlsConfig,
		DialTimeout:      time.Duration(r.DialTimeout),
		ReadTimeout:      time.Duration(r.ReadTimeout),
		WriteTimeout:     time.Duration(r.WriteTimeout),
		PoolSize:         r.PoolSize,
		// Fail fast when the store is down: the sync loop tries again at
		// its next tick, and a synchronous hit must not hang a request.
		// One retry still covers a pooled connection that a server
		// restart broke. Hits opt out of it (noRetryCmd).
		MaxRetries:    1,
		DialerRetries: 2,
		// Give up on a cancelled or timed-out sync at once.
		ContextTimeoutEnabled: true,
	}
	if r.MasterName == "" && len(r.Addresses) > 1 { // a Cluster
		// A master that refuses a dial is down: its slots fail at once
		// (strategy.Parted), and the call's other masters' share is not
		// held back by dials and resends to it, which go-redis's
		// defaults (a dial retried after 100 ms, three resends with a
		// backoff of up to 512 ms) made last up to a second. Two
		// resends still follow a MOVED and then an ASK while slots
		// migrate; a failed part is pinged again within 250 ms.
		opts.DialerRetries = 1
		opts.MaxRedirects = 2
		opts.MaxRetryBackoff = 16 * time.Millisecond
	}
	client := goredis.NewUniversalClient(opts)
	s := &Store{
		client: client,
		layout: r.layout,
		prevs:  newPrevCache(),
		now:    time.Now,
	}
	if cc, ok := client.(*goredis.ClusterClient); ok {
		s.cluster = true
		// A reload in the background is a CLUSTER SLOTS, tried on the
		// nodes one after the other until one answers.
		s.topo = newTopology(cc, 2*time.Duration(r.DialTimeout)+time.Duration(r.ReadTimeout))
	}
	return s
}

// Close closes the store's client and its connections (see
// strategy.Store). Calling it again does nothing. Calls made after it
// fail with an error that wraps strategy.ErrNotSent and go-redis's
// ErrClosed.
func (s *Store) Close() error {
	s.closed.Store(true)
	err := s.client.Close()
	if s.topo != nil {
		s.topo.close() // after the client, which ends a reload at once
	}
	if err != nil && !errors.Is(err, goredis.ErrClosed) {
		return fmt.Errorf("closing redis client: %w", err)
	}
	return nil
}

// Parts returns how many parts the store has (see strategy.Parted): on a
// Cluster one per bucket, as a bucket is one slot, served by one master;
// 1 on a standalone server, which answers or fails as a whole.
func (s *Store) Parts() int {
	if s.cluster {
		return buckets
	}
	return 1
}

// PartOf returns the part of the store that holds key's data in
// namespace: on a Cluster its bucket, 0 elsewhere.
func (s *Store) PartOf(namespace, key string) int {
	if !s.cluster {
		return 0
	}
	return bucketOf(namespace, key)
}

// partial returns err, the failure of the given buckets' share of a call,
// as a strategy.PartialError on a Cluster, where the other masters may
// answer; elsewhere, and for input refused (strategy.ErrRejected), as it
// is.
func (s *Store) partial(err error, buckets ...int) error {
	if err == nil || !s.cluster || errors.Is(err, strategy.ErrRejected) {
		return err
	}
	return strategy.Partial(err, buckets...)
}

// partFailures gathers the failures of a call's pipelines on a Cluster,
// whose other masters' commands go on (strategy.Parted): the first error,
// and the bucket of each command that failed.
type partFailures struct {
	first   error
	buckets []int
}

// add records err, the failure of bucket's share of the call.
func (f *partFailures) add(err error, bucket int) {
	f.first = cmp.Or(f.first, err)
	f.buckets = append(f.buckets, bucket)
}

// addFailed records err, a pipeline's failure, and the bucket of each of
// its commands that failed, bucket(i) being that of cmds[i].
func addFailed[C interface{ Err() error }](f *partFailures, err error, cmds []C, bucket func(i int) int) {
	f.first = cmp.Or(f.first, err)
	for i, cmd := range cmds {
		if cmd.Err() != nil {
			f.add(err, bucket(i))
		}
	}
}

// checkOpen returns an error that wraps strategy.ErrNotSent and go-redis's
// ErrClosed once Close was called, for the calls whose own errors cannot
// tell a closed client from a resend that failed.
func (s *Store) checkOpen() error {
	if s.closed.Load() {
		return errs.NotSent(goredis.ErrClosed)
	}
	return nil
}

// notSent wraps err with strategy.ErrNotSent when it shows that a command
// never reached Redis: dialing failed (go-redis writes nothing before it
// has a connection), the pool had no free connection in time, or the
// client was closed. Other errors, timeouts and resets among them, come
// after the command may have been written, and are returned as they are.
func notSent(err error) error {
	var op *net.OpError
	if errors.Is(err, goredis.ErrClosed) || errors.Is(err, goredis.ErrPoolTimeout) ||
		(errors.As(err, &op) && op.Op == "dial") {
		return errs.NotSent(err)
	}
	return err
}

// Interface guards
var (
	_ strategy.BatchHitter = (*Store)(nil)
	_ strategy.Slotter     = (*Store)(nil)
	_ strategy.Banner      = (*Store)(nil)
	_ strategy.NearFeed    = (*Store)(nil)
	_ strategy.Parted      = (*Store)(nil)
)
