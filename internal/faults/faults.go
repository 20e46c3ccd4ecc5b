package faults

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// Store kinds a fault runs on.
const (
	StoreRedis      = "redis"       // a redis-server of the harness's
	StoreRedisProxy = "redis-proxy" // the same, behind the harness's proxy
	// StoreRedisNodeProxy is the same Redis, reached by the first node
	// through the harness's proxy and by the others directly.
	StoreRedisNodeProxy = "redis-node-proxy"
	StorePostgres       = "postgres"
	StoreSentinel       = "sentinel" // a primary, a replica and a Sentinel, per row
	StoreCluster        = "cluster"  // three masters with a replica each, per row
)

// Fault is one fault the harness injects, under load.
type Fault struct {
	// Name identifies it in flags, file names and keys.
	Name string
	// Title describes it in the table; %s is replaced by the scaled
	// duration, where it has one.
	Title string
	// Store is the kind of store its rows run on.
	Store string
	// StoreLoses is set when the store itself loses data: hits sent
	// before the fault began are not judged.
	StoreLoses bool
	// NodeFault is set when the store never fails: no recovery to time.
	NodeFault bool
	// Policy is the namespace's on_store_failure in its rows: "" (allow),
	// "share" or "deny".
	Policy string
	// NodeTimeout is a Cluster's cluster-node-timeout (0: 15 s).
	// PartialOutage is set when only a part of the store fails (a
	// Cluster master the cluster itself fails over, the row's limited
	// key on another master): the limit holds throughout. Its Cluster
	// runs with cluster-require-full-coverage no, as docs/stores.md
	// advises.
	NodeTimeout   time.Duration
	PartialOutage bool
	// Migrates is set when slots move between masters while the store
	// serves (a Cluster resharded): the limit holds throughout. Stuck
	// is set when one slot stays half-way through its move: only its
	// part may fail.
	Migrates, Stuck bool
	// Inject injects the fault, calls e.Began when it starts and returns
	// once the store serves again (or the fault is over).
	Inject func(ctx context.Context, e *Env) (served time.Time, err error)
}

// Env is what a fault acts on.
type Env struct {
	// T is the test the row runs in.
	T testing.TB
	// Scale multiplies the faults' durations.
	Scale float64
	// Nodes and Load are the row's.
	Nodes []*Node
	Load  *Load
	// Stores: those of the row's kind are set.
	Redis    *redistest.Server
	Proxy    *Proxy
	Postgres *pgtest.Server
	Sentinel *SentinelBackend
	Cluster  *ClusterBackend
	// KilledNode is the index of a node the fault killed or stopped, or -1;
	// KilledAt, when.
	KilledNode int
	KilledAt   time.Time
	// FailedSlots are the slots of a Cluster master the fault killed, and
	// SlotsFrom a server to ask CLUSTER KEYSLOT.
	FailedSlots []slotRange
	SlotsFrom   string
	// StuckParts is how many of the store's parts live in a slot the
	// fault leaves stuck.
	StuckParts int

	began func(time.Time)
	notes []string
}

// Began records that the fault starts now.
func (e *Env) Began() { e.began(time.Now()) }

// Note adds a remark to the row, such as how long a failover took.
func (e *Env) Note(format string, args ...any) {
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
}

// Scaled returns d times the scale, at least min.
func (e *Env) Scaled(d, min time.Duration) time.Duration {
	return max(time.Duration(float64(d)*e.Scale), min)
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Faults are every fault, the likeliest in production first.
var Faults = []*Fault{
	{
		Name: "redis-pause", Title: "Redis paused %s (SIGSTOP, SIGCONT)", Store: StoreRedis,
		Inject: pauseRedis,
	},
	{
		Name: "redis-pause-share", Title: "Redis paused %s, on_store_failure share", Store: StoreRedis, Policy: "share",
		Inject: pauseRedis,
	},
	{
		Name: "redis-pause-deny", Title: "Redis paused %s, on_store_failure deny", Store: StoreRedis, Policy: "deny",
		Inject: pauseRedis,
	},
	{
		Name: "redis-kill", Title: "Redis killed, restarted empty %s later", Store: StoreRedis, StoreLoses: true,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			// The fault begins once Redis is dead: a hit sent before
			// may still have been applied, and lost with its data.
			e.Redis.Kill()
			e.Began()
			err := Sleep(ctx, e.Scaled(5*time.Second, time.Second))
			e.Redis.Restart()
			return time.Now(), err
		},
	},
	{
		Name: "postgres-stop", Title: "PostgreSQL stopped (-m immediate), started %s later", Store: StorePostgres,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			e.Began()
			e.Postgres.StopImmediate()
			err := Sleep(ctx, e.Scaled(8*time.Second, time.Second))
			e.Postgres.Start()
			return time.Now(), err
		},
	},
	{
		Name: "redis-flap", Title: "Redis flapping for %s: down 2 s (connections refused), up 1 s", Store: StoreRedisProxy,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			if e.Proxy == nil {
				return time.Time{}, errNoProxy
			}
			e.Began()
			end := time.Now().Add(e.Scaled(45*time.Second, 6*time.Second))
			var served time.Time
			for time.Now().Before(end) {
				e.Proxy.Down()
				err := Sleep(ctx, 2*time.Second)
				if uerr := e.Proxy.Up(); uerr != nil {
					return time.Time{}, uerr
				}
				served = time.Now()
				if err != nil {
					return served, err
				}
				if err := Sleep(ctx, time.Second); err != nil {
					return served, err
				}
			}
			return served, nil
		},
	},
	{
		Name: "node-partition", Title: "one node cut off from Redis for %s (its connections refused), the others reaching it", Store: StoreRedisNodeProxy,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			if e.Proxy == nil {
				return time.Time{}, errNoProxy
			}
			e.Began()
			e.Proxy.Down()
			err := Sleep(ctx, e.Scaled(10*time.Second, time.Second))
			if uerr := e.Proxy.Up(); uerr != nil {
				return time.Time{}, uerr
			}
			return time.Now(), err
		},
	},
	{
		Name: "node-kill", Title: "a node killed (kill -9) under load", Store: StoreRedis, NodeFault: true,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			return time.Time{}, e.takeDown(ctx, true)
		},
	},
	{
		Name: "node-stop", Title: "a node stopped gracefully (SIGINT) under load", Store: StoreRedis, NodeFault: true,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			return time.Time{}, e.takeDown(ctx, false)
		},
	},
	{
		Name: "reloads", Title: "%s reloads per node under load (POST /load, forced)", Store: StoreRedis, NodeFault: true,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			n := e.Reloads()
			e.Began()
			errs := make([]error, len(e.Nodes))
			drops := make([]int, len(e.Nodes))
			done := make(chan int)
			began := time.Now()
			for i, node := range e.Nodes {
				go func() {
					for j := range n {
						d, err := node.Reload(ctx)
						drops[i] += d
						if err != nil {
							errs[i] = fmt.Errorf("%s, reload %d: %w", node.Name, j+1, err)
							break
						}
					}
					done <- i
				}()
			}
			for range e.Nodes {
				<-done
			}
			e.Note("%d reloads per node took %s; the admin endpoint dropped the connection of a POST /load %v times per node (posted again)",
				n, secs1(time.Since(began)), drops)
			return time.Time{}, errors.Join(errs...)
		},
	},
	{
		Name: "reloads-pause", Title: "%s reloads per node under load, Redis paused (SIGSTOP) 2 s of every 3 s", Store: StoreRedis,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			return e.reloadsPaused(ctx)
		},
	},
	{
		Name: "redis-slow", Title: "Redis replies delayed 1.2 s (read_timeout 1 s) for %s, by a proxy", Store: StoreRedisProxy,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			if e.Proxy == nil {
				return time.Time{}, errNoProxy
			}
			e.Began()
			e.Proxy.SetDelay(1200 * time.Millisecond)
			err := Sleep(ctx, e.Scaled(10*time.Second, time.Second))
			e.Proxy.SetDelay(0)
			return time.Now(), err
		},
	},
	{
		Name: "sentinel-failover", Title: "Sentinel: primary killed, replica promoted (down-after 1 s)", Store: StoreSentinel, StoreLoses: true,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			s := e.Sentinel
			killed := time.Now()
			s.Primary.Kill()
			e.Began() // once the primary is dead, as redis-kill
			deadline := time.Now().Add(60 * time.Second)
			for {
				addr, err := s.master(ctx)
				if err == nil && addr == s.Replica.Addr && isMaster(ctx, s.Replica.Addr) {
					served := time.Now()
					e.Note("the Sentinel promoted the replica %.1f s after the kill", served.Sub(killed).Seconds())
					return served, nil
				}
				if time.Now().After(deadline) {
					return time.Time{}, fmt.Errorf("no failover within 60 s of the kill: %v %v", addr, err)
				}
				if err := Sleep(ctx, 20*time.Millisecond); err != nil {
					return time.Time{}, err
				}
			}
		},
	},
	{
		Name: "cluster-natural-5s", Title: "Redis Cluster: a master killed, the cluster left to promote its replica (cluster-node-timeout 5 s, cluster-require-full-coverage no)", Store: StoreCluster, StoreLoses: true,
		NodeTimeout: 5 * time.Second, PartialOutage: true,
		Inject: naturalFailover,
	},
	{
		Name: "cluster-natural-15s", Title: "Redis Cluster: a master killed, the cluster left to promote its replica (cluster-node-timeout 15 s, Redis's default; cluster-require-full-coverage no)", Store: StoreCluster, StoreLoses: true,
		NodeTimeout: 15 * time.Second, PartialOutage: true,
		Inject: naturalFailover,
	},
	{
		Name: "cluster-reshard", Title: "Redis Cluster: a fourth master added, a quarter of the slots (4,096) migrated to it (redis-cli --cluster reshard)", Store: StoreCluster,
		Migrates: true,
		Inject:   reshard,
	},
	{
		Name: "cluster-stuck-slot", Title: "Redis Cluster: a slot left half-way through its migration to another master for %s (MIGRATING, IMPORTING, half its keys moved), then moved", Store: StoreCluster,
		Migrates: true, Stuck: true,
		Inject: stuckSlot,
	},
	{
		Name: "cluster-failover", Title: "Redis Cluster: a master killed, its replica promoted (CLUSTER FAILOVER TAKEOVER)", Store: StoreCluster, StoreLoses: true,
		Inject: func(ctx context.Context, e *Env) (time.Time, error) {
			return clusterFailover(ctx, e, false)
		},
	},
}

// naturalFailover is clusterFailover as in production: the cluster holds
// the master failed and promotes its replica by itself.
func naturalFailover(ctx context.Context, e *Env) (time.Time, error) {
	return clusterFailover(ctx, e, true)
}

// clusterFailover kills a Cluster master that has a replica, and returns
// once the replica serves its slots. Unless natural, it promotes the
// replica at once (CLUSTER FAILOVER TAKEOVER); natural, it waits for the
// cluster to, and kills a master that does not hold the row's limited
// key, so that the key, on a live master, is judged throughout the
// detection.
func clusterFailover(ctx context.Context, e *Env, natural bool) (time.Time, error) {
	c := e.Cluster.Cluster
	nodes, err := clusterNodes(ctx, c.Addrs[0])
	if err != nil {
		return time.Time{}, err
	}
	var victim, replica string
	for _, m := range nodes {
		if !m.master || natural && holdsKey(ctx, m.addr, e.Load.LimitKey) {
			continue
		}
		for _, r := range nodes {
			if r.masterID == m.id {
				victim, replica = m.addr, r.addr
				e.FailedSlots, e.SlotsFrom = m.slots, r.addr
			}
		}
		if victim != "" {
			break
		}
	}
	if victim == "" {
		return time.Time{}, errors.New("no master with a replica (and, for a natural failover, without the limited key) in CLUSTER NODES")
	}
	waitReplicaCtx(ctx, replica)
	killed := time.Now()
	for _, s := range c.Servers {
		if s.Addr == victim {
			s.Kill()
		}
	}
	e.Began() // once the master is dead, as redis-kill
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer rc.Close()
	wait, promoted, since := 90*time.Second, "the cluster promoted replica "+replica, "the kill"
	if !natural {
		if err := rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
			return time.Time{}, fmt.Errorf("CLUSTER FAILOVER TAKEOVER on %s: %w", replica, err)
		}
		wait, promoted, since = 30*time.Second, "replica "+replica+" promoted", "the takeover"
	}
	deadline := time.Now().Add(wait)
	for {
		info, err := rc.ClusterInfo(ctx).Result()
		if err == nil && isMaster(ctx, replica) && strings.Contains(info, "cluster_state:ok") {
			served := time.Now()
			e.Note("master %s killed; %s %.2f s later", victim, promoted, served.Sub(killed).Seconds())
			return served, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("replica %s not serving %s after %s: %v", replica, wait, since, err)
		}
		if err := Sleep(ctx, 10*time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
}

// reshard adds a fourth master to the Cluster and moves a quarter of the
// slots to it, and returns once they are all moved.
func reshard(ctx context.Context, e *Env) (time.Time, error) {
	c := e.Cluster.Cluster
	m := c.AddMaster(e.T)
	e.Began()
	began := time.Now()
	if err := c.Reshard(ctx, m, 16384/4); err != nil {
		return time.Time{}, err
	}
	e.Note("4,096 slots moved to the new master %s in %.2f s", m.Addr, time.Since(began).Seconds())
	return time.Now(), nil
}

// stuckSlot leaves the slot of a key of the load, which the load sends
// now, half-way through its migration to another master for 10 s
// (scaled), and then finishes the move.
func stuckSlot(ctx context.Context, e *Env) (time.Time, error) {
	c := e.Cluster.Cluster
	slots := newBucketSlots(c.Addrs[0])
	defer slots.close()
	key := e.Load.CountKey(int(time.Since(e.Load.Started())/time.Second), 0)
	slot, err := slots.of(ctx, redisBucket(Namespace, key))
	if err != nil {
		return time.Time{}, err
	}
	if limit, err := slots.of(ctx, redisBucket(Namespace, e.Load.LimitKey)); err != nil || limit == slot {
		return time.Time{}, fmt.Errorf("the limited key is in the slot to leave stuck, %d, or unknown: %v", slot, err)
	}
	for b := range redisBuckets {
		if s, err := slots.of(ctx, b); err == nil && s == slot {
			e.StuckParts++
		}
	}
	m, err := c.BeginMigration(ctx, slot)
	if err != nil {
		return time.Time{}, err
	}
	e.Began()
	e.Note("slot %d (the key %s) left migrating from %s to %s", slot, key, m.Src, m.Dst)
	if err := Sleep(ctx, e.Scaled(10*time.Second, time.Second)); err != nil {
		return time.Time{}, err
	}
	if err := m.Finish(ctx); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

// holdsKey reports whether the Redis at addr holds a key that ends with
// ":" and key: a counter of that client key.
func holdsKey(ctx context.Context, addr, key string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	keys, err := c.Keys(ctx, "*:"+key).Result()
	return err == nil && len(keys) > 0
}

// pauseRedis pauses Redis for 10 s, scaled.
func pauseRedis(ctx context.Context, e *Env) (time.Time, error) {
	e.Began()
	e.Redis.Pause()
	err := Sleep(ctx, e.Scaled(10*time.Second, time.Second))
	e.Redis.Resume()
	return time.Now(), err
}

// Reloads is how many reloads per node the reloads fault does: 100,
// scaled.
func (e *Env) Reloads() int { return max(int(100*e.Scale), 5) }

// reloadsPaused reloads every node Reloads times, ten in every three
// seconds, while Redis is paused two seconds of every three: turns of
// rates that a node decided while the store's answer was in doubt wait in
// its outbox across reloads, and some reloads come as the store is back
// and the outbox pushes. It returns when Redis was last resumed.
func (e *Env) reloadsPaused(ctx context.Context) (time.Time, error) {
	const (
		perCycle = 10
		cycle    = 3 * time.Second
		paused   = 2 * time.Second
	)
	n := e.Reloads()
	cycles := (n + perCycle - 1) / perCycle
	e.Began()
	began := time.Now()
	errs := make([]error, len(e.Nodes))
	drops := make([]int, len(e.Nodes))
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for i, node := range e.Nodes {
			wg.Go(func() {
				for j := range n {
					if Sleep(ctx, time.Until(began.Add(time.Duration(j)*cycle/perCycle))) != nil {
						return
					}
					d, err := node.Reload(ctx)
					drops[i] += d
					if err != nil {
						errs[i] = fmt.Errorf("%s, reload %d: %w", node.Name, j+1, err)
						return
					}
				}
			})
		}
		wg.Wait()
	}()
	var served time.Time
	var err error
	for c := 0; c < cycles && err == nil; c++ {
		e.Redis.Pause()
		err = Sleep(ctx, time.Until(began.Add(time.Duration(c)*cycle+paused)))
		e.Redis.Resume()
		served = time.Now()
		if err == nil {
			err = Sleep(ctx, time.Until(began.Add(time.Duration(c+1)*cycle)))
		}
	}
	<-done
	e.Note("%d reloads per node took %s, Redis paused %d times; the admin endpoint dropped the connection of a POST /load %v times per node (posted again)",
		n, secs1(time.Since(began)), cycles, drops)
	return served, errors.Join(append(errs, err)...)
}

// takeDown kills (kill -9) or stops (SIGINT) the last node, after the
// load stops sending to it, and lets the rest run on.
func (e *Env) takeDown(ctx context.Context, kill bool) error {
	i := len(e.Nodes) - 1
	e.Began()
	e.Load.SetDown(i, true)
	e.KilledNode, e.KilledAt = i, time.Now()
	if kill {
		e.Nodes[i].Kill()
	} else {
		e.Nodes[i].Stop()
		e.Note("the stopped node exited %.2f s after SIGINT", time.Since(e.KilledAt).Seconds())
	}
	return Sleep(ctx, e.Scaled(5*time.Second, 2*time.Second))
}

// isMaster reports whether the Redis at addr says it is a master.
func isMaster(ctx context.Context, addr string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	return err == nil && strings.Contains(info, "role:master")
}

// waitReplicaCtx waits up to 20 s until the replica at addr is linked.
func waitReplicaCtx(ctx context.Context, addr string) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for range 400 {
		info, err := c.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if Sleep(ctx, 50*time.Millisecond) != nil {
			return
		}
	}
}

// FaultByName returns the fault of that name.
func FaultByName(name string) (*Fault, bool) {
	for _, f := range Faults {
		if f.Name == name {
			return f, true
		}
	}
	return nil, false
}

// TitleFor returns the fault's title with its scaled duration.
func (f *Fault) TitleFor(scale float64) string {
	if !strings.Contains(f.Title, "%s") {
		return f.Title
	}
	e := &Env{Scale: scale}
	var d string
	switch f.Name {
	case "redis-pause", "redis-pause-share", "redis-pause-deny", "redis-slow", "node-partition", "cluster-stuck-slot":
		d = secs(e.Scaled(10*time.Second, time.Second))
	case "redis-kill":
		d = secs(e.Scaled(5*time.Second, time.Second))
	case "postgres-stop":
		d = secs(e.Scaled(8*time.Second, time.Second))
	case "redis-flap":
		d = secs(e.Scaled(45*time.Second, 6*time.Second))
	case "reloads", "reloads-pause":
		d = strconv.Itoa(e.Reloads())
	}
	return fmt.Sprintf(f.Title, d)
}

// secs formats a duration in seconds: "10 s", "2.5 s".
func secs(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
}
