package redis

import (
	"math"
	"strconv"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// The storage format. Changing buckets, the bucket hash or the key layout
// moves every counter, so nodes of different formats must not share a store.
const (
	// buckets is the number of hash tags a namespace's counters spread over.
	buckets = 1024

	// expiryMargin keeps a counter a little past the end of its life as a
	// previous window (start + 2*size), so that clock skew between nodes
	// does not expire it while a node still reads it.
	expiryMargin = time.Second
)

// The limits of the input and the lives of ID markers are those of every
// store of this module: strategy.MaxHitWindows, strategy.MaxIDLen (an ID
// ends its marker's key), strategy.MinBatchIDLife (a push's dedupe
// marker), strategy.MinHitIDLife and strategy.MaxHitIDLife (a synchronous
// hit's marker).

// FNV-1a 64 parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// bucketOf returns the bucket of a (namespace, key) pair: FNV-1a 64 of the
// decimal length of the namespace, ':', the namespace and the key, folded
// and taken modulo buckets. It is stable across processes and machines.
func bucketOf(namespace, key string) int {
	h := uint64(fnvOffset)
	var lb [20]byte
	for _, c := range strconv.AppendInt(lb[:0], int64(len(namespace)), 10) {
		h = (h ^ uint64(c)) * fnvPrime
	}
	h = (h ^ ':') * fnvPrime
	for i := 0; i < len(namespace); i++ {
		h = (h ^ uint64(namespace[i])) * fnvPrime
	}
	for i := 0; i < len(key); i++ {
		h = (h ^ uint64(key[i])) * fnvPrime
	}
	return int((h ^ h>>32) % buckets)
}

// layout builds keys for one key prefix. It is immutable once made, so any
// number of goroutines may use it.
type layout struct {
	// tags[b] is "<prefix>:{<b>}:", the start of every key of bucket b.
	tags [buckets]string
}

func newLayout(prefix string) *layout {
	l := new(layout)
	for b := range l.tags {
		l.tags[b] = prefix + ":{" + strconv.Itoa(b) + "}:"
	}
	return l
}

// nsPart returns "<len(namespace)>:<namespace>:", the part of a key that
// names the namespace; the client key follows it.
func nsPart(namespace string) string {
	return strconv.Itoa(len(namespace)) + ":" + namespace + ":"
}

// counterKey returns the key of one counter:
// <prefix>:{<bucket>}:<size ms>:<start ms>:<len(ns)>:<ns>:<key>, where nsp
// is nsPart(ns). buf is scratch space, returned for reuse.
func (l *layout) counterKey(buf []byte, bucket int, sizeMs, startMs int64, nsp, key string) (string, []byte) {
	buf = l.appendCounterKey(buf[:0], bucket, sizeMs, startMs, nsp, key)
	return string(buf), buf
}

// appendCounterKey appends the key of one counter (see counterKey) to buf.
func (l *layout) appendCounterKey(buf []byte, bucket int, sizeMs, startMs int64, nsp, key string) []byte {
	buf = appendWindowPart(append(buf, l.tags[bucket]...), sizeMs, startMs)
	return append(append(buf, nsp...), key...)
}

// appendWindowPart appends the part of a counter's key that names its
// window, "<size ms>:<start ms>:", which the counters of one window share.
func appendWindowPart(buf []byte, sizeMs, startMs int64) []byte {
	buf = strconv.AppendInt(buf, sizeMs, 10)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, startMs, 10)
	return append(buf, ':')
}

// appendCounterKeyOf appends the key of a counter of bucket whose window's
// part (see appendWindowPart) is win.
func (l *layout) appendCounterKeyOf(buf []byte, bucket int, win []byte, nsp, key string) []byte {
	return append(append(append(append(buf, l.tags[bucket]...), win...), nsp...), key...)
}

// dedupeKey returns the key of the marker that records that group n of a
// bucket of a batch was applied: <prefix>:{<bucket>}:push:<n>:<batch ID>.
// It shares the bucket's slot, so one script can check it and write the
// counters. A synchronous hit with an ID sets the marker of group 0 under
// that ID (see Store.dedupeKey): the one a batch of that ID holding only
// the hit's diffs would set.
func (l *layout) dedupeKey(bucket, n int, batchID string) string {
	return l.tags[bucket] + "push:" + strconv.Itoa(n) + ":" + batchID
}

// dedupeKey returns the key of the marker of group n of a batch's bucket
// k (see layout.dedupeKey). On a standalone server, where a script may
// touch any key, a batch's groups are its own, whatever their buckets:
// group n is the batch's nth run of up to 256 counters, marked in bucket
// 0, so that a batch of synchronous hits of many keys sets one marker,
// not one per key.
func (s *Store) dedupeKey(k, n int, batchID string) string {
	if !s.cluster {
		k = 0
	}
	return s.layout.dedupeKey(k, n, batchID)
}

// slotsKey returns the key of the sorted set that holds the concurrency
// slots of a (namespace, key): <prefix>:{<bucket>}:slots:<len(ns)>:<ns>:<key>,
// where nsp is nsPart(ns). It shares the bucket, and so the Cluster slot,
// of the key's counters; "slots" is no number, so it never reads as a
// counter's size, nor as "push", a dedupe marker.
func (l *layout) slotsKey(bucket int, nsp, key string) string {
	return l.tags[bucket] + "slots:" + nsp + key
}

// bansKeys returns the keys of a namespace's bans: the sorted set of the
// bans, <prefix>:{<bucket>}:bans:<len(ns)>:<ns>, and the string of their
// version, <prefix>:{<bucket>}:bansv:<len(ns)>:<ns>, in the bucket of the
// namespace's empty key, so that one script reaches both. Neither
// "bans" nor "bansv" is a number, "push" or "slots", so they never read
// as another kind of key.
func (l *layout) bansKeys(namespace string) (set, version string) {
	tag, nsp := l.tags[bucketOf(namespace, "")], nsPart(namespace)
	return tag + "bans:" + nsp, tag + "bansv:" + nsp
}

// fleetKey returns the key of the sorted set of a namespace's members
// (see strategy.Roster): <prefix>:{<bucket>}:fleet:<len(ns)>:<ns>, in the
// bucket of the namespace's empty key, as its bans. "fleet" is no number
// and no other kind's name.
func (l *layout) fleetKey(namespace string) string {
	return l.tags[bucketOf(namespace, "")] + "fleet:" + nsPart(namespace)
}

// nearKeys returns the keys of a namespace's near-limit marks (see
// strategy.NearFeed): the stream of the marks, <prefix>:{<bucket>}:near:<len(ns)>:<ns>,
// and the string of their version, <prefix>:{<bucket>}:nearv:<len(ns)>:<ns>,
// in the bucket of the namespace's empty key, as its bans, so that one
// script reaches both. Neither "near" nor "nearv" is a number or the name
// of another kind of key.
func (l *layout) nearKeys(namespace string) (feed, version string) {
	tag, nsp := l.tags[bucketOf(namespace, "")], nsPart(namespace)
	return tag + "near:" + nsp, tag + "nearv:" + nsp
}

// hitMarkerTTL returns the time to live, in milliseconds, of the marker of
// a hit whose counters' latest expiry is lastExpMs (Unix milliseconds),
// made at nowMs: as long as the counters, within [strategy.MinHitIDLife,
// strategy.MaxHitIDLife]. A caller retries a failed hit as soon as the
// store answers again, well within the bound; a retry that comes later
// still, for a hit that Redis applied although its reply was lost, would
// count it twice, which errs towards limiting.
func hitMarkerTTL(lastExpMs, nowMs int64) int64 {
	return min(max(lastExpMs-nowMs, strategy.MinHitIDLife.Milliseconds()), strategy.MaxHitIDLife.Milliseconds())
}

// windowMs checks a window (strategy.CheckWindow) and returns its size and
// start in milliseconds, as keys hold them.
func windowMs(size time.Duration, start int64) (sizeMs, startMs int64, err error) {
	if err := strategy.CheckWindow(size, start); err != nil {
		return 0, 0, err
	}
	return int64(size / time.Millisecond), start / int64(time.Millisecond), nil
}

// sizeMsOf checks a window size (strategy.CheckSize) and returns it in
// milliseconds, as keys hold it.
func sizeMsOf(size time.Duration) (int64, error) {
	if err := strategy.CheckSize(size); err != nil {
		return 0, err
	}
	return int64(size / time.Millisecond), nil
}

// expireAtMs returns when a counter of a window expires, in Unix
// milliseconds: once it can no longer be the previous window, plus a margin.
func expireAtMs(sizeMs, startMs int64) int64 {
	return startMs + 2*sizeMs + expiryMargin.Milliseconds()
}

// formatValue formats a counter increment as Redis parses it: the shortest
// decimal that reads back as the same float64.
func formatValue(v float64) string {
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// finite reports whether v can be added to a counter.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
