package redis

import (
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
// oldest go (see strategy.NearFeed). feedSource trims to it, and holds
// the number itself.
const maxNearMarks = 1 << 16

// GetCountersNear is GetCounters, and the namespace's marks made after
// version known that have not ended by now (see strategy.NearFeed). The
// marks' version is a string that GetCounters' MGETs read with the
// counters: on a standalone server that costs no command, on a Cluster at
// most one more MGET in the same round trip, and with no keys it is one
// MGET. Only when the version is not known does a second round trip read
// the marks made since (XRANGE of the feed, from the entry after known):
// all of them, at most maxNearMarks, when known is 0 or ahead of the
// store. Marks come in the order they were made; their ends are whole
// milliseconds. Errors are those of GetCounters.
func (s *Store) GetCountersNear(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, known int64) (_ []window.Count, _ []strategy.NearMark, _ int64, err error) {
	defer errs.GetCounters(&err, namespace, len(keys))
	feed, versionKey := s.layout.nearKeys(namespace)
	counts, raw, err := s.getCounters(ctx, namespace, keys, sizes, now, versionKey)
	if err != nil {
		return nil, nil, 0, err
	}
	version, err := parseNearVersion(raw)
	if err != nil {
		return nil, nil, 0, err
	}
	if version == 0 || version == known {
		return counts, nil, version, nil
	}
	marks, err := s.readMarks(ctx, feed, known, version, now)
	if err != nil {
		return nil, nil, 0, err
	}
	return counts, marks, version, nil
}

// parseNearVersion returns the version that the string of a namespace's
// marks holds, "<version> <end>" (see feedSource), or 0 for "" (none).
func parseNearVersion(raw string) (int64, error) {
	if raw == "" {
		return 0, nil
	}
	v, _, _ := strings.Cut(raw, " ")
	version, err := strconv.ParseInt(v, 10, 64)
	if err != nil || version <= 0 {
		return 0, fmt.Errorf("the version of the near-limit marks holds %q, not a version and an end", raw)
	}
	return version, nil
}

// readMarks reads the marks of a feed after version known up to version,
// leaving out those that ended by now: from the first entry when known is
// 0 or not behind version.
func (s *Store) readMarks(ctx context.Context, feed string, known, version int64, now time.Time) ([]strategy.NearMark, error) {
	start := "-"
	if known > 0 && known < version {
		start = strconv.FormatInt(known+1, 10)
	}
	// A raw XRANGE: go-redis's XRange reads an entry's fields into a map,
	// which would lose a key marked twice in one entry, and the order.
	cmd := goredis.NewSliceCmd(ctx, "xrange", feed, start, strconv.FormatInt(version, 10))
	cmd.SetFirstKeyPos(1)
	if err := s.client.Process(ctx, cmd); err != nil {
		return nil, notSent(err)
	}
	nowMs := now.UnixMilli()
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
			if until > nowMs {
				marks = append(marks, strategy.NearMark{Key: key, Until: time.UnixMilli(until)})
			}
		}
	}
	return marks, nil
}

// appendMarked appends to marked the indexes of the diffs that Cluster
// push runs replied marked (see pushScript).
func appendMarked(marked []int32, calls []scriptCall, cmds []*goredis.Cmd) []int32 {
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
	cmdArgs := make([]any, 0, 5+2*len(marks))
	cmdArgs = append(cmdArgs, nil, nil, 2, feed, version)
	for _, m := range marks {
		cmdArgs = append(cmdArgs, m.Key, m.Until.UnixMilli())
	}
	return s.runOnce(ctx, nearScript, nearSource, cmdArgs, true).Err()
}
