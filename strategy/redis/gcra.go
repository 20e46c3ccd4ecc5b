package redis

import (
	"strconv"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// rateKey returns the key of a key's TAT under the rates of one window:
// <prefix>:{<bucket>}:rate:<window ms>:<len(ns)>:<ns>:<key>, in the
// bucket, and so the Cluster slot, of the key's counters. "rate" is no
// number, "push", "slots" or "bans", so it never reads as another kind
// of key.
func (l *layout) rateKey(bucket int, windowMs int64, nsp, key string) string {
	return l.tags[bucket] + "rate:" + strconv.FormatInt(windowMs, 10) + ":" + nsp + key
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher: its
// batch script decides hits' rates (see HitBatch), and its push script
// takes a Batch's rates.
func (*Store) DecidesRatesInBatches() {}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
