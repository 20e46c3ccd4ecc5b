package redis

import (
	"testing"

	goredis "github.com/redis/go-redis/v9"
)

// ratesOf counts the keys' TATs of a namespace on every master
// (<prefix>:{<bucket>}:rate:<window ms>:<len(ns)>:<ns>:<key>) that still
// exist: PTTL is not -2, so a key past its expiry that Redis has not
// reclaimed yet is not counted.
func ratesOf(t *testing.T, masters []*goredis.Client, prefix, namespace string) int {
	t.Helper()
	ctx := testCtx(t)
	pattern := globEscape(prefix) + ":{*}:rate:*:" + globEscape(nsPart(namespace)) + "*"
	n := 0
	for _, c := range masters {
		seen := make(map[string]bool) // SCAN may return a key twice
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			key := iter.Val()
			if seen[key] {
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
