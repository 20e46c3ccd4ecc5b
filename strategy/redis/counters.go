package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// ErrInvalidWindow is wrapped by the errors of operations given a window
// the store cannot hold: a size that is not a positive whole number of
// milliseconds, or a start that is not a multiple of the size. Such a
// request can never succeed: ErrInvalidWindow is strategy.ErrInvalidWindow,
// which wraps strategy.ErrRejected, so callers drop it rather than retry.
var ErrInvalidWindow = strategy.ErrInvalidWindow

// Bounds on what one round trip carries, so that a huge batch or fetch
// neither holds a large reply in memory nor blocks Redis for long.
const (
	// maxScriptKeys is the most counters one run of pushScript writes.
	maxScriptKeys = 256
	// maxPipelineDiffs is the most diffs one push pipeline carries, in at
	// most as many script runs: four full runs, so that a batch of up to
	// 1,024 diffs pushed to a standalone server is one round trip.
	maxPipelineDiffs = 4 * maxScriptKeys
	// maxMGetKeys is the most keys one MGET reads.
	maxMGetKeys = 512
	// maxPipelineReads is the most keys one fetch pipeline reads.
	maxPipelineReads = 4096
)

// PushDiffs adds the diffs of a batch to their counters, at most once per
// batch ID: see the package documentation. It sends one script run per 256
// counters on a standalone server, and per bucket touched on a Cluster,
// pipelined, in one round trip for up to 1,024 diffs. An error wraps
// go-redis's; the batch may then have been applied in part, and pushing it
// again with the same ID applies only what is missing. It never wraps
// strategy.ErrNotSent: go-redis resends a pipeline after a network error,
// so a push that ends failing to dial may have been applied by an earlier
// attempt, and only its ID keeps it from counting twice; only a push made
// after Close, which sends nothing, wraps it.
//
// A batch with a Near marks the keys whose counts its diffs bring near
// their limits (see strategy.NearFeed): a run that holds a diff that may
// mark carries each counter's threshold and mark's end, and marks from
// the new counts it writes anyway. On a standalone server the run writes
// its marks to the namespace's feed itself; on a Cluster, where the feed
// is in another slot, the runs reply with their marks and PushDiffs
// writes them all with one more script run, one more round trip, only
// when there are any. A Near that is not 0 or a finite share above 0 is
// refused, before anything is sent, with an error that wraps
// strategy.ErrRejected.
func (s *Store) PushDiffs(ctx context.Context, b strategy.Batch) (err error) {
	defer errs.PushDiffs(&err, b)
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := strategy.CheckNear(b.Near); err != nil {
		return err
	}
	runs, err := s.planPush(b, s.now().UnixNano())
	if err != nil {
		return err
	}
	var (
		marked []int32      // on a Cluster, the diffs that the runs replied marked
		parts  partFailures // on a Cluster, the other masters' runs go on
	)
	// Send the runs in pipelines of bounded size, one after the other.
	for len(runs) > 0 {
		n, diffs := 1, runs[0].counters
		for n < len(runs) && diffs+runs[n].counters <= maxPipelineDiffs {
			n, diffs = n+1, diffs+runs[n].counters
		}
		cmds, err := s.runPipeline(ctx, runs[:n], &parts)
		if s.cluster && b.Near > 0 {
			marked = appendMarked(marked, runs[:n], cmds)
		}
		if err != nil {
			return err
		}
		runs = runs[n:]
	}
	// The marks of the runs that were applied are written all the same:
	// a retry of the batch marks nothing again.
	if err := s.writeMarks(ctx, b, marked); err != nil {
		parts.add(err, bucketOf(b.Namespace, ""))
	}
	return s.partial(parts.first, parts.buckets...)
}

// compareDiffs orders diffs by everything they hold, so that diffs sorted
// with it come out in the same order whatever order they came in.
func compareDiffs(a, b *window.Diff) int {
	return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Size, b.Size),
		cmp.Compare(a.Start, b.Start), cmp.Compare(a.Value, b.Value))
}

// planPush returns the script runs that push a batch at now (Unix
// nanoseconds). On a Cluster, a run holds the diffs of one bucket (one
// slot), and a bucket with more than maxScriptKeys diffs takes several. On
// a standalone server, where one script may touch any key, the diffs,
// sorted by bucket, are cut into runs of maxScriptKeys whatever their
// buckets: one dedupe marker, one MGET and one script run cover up to 256
// counters. Either way the runs, and so what each dedupe marker covers,
// depend only on the set of diffs, not on their order, so that a retry is
// split the same way as the first attempt.
func (s *Store) planPush(b strategy.Batch, now int64) ([]scriptRun, error) {
	if b.ID == "" {
		return nil, errors.New("the batch has no ID")
	}
	// A bad window fails the whole batch before anything is sent, as no
	// retry could ever store it.
	if err := strategy.CheckRateDiffs(b.Rates); err != nil {
		return nil, err
	}
	for i := range b.Diffs {
		if _, _, err := windowMs(b.Diffs[i].Size, b.Diffs[i].Start); err != nil {
			return nil, err
		}
	}
	// Item i is diff i, or rate i-nd past the nd diffs, sorted by bucket,
	// leaving out the diffs that add nothing.
	nd := len(b.Diffs)
	p := &pushPlan{s: s, b: &b, now: now, nowMs: now / int64(time.Millisecond), nsp: nsPart(b.Namespace)}
	var order []int32
	var starts *[buckets + 1]int32
	p.bucket, order, starts = sortByBucket(nd+len(b.Rates), func(i int) int {
		if i >= nd {
			return bucketOf(b.Namespace, b.Rates[i-nd].Key)
		}
		if d := &b.Diffs[i]; d.Value != 0 && finite(d.Value) {
			return bucketOf(b.Namespace, d.Key)
		}
		return -1
	})
	// Put in a fixed order every bucket whose diffs a cut between runs
	// splits: on a Cluster, a bucket of more than maxScriptKeys diffs; on
	// a standalone server, one that straddles a multiple of maxScriptKeys
	// in the sequence. The order of the others does not change what any
	// run holds.
	for k := range buckets {
		lo, hi := int(starts[k]), int(starts[k+1])
		split := hi-lo > maxScriptKeys
		if !s.cluster {
			split = hi-lo > 1 && lo/maxScriptKeys != (hi-1)/maxScriptKeys
		}
		if split {
			slices.SortFunc(order[lo:hi], p.compare)
		}
	}
	if s.cluster {
		for k := range buckets {
			p.addGroup(order[starts[k]:starts[k+1]], k)
		}
		return p.runs, nil
	}
	// Run n's marker is the batch's group n (see Store.dedupeKey): a batch
	// of d diffs runs in ceil(d/256) groups, which HitBatch relies on, and
	// a batch of one key's diffs is group 0, marked as a hit of its ID
	// marks it (see Hit).
	if b.Near > 0 {
		p.feed, p.version = s.layout.nearKeys(b.Namespace)
	}
	p.addGroup(order, 0)
	if b.Near > 0 {
		// Runs write their marks one after the other: send last the run of
		// the batch's last diff that may mark, so that its mark is the
		// newest, as the memory store's is. Which diffs a run holds, and so
		// its marker, does not change.
		slices.SortStableFunc(p.runs, func(x, y scriptRun) int {
			return cmp.Compare(lastDiff(x.diffs), lastDiff(y.diffs))
		})
	}
	return p.runs, nil
}

// sortByBucket sorts items 0 to n-1 by their buckets, bucketOf(i), -1
// leaving item i out, with a counting sort. It returns each item's
// bucket, the items in order, and where each bucket's start among them:
// bucket k's are order[starts[k]:starts[k+1]].
func sortByBucket(n int, bucketOf func(i int) int) (bucket []int16, order []int32, starts *[buckets + 1]int32) {
	bucket, starts = make([]int16, n), new([buckets + 1]int32)
	for i := range bucket {
		k := bucketOf(i)
		bucket[i] = int16(k)
		starts[k+1]++ // an item left out counts in starts[0], which stays 0
	}
	starts[0] = 0
	for k := 1; k <= buckets; k++ {
		starts[k] += starts[k-1]
	}
	order = make([]int32, starts[buckets])
	next := *starts
	for i, k := range bucket {
		if k >= 0 {
			order[next[k]] = int32(i)
			next[k]++
		}
	}
	return bucket, order, starts
}

// pushPlan is planPush's work: the batch, its items' buckets and the runs
// made so far.
type pushPlan struct {
	s          *Store
	b          *strategy.Batch
	now, nowMs int64
	nsp        string
	// feed and version are the near keys that a standalone run writes.
	feed, version string
	bucket        []int16
	buf           []byte
	runs          []scriptRun
	// Diffs of one sync mostly share their value, their window and their
	// marks: their boxed arguments are reused, not allocated per diff.
	value, at  lastArg[float64]
	exp, until lastArg[int64]
}

// lastArg is the last value made an argument, and the argument, to reuse
// while the value repeats.
type lastArg[T comparable] struct {
	v   T
	arg any
}

// of returns v as an argument, made by mk if it is not the last value.
func (l *lastArg[T]) of(v T, mk func(T) any) any {
	if l.arg == nil || v != l.v {
		l.v, l.arg = v, mk(v)
	}
	return l.arg
}

func valueArg(v float64) any { return formatValue(v) }
func intArg(v int64) any     { return v }

// compare orders the batch's items by everything they hold, diffs before
// rates, so that items sorted with it come out in the same order
// whatever order they came in.
func (p *pushPlan) compare(i, j int32) int {
	nd := int32(len(p.b.Diffs))
	switch {
	case i < nd && j < nd:
		return compareDiffs(&p.b.Diffs[i], &p.b.Diffs[j])
	case i >= nd && j >= nd:
		x, y := &p.b.Rates[i-nd], &p.b.Rates[j-nd]
		return cmp.Or(cmp.Compare(x.Key, y.Key), cmp.Compare(x.Window, y.Window), cmp.Compare(x.Increment, y.Increment))
	}
	return cmp.Compare(i, j)
}

// addGroup adds the runs of a group of items, whose dedupe markers are
// those of groups 0, 1... of bucket k, maxScriptKeys items each.
func (p *pushPlan) addGroup(group []int32, k int) {
	for n := 0; len(group) > 0; n++ {
		part := group[:min(len(group), maxScriptKeys)]
		group = group[len(part):]
		p.add(part, k, n)
	}
}

// add adds the run of the items of part, whose dedupe marker is that of
// group n of bucket k, leaving out the diffs of windows that have ended
// (which no node reads any more) and the run itself if none is left.
func (p *pushPlan) add(part []int32, k, n int) {
	b, nd := p.b, len(p.b.Diffs)
	keys, args := make([]string, 1, len(part)+1), make([]any, 1, 2*len(part)+1)
	var (
		last  int64 // the latest expiry of the run's counters
		near  []any // each counter's threshold and mark's end (see pushScript)
		diffs []int32
	)
	// The thresholds are sent only when a diff of the run may mark.
	if b.Near > 0 && slices.ContainsFunc(part, func(i int32) bool { return int(i) < nd && mayMark(b.Near, &b.Diffs[i], p.now) }) {
		near, diffs = append(make([]any, 0, 2*len(part)+1), len(p.nsp)), make([]int32, 0, len(part))
		if !p.s.cluster {
			// The run writes its marks in the order of its counters: that
			// of the diffs (rates last), as the memory store's.
			slices.Sort(part)
		}
	}
	for _, i := range part {
		if int(i) >= nd { // a rate's turn: "r" and its increment, no expiry
			r := &b.Rates[int(i)-nd]
			keys = append(keys, p.s.layout.rateKey(int(p.bucket[i]), r.Window.Milliseconds(), p.nsp, r.Key))
			args = append(args, "r"+strconv.FormatInt(r.Increment.Microseconds(), 10), "")
			if near != nil {
				near, diffs = append(near, "0", "0"), append(diffs, -1)
			}
			continue
		}
		d := &b.Diffs[i]
		if d.Start+2*int64(d.Size) <= p.now {
			continue
		}
		if near != nil {
			at, until := any("0"), any("0")
			if mayMark(b.Near, d, p.now) {
				at, until = p.at.of(strategy.NearAt(b.Near, d), valueArg), p.until.of(strategy.NearUntil(d).UnixMilli(), intArg)
			}
			near, diffs = append(near, at, until), append(diffs, i)
		}
		sizeMs, startMs := int64(d.Size/time.Millisecond), d.Start/int64(time.Millisecond)
		var key string
		key, p.buf = p.s.layout.counterKey(p.buf, int(p.bucket[i]), sizeMs, startMs, p.nsp, d.Key)
		exp := expireAtMs(sizeMs, startMs)
		last = max(last, exp)
		keys = append(keys, key)
		args = append(args, p.value.of(d.Value, valueArg), p.exp.of(exp, intArg))
	}
	if len(keys) == 1 {
		return
	}
	counters := len(keys) - 1
	keys[0] = p.s.dedupeKey(k, n, b.ID)
	args[0] = max(last-p.nowMs, strategy.MinBatchIDLife.Milliseconds())
	if near != nil {
		args = append(args, near...)
		if p.feed != "" {
			keys = append(keys, p.feed, p.version)
		}
	}
	run := newRun(pushScript, keys, args...)
	run.bucket, run.counters, run.diffs = k, counters, diffs
	p.runs = append(p.runs, run)
}

// mayMark reports whether a diff pushed at now (Unix nanoseconds) in a
// batch whose Near is near may mark its key (see strategy.NearFeed): it
// adds to a window that has not ended, and has a threshold.
func mayMark(near float64, d *window.Diff, now int64) bool {
	return d.Value > 0 && finite(d.Value) && d.Start+2*int64(d.Size) > now && strategy.NearAt(near, d) > 0
}

// lastDiff returns the greatest of a run's diff indexes (see
// scriptRun.diffs), or -1 for a run that marks nothing.
func lastDiff(diffs []int32) int32 {
	if len(diffs) == 0 {
		return -1
	}
	return slices.Max(diffs)
}

// GetCounters returns the counts of the current and previous windows of
// every size of every key, as the store holds them at now. Counters the
// store does not hold are omitted, so that a store that lost its data (a
// restart) does not erase what the node knows. It reads with MGETs of up
// to 512 counters, pipelined: one round trip for up to 4,096 counters. On
// a standalone server an MGET reads keys of any buckets; on a Cluster it
// reads one bucket (one slot), so there it takes one MGET per bucket
// touched. An error
// wraps strategy.ErrNotSent when its last attempt could not be sent (see
// Hit); a read changes nothing, so an earlier attempt or pipeline that
// reached Redis does no harm.
func (s *Store) GetCounters(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time) (_ []window.Count, err error) {
	defer errs.GetCounters(&err, namespace, len(keys))
	if len(keys) == 0 || len(sizes) == 0 {
		return nil, nil
	}
	counts, _, err := s.getCounters(ctx, namespace, keys, sizes, now, "")
	return counts, err
}

// getCounters is GetCounters, and with a version key, the string it holds
// ("" when it does not exist), read by the MGET of the key's bucket, or
// by an MGET of its own when no key shares that bucket: so on a
// standalone server, where an MGET reads any buckets, at no cost of
// commands, and on a Cluster at the cost of at most one more MGET in the
// same round trip.
func (s *Store) getCounters(ctx context.Context, namespace string, keys []string, sizes []time.Duration, now time.Time, versionKey string) (_ []window.Count, version string, err error) {
	type win struct{ sizeMs, cur, prev int64 }
	wins := make([]win, len(sizes))
	for j, size := range sizes {
		sizeMs, err := sizeMsOf(size)
		if err != nil {
			return nil, "", err
		}
		cur := window.Start(now.UnixNano(), size)
		wins[j] = win{sizeMs, cur, cur - int64(size)}
	}

	// Sort the keys by bucket: one bucket is one slot, so one MGET.
	_, order, starts := sortByBucket(len(keys), func(i int) int { return bucketOf(namespace, keys[i]) })
	r := &countReader{s: s, keys: keys, sizes: sizes, pipe: s.client.Pipeline()}
	r.ctx, r.failed = s.watch(ctx)
	versionBucket := -1
	if versionKey != "" {
		versionBucket = bucketOf(namespace, "")
	}
	nsp := nsPart(namespace)
	var buf []byte
	for k := range buckets {
		if k == versionBucket {
			if err := r.read(k, versionKey, windowRef{key: -1}); err != nil {
				return nil, "", err
			}
		}
		for _, i := range order[starts[k]:starts[k+1]] {
			for j, w := range wins {
				for _, start := range [2]int64{w.cur, w.prev} {
					var key string
					key, buf = s.layout.counterKey(buf, k, w.sizeMs, start/int64(time.Millisecond), nsp, keys[i])
					if err := r.read(k, key, windowRef{key: i, size: int32(j), start: start}); err != nil {
						return nil, "", err
					}
				}
			}
		}
		// A Cluster's MGET reads one slot: end it with the bucket. A
		// standalone server's may read any keys, so it fills up to
		// maxMGetKeys across buckets.
		if s.cluster {
			if err := r.endMGet(); err != nil {
				return nil, "", err
			}
		}
	}
	if err := r.endMGet(); err != nil {
		return nil, "", err
	}
	if err := r.flush(); err != nil {
		return nil, "", err
	}
	return r.counts, r.version, s.partial(r.parts.first, r.parts.buckets...)
}

// countReader is getCounters' pipeline of MGETs and what they read.
type countReader struct {
	s           *Store
	ctx         context.Context
	failed      *failedNodes
	keys        []string
	sizes       []time.Duration
	pipe        goredis.Pipeliner
	mgets       []*goredis.SliceCmd
	mgetBuckets []int       // the bucket of each MGET, on a Cluster
	refs        []windowRef // one per key read, in order
	batch       []string    // the keys of the MGET being built
	bucket      int         // the bucket of the MGET being built
	reads       int         // keys read by the pipeline
	counts      []window.Count
	version     string
	// On a Cluster, the failures of the MGETs that failed: the others'
	// counts are returned all the same (strategy.Parted).
	parts partFailures
}

// read adds key, of bucket k, to the MGET being built.
func (r *countReader) read(k int, key string, ref windowRef) error {
	r.bucket = k
	r.batch = append(r.batch, key)
	r.refs = append(r.refs, ref)
	if len(r.batch) == maxMGetKeys {
		return r.endMGet()
	}
	return nil
}

// endMGet adds the MGET being built to the pipeline, and sends the
// pipeline once it reads maxPipelineReads keys.
func (r *countReader) endMGet() error {
	if len(r.batch) == 0 {
		return nil
	}
	r.mgets = append(r.mgets, r.pipe.MGet(r.ctx, r.batch...))
	r.mgetBuckets = append(r.mgetBuckets, r.bucket)
	r.reads += len(r.batch)
	r.batch = nil // the command keeps the slice
	if r.reads >= maxPipelineReads {
		return r.flush()
	}
	return nil
}

// flush sends the pipeline and reads its replies.
func (r *countReader) flush() error {
	if len(r.mgets) == 0 {
		return nil
	}
	if _, err := r.pipe.Exec(r.ctx); err != nil {
		cmds := make([]goredis.Cmder, len(r.mgets))
		for i, cmd := range r.mgets {
			cmds[i] = cmd
		}
		err := r.s.sendAgain(r.ctx, r.failed, cmds, func(i int) goredis.Cmder {
			r.mgets[i] = goredis.NewSliceCmd(r.ctx, r.mgets[i].Args()...)
			return r.mgets[i]
		})
		if err != nil && !r.s.cluster {
			return notSent(err)
		}
	}
	at := 0
	for m, cmd := range r.mgets {
		if err := cmd.Err(); err != nil {
			r.parts.add(notSent(err), r.mgetBuckets[m])
			at += len(cmd.Args()) - 1
			continue
		}
		for _, v := range cmd.Val() {
			ref := r.refs[at]
			at++
			str, ok := v.(string)
			switch {
			case !ok: // missing
			case ref.key < 0:
				r.version = str
			default:
				f, err := strconv.ParseFloat(str, 64)
				if err != nil {
					return fmt.Errorf("a counter holds %q, not a number", str)
				}
				r.counts = append(r.counts, window.Count{Key: r.keys[ref.key], Size: r.sizes[ref.size], Start: ref.start, Value: f})
			}
		}
	}
	r.mgets, r.mgetBuckets, r.refs, r.reads = r.mgets[:0], r.mgetBuckets[:0], r.refs[:0], 0
	return nil
}

// windowRef says which window of which key an MGET reply is about: key is
// -1 for the version key of getCounters.
type windowRef struct {
	key   int32 // index in keys
	size  int32 // index in sizes
	start int64
}

// Reset sets key's counters of the window holding now and of the one
// before it, for every given size, to "0", each with the expiry that a
// write of that window sets (see the package documentation), so that
// GetCounters reports them as zero, not missing, until they expire, and
// diffs pushed later add to zero. The counters of one (namespace, key)
// share a bucket, hence a Cluster slot, so one MULTI/EXEC of a SET ... PXAT
// per counter does it, atomically, in one round trip, and the store
// forgets the previous counts it remembered of the key (see Hit). Sizes
// must be valid for the layout (ErrInvalidWindow); with none, nothing is
// sent.
//
// A reset after Close fails with an error that wraps strategy.ErrNotSent.
// Other errors never do: go-redis resends the transaction after a network
// error, so a reset that ends failing to dial may have been applied by an
// earlier attempt (a reset applied twice is the same reset, unless diffs
// pushed in between are lost with it).
func (s *Store) Reset(ctx context.Context, namespace, key string, sizes []time.Duration, now time.Time) (err error) {
	defer errs.Reset(&err, namespace)
	if err := s.checkOpen(); err != nil {
		return err
	}
	if len(sizes) == 0 {
		return nil
	}
	k, nsp := bucketOf(namespace, key), nsPart(namespace)
	var (
		buf      []byte
		counters []string
	)
	pipe := s.client.TxPipeline()
	for _, size := range sizes {
		sizeMs, err := sizeMsOf(size)
		if err != nil {
			return err
		}
		curMs := window.Start(now.UnixNano(), size) / int64(time.Millisecond)
		for _, startMs := range [2]int64{curMs, curMs - sizeMs} {
			var counter string
			counter, buf = s.layout.counterKey(buf, k, sizeMs, startMs, nsp, key)
			counters = append(counters, counter)
			// SET with PXAT, which go-redis's Set cannot send (its
			// ExpireAt is in seconds): the value and the expiry in one
			// command.
			pipe.Do(ctx, "set", counter, "0", "pxat", expireAtMs(sizeMs, startMs))
		}
	}
	_, err = pipe.Exec(ctx)
	// What the store remembers of the key's counts (its previous counts
	// above all) is wrong now, or may be after an error.
	s.prevs.forget(k, counters...)
	return s.partial(err, k)
}

// GetWindow returns the count of key's window of the given size that
// starts at start (Unix nanoseconds), with one GET. A missing counter is 0.
// An error wraps strategy.ErrNotSent as GetCounters' do. It is not part of
// strategy.Store: tests and Go callers use it to read one counter.
func (s *Store) GetWindow(ctx context.Context, namespace, key string, size time.Duration, start int64) (float64, error) {
	v, err := s.getWindow(ctx, namespace, key, size, start)
	if err != nil {
		return 0, fmt.Errorf("reading a window of namespace %q: %w", namespace, err)
	}
	return v, nil
}

func (s *Store) getWindow(ctx context.Context, namespace, key string, size time.Duration, start int64) (float64, error) {
	sizeMs, startMs, err := windowMs(size, start)
	if err != nil {
		return 0, err
	}
	k, _ := s.layout.counterKey(nil, bucketOf(namespace, key), sizeMs, startMs, nsPart(namespace), key)
	str, err := s.client.Get(ctx, k).Result()
	if errors.Is(err, goredis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, notSent(err)
	}
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return 0, fmt.Errorf("the counter holds %q, not a number", str)
	}
	return v, nil
}

// Hit applies one synchronous hit as a batch of one (see HitBatch, and
// strategy.Hitter for the contract and the hit ID rule).
func (s *Store) Hit(ctx context.Context, namespace, key, id string, windows []strategy.WindowHit, undo bool) ([]strategy.WindowCounts, int, error) {
	return strategy.HitAsBatch(ctx, s, namespace, key, id, windows, undo)
}
