package faults

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Hits of a Redis Cluster row split by where their keys live: on the
// failed master's slots or on the others. The Redis store puts every
// counter of a (namespace, key) under the hash tag {<bucket>}, a bucket
// being FNV-1a of the two modulo 1024 (strategy/redis/doc.go documents
// the layout); CLUSTER KEYSLOT gives the tag's slot.

// redisBuckets is the Redis store's bucket count.
const redisBuckets = 1024

// redisBucket returns the bucket of a (namespace, key) pair, as the Redis
// store computes it.
func redisBucket(namespace, key string) int {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, c := range []byte(strconv.Itoa(len(namespace))) {
		h = (h ^ uint64(c)) * prime
	}
	h = (h ^ ':') * prime
	for i := 0; i < len(namespace); i++ {
		h = (h ^ uint64(namespace[i])) * prime
	}
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * prime
	}
	return int((h ^ h>>32) % redisBuckets)
}

// slotRange is a range of hash slots, both ends included.
type slotRange [2]int

// parseSlots reads the slot ranges of a CLUSTER NODES line's fields from
// the ninth on ("0-5460", "5461", "[...]" importing markers left out).
func parseSlots(fields []string) []slotRange {
	var rs []slotRange
	for _, f := range fields {
		if strings.HasPrefix(f, "[") {
			continue
		}
		lo, hi, ok := strings.Cut(f, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if ok {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 == nil && err2 == nil {
			rs = append(rs, slotRange{a, b})
		}
	}
	return rs
}

// inSlots reports whether slot is in one of the ranges.
func inSlots(rs []slotRange, slot int) bool {
	for _, r := range rs {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// onFailedSlots returns a function that reports whether a key of the
// namespace lives on the failed master's slots, asking addr for each
// bucket's slot once; nil when it cannot ask.
func onFailedSlots(ctx context.Context, addr string, failed []slotRange) func(key string) (bool, bool) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	slots := map[int]int{}
	return func(key string) (on, ok bool) {
		b := redisBucket(Namespace, key)
		slot, seen := slots[b]
		if !seen {
			n, err := c.ClusterKeySlot(ctx, "{"+strconv.Itoa(b)+"}").Result()
			if err != nil {
				return false, false
			}
			slot = int(n)
			slots[b] = slot
		}
		return inSlots(failed, slot), true
	}
}
