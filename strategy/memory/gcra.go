package memory

import (
	"context"
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

// rateRecord is what an ID of Rate or GiveBack did: took a turn (and how
// far it moved the TAT), was refused one, or gave it back. Records live
// strategy.RateIDLife.
type rateRecord struct {
	state byte // 't', 'r' or 'g'
	inc   int64
}

// turn decides a request of a key under a rate at now (Unix nanoseconds)
// by window's rule, in whole microseconds as the other stores count it:
// it returns the key's TAT, the TAT after the request, and whether it is
// admitted. It moves nothing.
func (d *data) turn(k rateKey, r strategy.RateRequest, now int64) (tat, next int64, ok bool) {
	tat, _ = d.tats.get(k, now)
	tol := r.Tolerance.Microseconds()
	if r.Force {
		tol = math.MaxInt64 // admitted whatever the TAT
	}
	next, wait := window.ConformSpans(tat, now/1e3, r.Increment.Microseconds(), tol)
	return tat, next, wait == 0
}

// setTAT sets a key's TAT (Unix microseconds), held until it has passed.
func (d *data) setTAT(k rateKey, tat, now int64) { d.tats.set(k, tat, tat*1e3, now) }

// Rate decides one request of key under a rate, atomically, by the
// store's clock (see strategy.Rater). Bad input is refused, before
// anything changes, with an error that wraps strategy.ErrRejected.
func (s *Store) Rate(ctx context.Context, namespace, key, id string, r strategy.RateRequest) (reply strategy.RateReply, err error) {
	defer errs.Rate(&err, namespace)
	err = s.run(ctx, strategy.CheckRate(id, false, r), func(d *data, now int64) {
		k, m := rateKey{namespace, key, r.Window}, marker{namespace, id}
		tat, next, ok := d.turn(k, r, now)
		if rec, known := d.rateIDs.get(m, now); known && (!r.Force || rec.state != 'r') {
			reply = strategy.RateReply{OK: rec.state == 't', TAT: tat * 1e3, Now: now / 1e3 * 1e3}
			return
		}
		if ok {
			d.setTAT(k, next, now)
		}
		if id != "" {
			rec := rateRecord{state: 'r'}
			if ok {
				rec = rateRecord{state: 't', inc: r.Increment.Microseconds()}
			}
			d.rateIDs.set(m, rec, now+int64(strategy.RateIDLife), now)
		}
		reply = strategy.RateReply{OK: ok, TAT: next * 1e3, Now: now / 1e3 * 1e3}
	})
	return reply, err
}

// GiveBack takes back the turn that the Rate named id took, atomically
// (see strategy.Rater). An empty or too long id, or a bad window, is
// refused with an error that wraps strategy.ErrRejected.
func (s *Store) GiveBack(ctx context.Context, namespace, key, id string, window time.Duration) (err error) {
	defer errs.GiveBack(&err, namespace)
	return s.run(ctx, strategy.CheckRate(id, true, strategy.RateRequest{Window: window}), func(d *data, now int64) {
		m := marker{namespace, id}
		rec, _ := d.rateIDs.get(m, now)
		if rec.state == 'g' {
			return
		}
		d.rateIDs.set(m, rateRecord{state: 'g'}, now+int64(strategy.RateIDLife), now)
		k := rateKey{namespace, key, window}
		if tat, ok := d.tats.get(k, now); ok && rec.state == 't' {
			d.setTAT(k, tat-rec.inc, now) // one at or before now is as good as none
		}
	})
}

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
