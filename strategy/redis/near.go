package redis

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// maxNearMarks is the most marks a namespace's feed holds: past it, the
// oldest go (see strategy.NearFeed). feedSource trims to it.
const maxNearMarks = 1 << 16

// GetCountersNear is GetCounters, and the namespace's marks made after
// version known that have not ended by now (see strategy.NearFeed). The
// marks' version is a string that GetCounters' MGETs read with the
// counters: on a standalone server that costs no command, on a Cluster at
// most one more MGET in the same round trip, and with no keys it is one
// MGET. The string holds the newest marks too (see feedSource), so a
// reader that is up to date, or behind by no more than those, reads its
// new marks there; only one further behind reads the older marks with a
// second round trip (XRANGE of the feed, from the entry after known):
// all of them, at most maxNearMarks, when known is 0 or ahead of the
// store. Marks come in the order they were made; their ends are whole
// milliseconds. The marks of mark are made after the read, as MarkNear
// makes them, in a round trip of their own: on Redis they cost the same
// commands either way. Errors are those of GetCounters.
func (s *Store) GetCountersNear(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, known int64, mark []strategy.NearMark) (_ []window.Count, _ []strategy.NearMark, _ int64, err error) {
	defer errs.GetCounters(&err, namespace, len(keys))
	counts, marks, version, err := s.readNear(ctx, namespace, keys, sizes, now, known)
	parts, partial := strategy.FailedParts(err)
	if err != nil && !partial {
		return nil, nil, 0, err
	}
	if markErr := s.runNear(ctx, namespace, mark); markErr != nil {
		markErr = fmt.Errorf("marking %d keys near their limits: %w", len(mark), markErr)
		if !s.cluster {
			return nil, nil, 0, markErr
		}
		return counts, marks, version, s.partial(cmp.Or(err, markErr), append(parts, bucketOf(namespace, ""))...)
	}
	return counts, marks, version, err
}

// readNear is GetCountersNear's read.
func (s *Store) readNear(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, known int64) ([]window.Count, []strategy.NearMark, int64, error) {
	feed, versionKey := s.layout.nearKeys(namespace)
	counts, raw, partErr := s.getCounters(ctx, namespace, keys, sizes, now, versionKey)
	// On a Cluster, the counts of the masters that answered come back
	// with the buckets of those that did not; the marks only with the
	// feed's bucket.
	parts, partial := strategy.FailedParts(partErr)
	feedBucket := bucketOf(namespace, "")
	switch {
	case partErr != nil && !partial:
		return nil, nil, 0, partErr
	case slices.Contains(parts, feedBucket):
		return counts, nil, known, partErr
	}
	f, err := parseFeed(raw)
	if err != nil {
		return nil, nil, 0, err
	}
	if f.version == 0 || f.version == known {
		return counts, nil, f.version, partErr
	}
	nowMs := now.UnixMilli()
	// The string holds the marks after version f.version - len(f.held).
	from := f.version - int64(len(f.held))
	if known > 0 && known >= from && known < f.version {
		return counts, current(f.held[known-from:], nowMs), f.version, partErr
	}
	var marks []strategy.NearMark
	if f.streamed > 0 && (known < f.streamed || known > f.version) {
		if marks, err = s.readMarks(ctx, feed, known, f.streamed); err != nil {
			if !s.cluster {
				return nil, nil, 0, err
			}
			return counts, nil, known, s.partial(cmp.Or(partErr, err), append(parts, feedBucket)...)
		}
	}
	return counts, current(append(marks, f.held...), nowMs), f.version, partErr
}

// feedString is what the string of a namespace's marks holds (see
// feedSource).
type feedString struct {
	version, streamed int64
	held              []strategy.NearMark // the marks after streamed, oldest first
}

// parseFeed reads the string of a namespace's marks, "" for none.
func parseFeed(raw string) (feedString, error) {
	var f feedString
	if raw == "" {
		return f, nil
	}
	bad := func() (feedString, error) {
		return feedString{}, fmt.Errorf("the version of the near-limit marks holds %q, not a version, an end and marks", raw)
	}
	fields := strings.SplitN(raw, " ", 4)
	if len(fields) < 3 {
		return bad()
	}
	var err1, err2 error
	f.version, err1 = strconv.ParseInt(fields[0], 10, 64)
	f.streamed, err2 = strconv.ParseInt(fields[2], 10, 64)
	if err1 != nil || err2 != nil || f.version <= 0 || f.streamed < 0 || f.streamed > f.version {
		return bad()
	}
	if len(fields) < 4 {
		return f, nil
	}
	// Each mark: "<end> <length> <key>", a space between marks.
	rest := fields[3]
	for {
		end, after, ok1 := strings.Cut(rest, " ")
		length, key, ok2 := strings.Cut(after, " ")
		until, err1 := strconv.ParseInt(end, 10, 64)
		n, err2 := strconv.Atoi(length)
		if !ok1 || !ok2 || err1 != nil || err2 != nil || n < 0 || n > len(key) {
			return bad()
		}
		f.held = append(f.held, strategy.NearMark{Key: key[:n], Until: time.UnixMilli(until)})
		rest = key[n:]
		if rest == "" {
			break
		}
		if rest[0] != ' ' {
			return bad()
		}
		rest = rest[1:]
	}
	if int64(len(f.held)) > f.version-f.streamed && f.streamed > 0 {
		return bad()
	}
	return f, nil
}

// current returns the marks that have not ended by nowMs.
func current(marks []strategy.NearMark, nowMs int64) []strategy.NearMark {
	var out []strategy.NearMark
	for _, m := range marks {
		if m.Until.UnixMilli() > nowMs {
			out = append(out, m)
		}
	}
	return out
}

// readMarks reads the marks of a feed's stream after version known up to
// version upto: from the first entry when known is 0 or not behind upto.
func (s *Store) readMarks(ctx context.Context, feed string, known, upto int64) ([]strategy.NearMark, error) {
	start := "-"
	if known > 0 && known < upto {
		start = strconv.FormatInt(known+1, 10)
	}
	// A raw XRANGE: go-redis's XRange reads an entry's fields into a map,
	// which would lose a key marked twice in one entry, and the order.
	cmd := goredis.NewSliceCmd(ctx, "xrange", feed, start, strconv.FormatInt(upto, 10))
	cmd.SetFirstKeyPos(1)
	if err := s.client.Process(ctx, cmd); err != nil {
		return nil, notSent(err)
	}
	var marks []strategy.NearMark
	for _, e := range cmd.Val() {
		entry, ok := e.([]any)
		if !ok || len(entry) != 2 {
			return nil, fmt.Errorf("the near-limit feed holds %v, not an entry", e)
		}
		fields, ok := entry[1].([]any)
		if !ok || len(fields)%2 != 0 {
			return nil, fmt.Errorf("the near-limit feed's entry %v holds %v, not pairs of a key and an end", entry[0], entry[1])
		}
		for j := 0; j < len(fields); j += 2 {
			key, ok := fields[j].(string)
			end, _ := fields[j+1].(string)
			until, err := strconv.ParseInt(end, 10, 64)
			if !ok || err != nil {
				return nil, fmt.Errorf("the near-limit feed's entry %v holds %v %v, not a key and an end", entry[0], fields[j], fields[j+1])
			}
			marks = append(marks, strategy.NearMark{Key: key, Until: time.UnixMilli(until)})
		}
	}
	return marks, nil
}

// appendMarked appends to marked the indexes of the diffs that Cluster
// push runs replied marked (see pushScript).
func appendMarked(marked []int32, calls []scriptRun, cmds []*goredis.Cmd) []int32 {
	for j, cmd := range cmds {
		reply, ok := cmd.Val().([]any)
		if !ok {
			continue
		}
		for _, v := range reply {
			if pos, ok := v.(int64); ok && pos >= 0 && int(pos) < len(calls[j].diffs) {
				marked = append(marked, calls[j].diffs[pos])
			}
		}
	}
	return marked
}

// MarkNear makes marks (see strategy.NearFeed): one run of nearScript,
// on the node of the namespace's feed.
func (s *Store) MarkNear(ctx context.Context, namespace string, marks []strategy.NearMark) (err error) {
	defer errs.MarkNear(&err, namespace, len(marks))
	return s.runNear(ctx, namespace, marks)
}

// writeMarks writes to a batch's namespace's feed the marks of its diffs
// that Cluster runs marked, in the order of the diffs, if there are any.
func (s *Store) writeMarks(ctx context.Context, b strategy.Batch, marked []int32) error {
	if len(marked) == 0 {
		return nil
	}
	slices.Sort(marked)
	marks := make([]strategy.NearMark, len(marked))
	for j, i := range marked {
		d := &b.Diffs[i]
		marks[j] = strategy.NearMark{Key: d.Key, Until: strategy.NearUntil(d)}
	}
	if err := s.runNear(ctx, b.Namespace, marks); err != nil {
		return fmt.Errorf("marking %d keys near their limits: %w", len(marked), err)
	}
	return nil
}

// runNear appends marks to a namespace's feed with one run of nearScript,
// if there are any. Marks written twice are harmless (a reader may read a
// key twice), so it is sent once more after a connection failure if a
// promoted replica serves the feed's slot by then.
func (s *Store) runNear(ctx context.Context, namespace string, marks []strategy.NearMark) error {
	if len(marks) == 0 {
		return nil
	}
	feed, version := s.layout.nearKeys(namespace)
	args := make([]any, 0, 2*len(marks))
	for _, m := range marks {
		args = append(args, m.Key, m.Until.UnixMilli())
	}
	return s.runScript(ctx, newRun(nearScript, []string{feed, version}, args...), resendOnCluster).Err()
}
