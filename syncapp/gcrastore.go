package syncapp

import (
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// rateStore returns the namespace's store as a deciding store of rates,
// or nil.
func (n *Namespace) rateStore() strategy.Rater {
	r, _ := n.store.(strategy.Rater)
	return r
}

// hitRateAtStore has the store decide one request under a rate; decided
// is false when the request must be decided on this node instead.
func (n *Namespace) hitRateAtStore(ctx context.Context, key string, rate Rate, cost float64, rs *RateSample) (ok, decided bool) {
	return false, false
}

// giveRateBack takes back at the store the turn a request took under a
// rate and that a limit then refused.
func (n *Namespace) giveRateBack(ctx context.Context, key string, rate Rate, cost float64, rs *RateSample) {
}

// readRateAtStore reads key's state under a rate from the store.
func (n *Namespace) readRateAtStore(ctx context.Context, key string, window time.Duration) (RateSample, bool) {
	return RateSample{}, false
}
