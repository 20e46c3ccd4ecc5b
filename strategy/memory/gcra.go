package memory

import (
	"container/heap"
	"context"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// rateData holds the rates of a data set (see strategy.Rater): one TAT
// per (namespace, key, window), in Unix microseconds as the other stores
// count it, and the records of the IDs of Rate and GiveBack. Both leave
// through their own expiry heap: a TAT once it has passed (the key then
// has its whole burst, as a key never seen does), a record after
// strategy.RateIDLife.
type rateData struct {
	tats     map[rateKey]*tatEntry
	ids      map[marker]rateRecord
	expiries expiryHeap // cell.key and cell.size name a TAT; isMarker an ID
}

// rateKey names a key's TAT under the rates of one window.
type rateKey struct {
	namespace string
	key       string
	window    time.Duration
}

// tatEntry is a key's TAT, in Unix microseconds, and when its entry in
// the expiry heap falls due: one entry per key, moved on when it falls
// due before the TAT has passed, so that a busy key holds one entry, not
// one per request.
type tatEntry struct {
	tat int64
	due int64 // Unix nanoseconds
}

// rateRecord is what an ID did: took a turn (and how far it moved the
// TAT), was refused one, or gave it back.
type rateRecord struct {
	state byte // 't', 'r' or 'g'
	inc   int64
	exp   int64 // Unix nanoseconds
}

// ratesLocked returns the data set's rates, making them on first use. The
// caller holds d.mu.
func (d *data) ratesLocked() *rateData {
	if d.rates == nil {
		d.rates = &rateData{tats: make(map[rateKey]*tatEntry), ids: make(map[marker]rateRecord)}
	}
	return d.rates
}

// Rate decides one request of key under a rate, atomically, by the
// store's clock (see strategy.Rater). Bad input is refused, before
// anything changes, with an error that wraps strategy.ErrRejected.
func (s *Store) Rate(ctx context.Context, namespace, key, id string, r strategy.RateRequest) (_ strategy.RateReply, err error) {
	defer errs.Rate(&err, namespace)
	if err := s.check(ctx); err != nil {
		return strategy.RateReply{}, err
	}
	if err := strategy.CheckRate(id, false, r); err != nil {
		return strategy.RateReply{}, err
	}
	nowNs := s.now().UnixNano()
	now := nowNs / 1e3
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	rd := d.ratesLocked()
	rd.sweep(nowNs)
	k := rateKey{namespace, key, r.Window}
	tat := rd.tat(k)
	m := marker{namespace, id}
	rec, known := rd.ids[m]
	if known && (!r.Force || rec.state != 'r') {
		return strategy.RateReply{OK: rec.state == 't', TAT: tat * 1e3, Now: now * 1e3}, nil
	}
	inc := r.Increment.Microseconds()
	next, ok := strategy.ConformMicros(tat, now, inc, r.Tolerance.Microseconds(), r.Force)
	if ok {
		rd.setTAT(k, next)
	}
	if id != "" {
		rec = rateRecord{state: 'r', exp: nowNs + int64(strategy.RateIDLife)}
		if ok {
			rec.state, rec.inc = 't', inc
		}
		rd.record(m, rec)
	}
	return strategy.RateReply{OK: ok, TAT: next * 1e3, Now: now * 1e3}, nil
}

// GiveBack takes back the turn that the Rate named id took, atomically
// (see strategy.Rater). An empty or too long id, or a bad window, is
// refused with an error that wraps strategy.ErrRejected.
func (s *Store) GiveBack(ctx context.Context, namespace, key, id string, window time.Duration) (err error) {
	defer errs.GiveBack(&err, namespace)
	if err := s.check(ctx); err != nil {
		return err
	}
	if err := strategy.CheckRate(id, true, strategy.RateRequest{Window: window}); err != nil {
		return err
	}
	nowNs := s.now().UnixNano()
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	rd := d.ratesLocked()
	rd.sweep(nowNs)
	m := marker{namespace, id}
	rec := rd.ids[m]
	if rec.state == 'g' {
		return nil
	}
	rd.record(m, rateRecord{state: 'g', exp: nowNs + int64(strategy.RateIDLife)})
	k := rateKey{namespace, key, window}
	if e := rd.tats[k]; rec.state == 't' && e != nil {
		// A TAT at or before now is as good as none: the sweep drops it.
		e.tat -= rec.inc
	}
	return nil
}

// RateKeys returns how many keys' TATs of a namespace the data set
// holds, after dropping those that have passed, for tests of their
// expiry.
func (s *Store) RateKeys(namespace string) int {
	d := s.data
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rates == nil {
		return 0
	}
	d.rates.sweep(s.now().UnixNano())
	n := 0
	for k := range d.rates.tats {
		if k.namespace == namespace {
			n++
		}
	}
	return n
}

// tat returns a key's TAT (Unix microseconds), 0 for none.
func (rd *rateData) tat(k rateKey) int64 {
	if e := rd.tats[k]; e != nil {
		return e.tat
	}
	return 0
}

// DecidesRatesInBatches marks the store as a strategy.RateBatcher.
func (*Store) DecidesRatesInBatches() {}

// setTAT sets a key's TAT (Unix microseconds), scheduling the key's
// expiry when it has none.
func (rd *rateData) setTAT(k rateKey, tat int64) {
	e := rd.tats[k]
	if e == nil {
		e = new(tatEntry)
		rd.tats[k] = e
	}
	e.tat = tat
	if e.due == 0 {
		e.due = tat * 1e3
		heap.Push(&rd.expiries, expiry{at: e.due, namespace: k.namespace, cell: cell{key: k.key, size: k.window}})
	}
}

// record sets an ID's record.
func (rd *rateData) record(m marker, rec rateRecord) {
	if _, ok := rd.ids[m]; !ok {
		heap.Push(&rd.expiries, expiry{at: rec.exp, namespace: m.namespace, id: m.id, isMarker: true})
	}
	rd.ids[m] = rec
}

// sweep drops the TATs that have passed and the records that expired at
// now (Unix nanoseconds); a TAT that has moved on is scheduled again at
// its new value.
func (rd *rateData) sweep(now int64) {
	for len(rd.expiries) > 0 && rd.expiries[0].at <= now {
		x := heap.Pop(&rd.expiries).(expiry)
		if x.isMarker {
			m := marker{x.namespace, x.id}
			if rec, ok := rd.ids[m]; ok && rec.exp <= now {
				delete(rd.ids, m)
			} else if ok {
				heap.Push(&rd.expiries, expiry{at: rec.exp, namespace: m.namespace, id: m.id, isMarker: true})
			}
			continue
		}
		k := rateKey{x.namespace, x.cell.key, x.cell.size}
		e := rd.tats[k]
		if e == nil {
			continue
		}
		if e.tat*1e3 <= now {
			delete(rd.tats, k)
			continue
		}
		e.due = e.tat * 1e3
		heap.Push(&rd.expiries, expiry{at: e.due, namespace: k.namespace, cell: cell{key: k.key, size: k.window}})
	}
}

// Interface guard
var _ strategy.RateBatcher = (*Store)(nil)
