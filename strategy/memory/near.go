package memory

import (
	"context"
	"slices"
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

// nearMark is one mark of a namespace's feed: its key, its end in Unix
// nanoseconds, and the version of the push that made it. A feed holds
// its marks oldest first, so its version is its newest mark's.
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
	version := nearVersions.Add(1)
	feed := d.feedOf(namespace, now)
	for _, m := range marks {
		feed = append(feed, nearMark{m.Key, m.Until.UnixNano(), version})
	}
	if over := len(feed) - maxNearMarks; over > 0 {
		feed = append(feed[:0], feed[over:]...)
	}
	d.near[namespace] = feed
}

// feedOf returns a namespace's feed without the marks that ended by now:
// a feed whose marks all ended is dropped, so that namespaces come and go
// freely. The caller holds d.mu.
func (d *data) feedOf(namespace string, now int64) []nearMark {
	feed := slices.DeleteFunc(d.near[namespace], func(m nearMark) bool { return m.until <= now })
	if d.near[namespace] = feed; len(feed) == 0 {
		delete(d.near, namespace)
	}
	return feed
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
		feed := d.feedOf(namespace, clock)
		if len(feed) == 0 {
			return
		}
		if version = feed[len(feed)-1].after; version == known {
			return
		}
		if known > version {
			known = 0 // the reader is ahead: it reads every mark
		}
		for _, m := range feed {
			if m.after > known && m.until > now.UnixNano() {
				marks = append(marks, strategy.NearMark{Key: m.key, Until: time.Unix(0, m.until)})
			}
		}
	})
	return counts, marks, version, nil
}
