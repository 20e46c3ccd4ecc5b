package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/strategy/strategytest"
)

// The conformance suite, against a standalone server and a Cluster of three
// masters. Stores are opened the way the rate_limit app opens them: from
// provisioned settings, with OpenStore.
func TestConformance(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		srv := redistest.Start(t)
		strategytest.Run(t, harness(t, []string{srv.Addr}, []*goredis.Client{srv.Client("")}, nil))
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		var masters []*goredis.Client
		for _, s := range cl.Servers {
			masters = append(masters, s.Client(""))
		}
		strategytest.Run(t, harness(t, cl.Addrs, masters, cl))
	})
}

// harness opens stores of the Redis at addrs, and inspects it through a
// plain client of each master; with cl, the Cluster of addrs, it fails a
// part by killing the master of its slot.
func harness(t *testing.T, addrs []string, masters []*goredis.Client, cl *redistest.Cluster) strategytest.Harness {
	settings := provisioned(t, &Redis{Addresses: addrs, ReadTimeout: caddy.Duration(5 * time.Second)})
	var failPart func(t *testing.T, namespace, key string) func()
	if cl != nil {
		failPart = func(t *testing.T, namespace, key string) func() {
			return killMasterOf(t, cl, settings.KeyPrefix, bucketOf(namespace, key))
		}
	}
	return strategytest.Harness{
		FailPart: failPart,
		Open: func(t *testing.T) strategy.Store {
			s, err := settings.OpenStore()
			if err != nil {
				t.Fatalf("opening a store: %v", err)
			}
			return s
		},
		Counters: func(t *testing.T, s strategy.Store, namespace string) int {
			return countersOf(t, masters, settings.KeyPrefix, namespace)
		},
		Slots: func(t *testing.T, s strategy.Store, namespace string) int {
			return slotsOf(t, masters, settings.KeyPrefix, namespace)
		},
		Rates: func(t *testing.T, s strategy.Store, namespace string) int {
			return ratesOf(t, masters, settings.KeyPrefix, namespace)
		},
		Cost: func(t *testing.T) int64 {
			var total int64
			for _, c := range masters {
				info, err := c.InfoMap(testCtx(t), "stats").Result()
				if err != nil {
					t.Fatalf("INFO stats of %s: %v", c.Options().Addr, err)
				}
				for _, field := range []string{"keyspace_hits", "keyspace_misses"} {
					n, err := strconv.ParseInt(info["Stats"][field], 10, 64)
					if err != nil {
						t.Fatalf("INFO stats of %s: %s is %q: %v", c.Options().Addr, field, info["Stats"][field], err)
					}
					total += n
				}
			}
			return total
		},
	}
}

// countersOf counts the live counter keys of a namespace on every master:
// SCAN for keys that may be its counters, then keep those that parse as one
// (<prefix>:{<bucket>}:<size ms>:<start ms>:<len(ns)>:<ns>:<key>, which
// leaves out dedupe markers) and still exist (PTTL is not -2: a key past
// its expiry that Redis has not reclaimed yet is dropped now).
func countersOf(t *testing.T, masters []*goredis.Client, prefix, namespace string) int {
	t.Helper()
	ctx := testCtx(t)
	nsp := nsPart(namespace)
	pattern := globEscape(prefix) + ":{*}:*:" + globEscape(nsp) + "*"
	n := 0
	for _, c := range masters {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		seen := make(map[string]bool) // SCAN may return a key twice
		for iter.Next(ctx) {
			key := iter.Val()
			if seen[key] || !isCounterOf(key, prefix, nsp) {
				continue
			}
			seen[key] = true
			ttl, err := c.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatalf("PTTL %q: %v", key, err)
			}
			if ttl != -2 {
				n++
			}
		}
		if err := iter.Err(); err != nil {
			t.Fatalf("SCAN of %s: %v", c.Options().Addr, err)
		}
	}
	return n
}

// slotsOf counts the concurrency slots of a namespace on every master,
// expired or not, in the sorted sets of its keys that still exist (each
// vanishes when its latest slot expires): SCAN for the sets'
// keys, <prefix>:{<bucket>}:slots:<len(ns)>:<ns>:<key>, then ZCARD each.
func slotsOf(t *testing.T, masters []*goredis.Client, prefix, namespace string) int {
	t.Helper()
	ctx := testCtx(t)
	pattern := globEscape(prefix) + ":{*}:slots:" + globEscape(nsPart(namespace)) + "*"
	n := 0
	for _, c := range masters {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		seen := make(map[string]bool) // SCAN may return a key twice
		for iter.Next(ctx) {
			key := iter.Val()
			if seen[key] {
				continue
			}
			seen[key] = true
			card, err := c.ZCard(ctx, key).Result()
			if err != nil {
				t.Fatalf("ZCARD %q: %v", key, err)
			}
			n += int(card)
		}
		if err := iter.Err(); err != nil {
			t.Fatalf("SCAN of %s: %v", c.Options().Addr, err)
		}
	}
	return n
}

// isCounterOf reports whether key is a counter of the namespace whose
// nsPart is nsp.
func isCounterOf(key, prefix, nsp string) bool {
	rest, ok := strings.CutPrefix(key, prefix+":{")
	if !ok {
		return false
	}
	bucket, rest, ok := strings.Cut(rest, "}:")
	if _, err := strconv.Atoi(bucket); !ok || err != nil {
		return false
	}
	for range 2 { // size and start, in milliseconds
		var num string
		if num, rest, ok = strings.Cut(rest, ":"); !ok {
			return false
		}
		if _, err := strconv.ParseInt(num, 10, 64); err != nil {
			return false
		}
	}
	return strings.HasPrefix(rest, nsp)
}

// globEscape escapes the characters that Redis's glob patterns interpret.
func globEscape(s string) string {
	var b strings.Builder
	for i := range len(s) { // bytes: keys need not be UTF-8
		if strings.IndexByte(`*?[]\`, s[i]) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// killMasterOf kills the master of a bucket's slot, and returns a
// function that restarts it (empty, with its slots) and returns once the
// Cluster serves the slot again.
func killMasterOf(t *testing.T, cl *redistest.Cluster, prefix string, bucket int) func() {
	t.Helper()
	tag := newLayout(prefix).tags[bucket] + "x"
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs})
	defer cc.Close()
	master, err := cc.MasterForKey(testCtx(t), tag)
	if err != nil {
		t.Fatalf("finding the master of bucket %d: %v", bucket, err)
	}
	for _, s := range cl.Servers {
		if s.Addr == master.Options().Addr {
			s.Kill()
			return func() {
				s.Restart()
				c := s.Client("")
				poll.Until(t, 30*time.Second, "the restarted master to serve its slots", func() bool {
					info, err := c.ClusterInfo(context.Background()).Result()
					return err == nil && strings.Contains(info, "cluster_state:ok")
				})
			}
		}
	}
	t.Fatalf("the master of bucket %d, %s, is no server of the Cluster", bucket, master.Options().Addr)
	return nil
}
