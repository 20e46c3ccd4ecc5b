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
// bucket's slot once.
func onFailedSlots(ctx context.Context, addr string, failed []slotRange) func(key string) (bool, bool) {
	slots := newBucketSlots(addr)
	return func(key string) (on, ok bool) {
		slot, err := slots.of(ctx, redisBucket(Namespace, key))
		if err != nil {
			return false, false
		}
		return inSlots(failed, slot), true
	}
}

// bucketSlots tells the Cluster slot of each bucket of the Redis store,
// asking the server at addr (CLUSTER KEYSLOT of the bucket's hash tag)
// once per bucket.
type bucketSlots struct {
	c     *redis.Client
	slots map[int]int
}

func newBucketSlots(addr string) *bucketSlots {
	return &bucketSlots{c: redis.NewClient(&redis.Options{Addr: addr}), slots: map[int]int{}}
}

// of returns the slot of bucket.
func (b *bucketSlots) of(ctx context.Context, bucket int) (int, error) {
	if slot, seen := b.slots[bucket]; seen {
		return slot, nil
	}
	n, err := b.c.ClusterKeySlot(ctx, "{"+strconv.Itoa(bucket)+"}").Result()
	if err != nil {
		return 0, err
	}
	b.slots[bucket] = int(n)
	return int(n), nil
}

// close closes the client.
func (b *bucketSlots) close() { b.c.Close() }
