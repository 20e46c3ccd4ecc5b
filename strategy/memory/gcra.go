package memory

import (
	"math"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// rateKey names a key's TAT under the rates of one window.
type rateKey struct {
	namespace string
	key       string
	window    time.Duration
}

// turn decides a request of a key under a rate at now (Unix nanoseconds)
// by window's rule, in whole microseconds as the other stores count it:
// it returns the key's TAT, the TAT after the request, and whether it is
// admitted. It moves nothing.
// A tolerance of forced admits it whatever the TAT.
func (d *data) turn(k rateKey, inc, tol time.Duration, now int64) (tat, next int64, ok bool) {
	tat, _ = d.tats.get(k, now)
	next, wait := window.ConformSpans(tat, now/1e3, inc.Microseconds(), tol.Microseconds())
	return tat, next, wait == 0
}

// forced is the tolerance of a turn admitted whatever the TAT.
const forced = time.Duration(math.MaxInt64)

// setTAT sets a key's TAT (Unix microseconds), held until it has passed.
func (d *data) setTAT(k rateKey, tat, now int64) { d.tats.set(k, tat, tat*1e3, now) }

// RateKeys returns how many keys' TATs of a namespace the data set
// holds, after dropping those that have passed, for tests of their
// expiry.
func (s *Store) RateKeys(namespace string) (n int) {
	s.lock(func(d *data, _ int64) {
		for k := range d.tats.m {
			if k.namespace == namespace {
				n++
			}
		}
	})
	return n
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher.
func (*Store) DecidesRatesInBatches() {}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
