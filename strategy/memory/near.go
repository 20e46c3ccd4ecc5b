package memory

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// maxNearMarks is the most marks a namespace's feed holds: past it, the
// oldest go (see strategy.NearFeed).
const maxNearMarks = 1 << 16

// nearVersions numbers the states of every data set's feeds, so that a
// version is never reused, even by a feed whose marks all ended.
var nearVersions atomic.Int64

// nearFeed is one namespace's marks, oldest first, and the version of the
// newest.
type nearFeed struct {
	marks   []nearMark
	version int64
}

// nearMark is one mark of a feed: its key, its end in Unix nanoseconds,
// and the version of the push that made it.
type nearMark struct {
	key          string
	until, after int64
}

// markNear records that a push of a namespace marked keys (see
// strategy.NearFeed), at now (Unix nanoseconds): one new version for
// them all. The caller holds d.mu.
func (d *data) markNear(namespace string, marks []strategy.NearMark, now int64) {
	if len(marks) == 0 {
		return
	}
	f := d.feedOf(namespace, now)
	if f == nil {
		f = &nearFeed{}
		d.near[namespace] = f
	}
	f.version = nearVersions.Add(1)
	for _, m := range marks {
		f.marks = append(f.marks, nearMark{m.Key, m.Until.UnixNano(), f.version})
	}
	if over := len(f.marks) - maxNearMarks; over > 0 {
		f.marks = append(f.marks[:0], f.marks[over:]...)
	}
}

// feedOf returns a namespace's feed without the marks that ended by now,
// or nil when it holds none: a feed whose marks all ended is dropped, so
// that namespaces come and go freely. The caller holds d.mu.
func (d *data) feedOf(namespace string, now int64) *nearFeed {
	f := d.near[namespace]
	if f == nil {
		return nil
	}
	live := f.marks[:0]
	for _, m := range f.marks {
		if m.until > now {
			live = append(live, m)
		}
	}
	clear(f.marks[len(live):])
	f.marks = live
	if len(live) == 0 {
		delete(d.near, namespace)
		return nil
	}
	return f
}

// MarkNear makes marks (see strategy.NearFeed).
func (s *Store) MarkNear(ctx context.Context, namespace string, marks []strategy.NearMark) (err error) {
	defer errs.MarkNear(&err, namespace, len(marks))
	return s.run(ctx, nil, func(d *data, now int64) {
		d.markNear(namespace, marks, now)
	})
}

// GetCountersNear is GetCounters, and the namespace's marks made after
// version known that have not ended by now, then the marks of mark made
// (see strategy.NearFeed).
func (s *Store) GetCountersNear(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, known int64, mark []strategy.NearMark) (_ []window.Count, marks []strategy.NearMark, version int64, _ error) {
	counts, err := s.GetCounters(ctx, namespace, keys, sizes, now)
	if err != nil {
		return nil, nil, 0, err
	}
	s.lock(func(d *data, clock int64) {
		defer d.markNear(namespace, mark, clock) // after the read
		f := d.feedOf(namespace, clock)
		if f == nil {
			return
		}
		if version = f.version; version == known {
			return
		}
		if known > version {
			known = 0 // the reader is ahead: it reads every mark
		}
		for _, m := range f.marks {
			if m.after > known && m.until > now.UnixNano() {
				marks = append(marks, strategy.NearMark{Key: m.key, Until: time.Unix(0, m.until)})
			}
		}
	})
	return counts, marks, version, nil
}
