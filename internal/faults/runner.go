package faults

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	redisstore "github.com/ratesync/caddy-ratelimit/strategy/redis"
)

// Row is one measurement: a fault in one sync mode.
type Row struct {
	Fault *Fault
	// Sync is sync_rate 0; otherwise the namespace syncs every SyncRate.
	Sync bool
}

// SyncRate is the row's sync_rate.
func (r Row) SyncRate() time.Duration {
	if r.Sync {
		return 0
	}
	return PeriodicRate
}

// Interval is how often the row's nodes run a sync: sync_rate, or at
// sync_rate 0 once a second.
func (r Row) Interval() time.Duration {
	if r.Sync {
		return time.Second
	}
	return PeriodicRate
}

// Mode names the row's sync mode.
func (r Row) Mode() string {
	if r.Sync {
		return "sync_rate 0"
	}
	return "sync_rate " + PeriodicRate.String()
}

// ID names the row in file names and keys.
func (r Row) ID() string {
	if r.Sync {
		return r.Fault.Name + "-sync"
	}
	return r.Fault.Name + "-periodic"
}

// PeriodicRate is the sync_rate of the periodic rows.
const PeriodicRate = 100 * time.Millisecond

// Settings of every row's nodes and load.
const (
	// LimitPerSecond is LimitPath's limit; the load sends three times it.
	LimitPerSecond = 50
	// PolicyGrace is how long after a store fault began every node has
	// found the store gone (read_timeout, 1 s, and a sync run): the
	// failure policies are judged from then.
	PolicyGrace = 2 * time.Second
	// BanLimit is BanPath's limit per minute, past which a key is banned.
	BanLimit = 5
	// BanFor is how long a ban lasts.
	BanFor = 10 * time.Minute
	// MaxConcurrent is ConcPath's max_concurrent.
	MaxConcurrent = 5
	// Hold is how long the upstream holds a request of ConcPath.
	Hold = 100 * time.Millisecond
	// ReadTimeout is the Redis strategy's read_timeout (its default).
	ReadTimeout = time.Second
)

// DefaultRates are the load of a full run: 600 requests per second, as
// docs/faults.md states the synchronous promise at (in a periodic row,
// the Rate class's go to CountPath: see Rates.For).
var DefaultRates = Rates{Count: 330, Limit: 3 * LimitPerSecond, Conc: 60, Rate: 60}

// Runner runs rows on the stores it starts.
type Runner struct {
	// T owns the stores and the temporary directories.
	T testing.TB
	// Caddy is the Caddy binary built with the plugin.
	Caddy string
	// Dir holds each row's configs and node logs.
	Dir string
	// Nodes is the fleet's size.
	Nodes int
	// Scale multiplies the faults' durations and the phases around them.
	Scale float64
	// Rates is the load.
	Rates Rates
	// Progress, when set, receives a line per row.
	Progress io.Writer
	// Quick ends a row's aftermath once every node syncs again and the
	// ban reached every node, instead of after a fixed six to eight
	// seconds, and shortens the load before the fault to a second.
	Quick bool

	redis    *redistest.Server
	postgres *PostgresBackend
	upstream *Upstream
}

// Close releases what the runner started itself.
func (r *Runner) Close() {
	if r.upstream != nil {
		r.upstream.Close()
	}
}

// backend returns the store of a row's kind, starting it if need be, and
// fills in the env's handles.
func (r *Runner) backend(f *Fault, e *Env) (Backend, func(), error) {
	switch kind := f.Store; kind {
	case StoreRedis, StoreRedisProxy, StoreRedisNodeProxy:
		if r.redis == nil {
			r.redis = redistest.Start(r.T)
		}
		e.Redis = r.redis
		b := &RedisBackend{Server: r.redis}
		if kind == StoreRedis {
			return b, func() {}, nil
		}
		p, err := StartProxy(r.redis.Addr)
		if err != nil {
			return nil, nil, err
		}
		b.Proxy, e.Proxy = p, p
		b.FirstOnly = kind == StoreRedisNodeProxy
		return b, func() { p.Close() }, nil
	case StorePostgres:
		if r.postgres == nil {
			srv := pgtest.Start(r.T)
			srv.CreateDB(r.T, "faults")
			r.postgres = &PostgresBackend{T: r.T, Server: srv, DB: "faults"}
		}
		e.Postgres = r.postgres.Server
		return r.postgres, func() {}, nil
	case StoreSentinel:
		s := StartSentinel(r.T, time.Second)
		e.Sentinel = s
		return s, func() { s.Sentinel.Kill(); s.Replica.Kill(); s.Primary.Kill() }, nil
	case StoreCluster:
		timeout := cmp.Or(f.NodeTimeout, 15*time.Second)
		var args []string
		if f.PartialOutage {
			// As docs/stores.md advises: the live masters serve their
			// slots while the cluster holds one failed.
			args = []string{"--cluster-require-full-coverage", "no"}
		}
		c := &ClusterBackend{Cluster: redistest.StartClusterTimeout(r.T, 3, 1, timeout, args...)}
		e.Cluster = c
		return c, func() {
			for _, s := range c.Cluster.Servers {
				s.Kill()
			}
		}, nil
	}
	return nil, nil, fmt.Errorf("unknown store kind %q", f.Store)
}

// RunRow runs one row: it starts the store if need be and the nodes,
// sends the load, injects the fault, waits for the aftermath, and sums up
// what happened.
func (r *Runner) RunRow(ctx context.Context, row Row) (*Outcome, error) {
	began := time.Now()
	env := &Env{T: r.T, Scale: r.Scale, KilledNode: -1}
	backend, release, err := r.backend(row.Fault, env)
	if err != nil {
		return nil, err
	}
	defer release()
	if r.upstream == nil {
		if r.upstream, err = StartUpstream(Hold); err != nil {
			return nil, err
		}
	}
	r.upstream.Reset()

	dir := filepath.Join(r.Dir, row.ID())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	nodes := make([]*Node, r.Nodes)
	errs := make([]error, r.Nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			nodes[i], errs[i] = StartNode(ctx, r.Caddy, dir, fmt.Sprintf("node%d", i+1), func() ([]byte, error) {
				return NodeConfig{
					Listen: caddyproc.Listen(0), AdminListen: caddyproc.Listen(1), SyncRate: row.SyncRate(), Strategy: strategyOf(backend, i),
					Limit: LimitPerSecond, BanLimit: BanLimit, Ban: BanFor,
					MaxConcurrent: MaxConcurrent, Upstream: r.upstream.Addr, OnStoreFailure: row.Fault.Policy,
				}.JSON()
			})
		})
	}
	wg.Wait()
	defer func() {
		for _, n := range nodes {
			if n != nil && n.Running() {
				n.Stop()
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	prefix := row.ID() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-"
	rates := r.Rates.For(row.Sync)
	load := NewLoad(prefix, rates, nodes)
	env.Nodes, env.Load = nodes, load
	o := &Outcome{Row: row, Title: row.Fault.TitleFor(r.Scale), Nodes: r.Nodes, Rates: rates, KilledNode: -1}

	// Warm-up: every node answers every route, and a first ban, set off
	// on node 1 before the fault, must still hold on every node after it.
	o.BanBeforeKey = prefix + "ban-before"
	paths := []string{CountPath, LimitPath, ConcPath, BanPath}
	if row.Sync {
		paths = append(paths, RatePath)
	}
	for i, n := range nodes {
		for _, path := range paths {
			if st := load.Burst(ctx, i, path, prefix+"warm", 1); st[0] != 200 {
				return nil, fmt.Errorf("warm-up %s on %s: status %d; its log:\n%s", path, n.Name, st[0], n.Log(20))
			}
		}
	}
	load.Burst(ctx, 0, BanPath, o.BanBeforeKey, BanLimit+3)
	for i, n := range nodes {
		o.GoroutinesBefore = append(o.GoroutinesBefore, must(n.Goroutines(ctx)))
		o.logOffsets = append(o.logOffsets, n.LogSize())
		_ = i
	}
	// The connections settle once every node has synced with the store.
	if err := Sleep(ctx, 500*time.Millisecond); err != nil {
		return nil, err
	}
	o.ConnsBefore, _ = backend.Connections(ctx)

	poll := newPoller(nodes)
	poll.start(ctx)
	load.Start(ctx)
	o.LoadStart = load.Started()
	if err := Sleep(ctx, env.Scaled(3*time.Second, r.minPhase())); err != nil {
		return nil, err
	}

	// The fault. A second ban is set off on node 1 a second into it: it
	// must reach every node once the store is back.
	o.BanDuringKey = prefix + "ban-during"
	banDone := make(chan struct{})
	env.began = func(t time.Time) {
		o.Start = t
		go func() {
			defer close(banDone)
			if Sleep(ctx, time.Second) == nil {
				o.BanSetAt = time.Now()
				load.Burst(ctx, 0, BanPath, o.BanDuringKey, BanLimit+3)
			}
		}()
	}
	served, err := row.Fault.Inject(ctx, env)
	if err != nil {
		return nil, fmt.Errorf("injecting the fault: %w", err)
	}
	if o.Start.IsZero() {
		return nil, errors.New("the fault never called Began")
	}
	o.End = time.Now()
	o.Served = served
	o.KilledNode, o.KilledAt = env.KilledNode, env.KilledAt
	o.failedSlots, o.slotsFrom, o.StuckParts = env.FailedSlots, env.SlotsFrom, env.StuckParts
	// A Redis restarted empty lost the ban set off before the fault: the
	// nodes that hold it write it back.
	banBack := make(chan time.Duration, 1)
	if row.Fault.StoreLoses && row.Fault.Store == StoreRedis {
		go func() { banBack <- banBackIn(ctx, env.Redis.Addr, o.BanBeforeKey, served) }()
	} else {
		banBack <- notMeasured
	}
	<-banDone
	if o.Served.IsZero() {
		o.BanFrom = o.BanSetAt
	} else {
		o.BanFrom = o.Served
	}
	type reach struct {
		lag  time.Duration
		seen string
	}
	banReached := make(chan reach, 1)
	go func() {
		lag, seen := r.banReach(ctx, nodes, o.KilledNode, o.BanDuringKey, o.BanFrom)
		banReached <- reach{lag, seen}
	}()
	banLag := func() time.Duration {
		b := <-banReached
		if b.lag < 0 {
			o.Notes = append(o.Notes, "the ban set off during the fault, 20 s later: "+b.seen)
		}
		return b.lag
	}

	if r.Quick {
		// Events, not wall-clock: the ban reaches every node, and every
		// node syncs again (20 s at most), then half a second more.
		o.BanLag = banLag()
		deadline := time.Now().Add(20 * time.Second)
		for !o.Served.IsZero() && !poll.recovered(o.Served, o.KilledNode) && time.Now().Before(deadline) {
			if err := Sleep(ctx, 100*time.Millisecond); err != nil {
				return nil, err
			}
		}
		if err := Sleep(ctx, 500*time.Millisecond); err != nil {
			return nil, err
		}
	} else if err := Sleep(ctx, env.Scaled(8*time.Second, 6*time.Second)); err != nil {
		return nil, err
	}
	results := load.Stop()
	o.LoadEnd = time.Now()
	if !r.Quick {
		o.BanLag = banLag()
	}

	// Settle: every diff pushed, for up to ReadBudget (longer than
	// go-redis's 60 s reload of a Cluster's slot map).
	live := liveNodes(nodes, o.KilledNode)
	deadline := time.Now().Add(ReadBudget)
	for _, n := range live {
		for {
			p, err := n.PendingDiffs(ctx)
			if err == nil && p == 0 {
				break
			}
			if time.Now().After(deadline) {
				o.Notes = append(o.Notes, fmt.Sprintf("%s still had %d diffs pending %s after the load (%v)", n.Name, p, secs1(ReadBudget), err))
				break
			}
			if err := Sleep(ctx, 50*time.Millisecond); err != nil {
				return nil, err
			}
		}
	}
	o.Settled = time.Since(o.LoadEnd)
	if o.Settled > 2*time.Second {
		o.Notes = append(o.Notes, fmt.Sprintf("the nodes' pending diffs were pushed %s after the load stopped (%s after the store served again)",
			secs1(o.Settled), secs1(time.Since(o.recoveryFrom()))))
	}
	// One more sync interval, for the bans of the last run.
	_ = Sleep(ctx, time.Second)
	o.Samples = poll.stop()

	for _, n := range live {
		banned, err := n.Banned(ctx, o.BanBeforeKey)
		o.BanKept = append(o.BanKept, err == nil && banned)
	}
	o.BanBack = <-banBack
	for i, n := range nodes {
		if i == o.KilledNode {
			o.GoroutinesAfter = append(o.GoroutinesAfter, -1)
			continue
		}
		o.GoroutinesAfter = append(o.GoroutinesAfter, must(n.Goroutines(ctx)))
	}
	o.ConnsAfter, _ = backend.Connections(ctx)
	for i, n := range nodes {
		if i == o.KilledNode && !n.Running() && row.Fault.Name == "node-kill" {
			o.Logs = append(o.Logs, n.ReadLog(o.logOffsets[i], o.Start, o.KilledAt))
			continue
		}
		o.Logs = append(o.Logs, n.ReadLog(o.logOffsets[i], o.Start, o.LoadEnd))
	}
	if err := o.account(ctx, results, live, r.upstream); err != nil {
		return nil, err
	}
	if o.hasRates() {
		if err := o.accountTurns(ctx, results, backend.Strategy()); err != nil {
			return nil, err
		}
	}
	o.Notes = append(o.Notes, env.notes...)
	o.Elapsed = time.Since(began)
	if r.Progress != nil {
		fmt.Fprintf(r.Progress, "%-28s %s\n", row.ID(), o.Summary())
	}
	return o, nil
}

// minPhase is the least load before a fault.
func (r *Runner) minPhase() time.Duration {
	if r.Quick {
		return time.Second
	}
	return 2 * time.Second
}

// liveNodes returns the nodes but the killed one.
func liveNodes(nodes []*Node, killed int) []*Node {
	var live []*Node
	for i, n := range nodes {
		if i != killed {
			live = append(live, n)
		}
	}
	return live
}

// banReach waits until every live node holds key as banned, and returns
// how long after from that was (-1: not within 20 s).
func (r *Runner) banReach(ctx context.Context, nodes []*Node, killed int, key string, from time.Time) (time.Duration, string) {
	deadline := from.Add(20 * time.Second)
	for {
		all := true
		var seen []string // what each node said last: for a ban that never arrives
		for _, n := range liveNodes(nodes, killed) {
			b, err := n.Banned(ctx, key)
			switch {
			case err != nil:
				seen = append(seen, fmt.Sprintf("%s: %v", n.Name, err))
			case !b:
				seen = append(seen, n.Name+": not banned")
			default:
				seen = append(seen, n.Name+": banned")
			}
			all = all && err == nil && b
		}
		if all {
			return max(time.Since(from), 0), ""
		}
		if time.Now().After(deadline) || Sleep(ctx, 50*time.Millisecond) != nil {
			return -1, strings.Join(seen, "; ")
		}
	}
}

// strategyOf returns the strategy JSON of node i: the backend's, or
// one of its own where the backend reaches nodes apart.
func strategyOf(b Backend, i int) json.RawMessage {
	if p, ok := b.(interface{ StrategyOf(int) json.RawMessage }); ok {
		return p.StrategyOf(i)
	}
	return b.Strategy()
}

// notMeasured is a duration the row did not measure.
const notMeasured = time.Duration(-2)

// banBackIn waits until the Redis at addr holds key's ban again, and
// returns how long after from that was (-1: not within 20 s).
func banBackIn(ctx context.Context, addr, key string, from time.Time) time.Duration {
	store, err := (&redisstore.Redis{Addresses: []string{addr}}).Open()
	if err != nil {
		return -1
	}
	defer store.Close()
	for deadline := from.Add(20 * time.Second); ; {
		bans, _, err := store.GetBans(ctx, Namespace, -1, time.Now())
		if err == nil && slices.ContainsFunc(bans, func(b strategy.Ban) bool { return b.Key == key }) {
			return max(time.Since(from), 0)
		}
		if time.Now().After(deadline) || Sleep(ctx, 50*time.Millisecond) != nil {
			return -1
		}
	}
}

// must returns v, or -1 on an error.
func must(v int, err error) int {
	if err != nil {
		return -1
	}
	return v
}

// poller reads every node's sync metrics every 100 ms.
type poller struct {
	mu      sync.Mutex
	nodes   []*Node
	stopCh  chan struct{}
	done    chan struct{}
	samples [][]SyncSample
}

func newPoller(nodes []*Node) *poller {
	return &poller{nodes: nodes, stopCh: make(chan struct{}), done: make(chan struct{}), samples: make([][]SyncSample, len(nodes))}
}

func (p *poller) start(ctx context.Context) {
	go func() {
		defer close(p.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			var wg sync.WaitGroup
			for i, n := range p.nodes {
				wg.Go(func() {
					if s := n.Sync(ctx); s.OK {
						p.mu.Lock()
						p.samples[i] = append(p.samples[i], s)
						p.mu.Unlock()
					}
				})
			}
			wg.Wait()
			select {
			case <-ctx.Done():
				return
			case <-p.stopCh:
				return
			case <-t.C:
			}
		}
	}()
}

// recovered reports whether every node but killed has, after served, a
// clean sync run with no failure since.
func (p *poller) recovered(served time.Time, killed int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, ss := range p.samples {
		if i == killed {
			continue
		}
		clean := false
		for j := 1; j < len(ss); j++ {
			switch {
			case ss[j].Errors > ss[j-1].Errors:
				clean = false
			case ss[j].Runs > ss[j-1].Runs && ss[j].At.After(served):
				clean = true
			}
		}
		if !clean {
			return false
		}
	}
	return true
}

func (p *poller) stop() [][]SyncSample {
	close(p.stopCh)
	<-p.done
	return p.samples
}
