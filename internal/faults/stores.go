package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

func init() {
	// The harness's own clients fail while it fails the stores: their
	// go-redis logs say nothing the table does not.
	redis.SetLogger(quiet{})
}

// quiet is a go-redis logger that drops everything.
type quiet struct{}

// Printf implements go-redis's logger.
func (quiet) Printf(context.Context, string, ...any) {}

// Backend is the store of a row, as the nodes reach it and as the
// harness counts its connections.
type Backend interface {
	// Strategy is the strategy JSON of the nodes' namespace.
	Strategy() json.RawMessage
	// Connections counts the store's client connections, the harness's
	// own left out.
	Connections(ctx context.Context) (int, error)
}

// redisConns returns connected_clients of INFO clients, less the asking
// connection.
func redisConns(ctx context.Context, addr string) (int, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, PoolSize: 1,
		ReadTimeout: 2 * time.Second, MaxRetries: -1})
	defer c.Close()
	info, err := c.Info(ctx, "clients").Result()
	if err != nil {
		return 0, fmt.Errorf("INFO clients on %s: %w", addr, err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "connected_clients:"); ok {
			n, err := strconv.Atoi(v)
			return n - 1, err
		}
	}
	return 0, fmt.Errorf("INFO clients on %s: no connected_clients", addr)
}

// RedisBackend is a standalone redis-server of the harness's, reached
// directly or, with Proxy set, through the harness's proxy: by every
// node, or with FirstOnly by the first node alone.
type RedisBackend struct {
	Server    *redistest.Server
	Proxy     *Proxy
	FirstOnly bool
}

// StrategyOf returns the strategy JSON of node i.
func (b *RedisBackend) StrategyOf(i int) json.RawMessage {
	if b.FirstOnly && i > 0 {
		return (&RedisBackend{Server: b.Server}).Strategy()
	}
	return b.Strategy()
}

// Strategy implements Backend.
func (b *RedisBackend) Strategy() json.RawMessage {
	addr := b.Server.Addr
	if b.Proxy != nil {
		addr = b.Proxy.Addr
	}
	j, _ := json.Marshal(map[string]any{"module": "redis", "addresses": []string{addr}})
	return j
}

// Connections implements Backend.
func (b *RedisBackend) Connections(ctx context.Context) (int, error) {
	return redisConns(ctx, b.Server.Addr)
}

// PostgresBackend is a database of a PostgreSQL server of the harness's.
type PostgresBackend struct {
	T      testing.TB
	Server *pgtest.Server
	DB     string
}

// Strategy implements Backend.
func (b *PostgresBackend) Strategy() json.RawMessage {
	j, _ := json.Marshal(map[string]any{"module": "postgres", "dsn": b.Server.DSN(b.DB), "table": "faults_counters"})
	return j
}

// Connections implements Backend.
func (b *PostgresBackend) Connections(context.Context) (int, error) {
	return b.Server.Connections(b.T, b.DB), nil
}

// SentinelBackend is a primary, its replica and one Sentinel.
type SentinelBackend struct {
	Primary, Replica, Sentinel *redistest.Server
	Name                       string
}

// StartSentinel starts a primary, a replica of it and a Sentinel that
// fails over after downAfter, and waits until the replica is in sync.
func StartSentinel(t testing.TB, downAfter time.Duration) *SentinelBackend {
	t.Helper()
	primary := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	waitReplica(t, replica.Addr)
	s := &SentinelBackend{Primary: primary, Replica: replica, Name: "faults"}
	s.Sentinel = redistest.StartSentinel(t, primary, s.Name, downAfter)
	return s
}

// waitReplica waits until the replica at addr is linked to its master.
func waitReplica(t testing.TB, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s not in sync: %v %s", addr, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Strategy implements Backend.
func (b *SentinelBackend) Strategy() json.RawMessage {
	j, _ := json.Marshal(map[string]any{"module": "redis", "addresses": []string{b.Sentinel.Addr}, "master_name": b.Name})
	return j
}

// Connections implements Backend: those of the primary the Sentinel
// names now.
func (b *SentinelBackend) Connections(ctx context.Context) (int, error) {
	addr, err := b.master(ctx)
	if err != nil {
		return 0, err
	}
	return redisConns(ctx, addr)
}

// master returns the address the Sentinel gives for the primary.
func (b *SentinelBackend) master(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: b.Sentinel.Addr})
	defer c.Close()
	a, err := c.GetMasterAddrByName(ctx, b.Name).Result()
	if err != nil {
		return "", err
	}
	return a[0] + ":" + a[1], nil
}

// ClusterBackend is a Redis Cluster of three masters with a replica each.
type ClusterBackend struct {
	Cluster *redistest.Cluster
}

// Strategy implements Backend.
func (b *ClusterBackend) Strategy() json.RawMessage {
	j, _ := json.Marshal(map[string]any{"module": "redis", "addresses": b.Cluster.Addrs})
	return j
}

// Connections implements Backend: the sum over the servers that answer.
func (b *ClusterBackend) Connections(ctx context.Context) (int, error) {
	total := 0
	for _, s := range b.Cluster.Servers {
		if n, err := redisConns(ctx, s.Addr); err == nil {
			total += n
		}
	}
	return total, nil
}

// clusterNode is a line of CLUSTER NODES.
type clusterNode struct {
	id, addr, masterID string
	master, failed     bool
	slots              []slotRange
}

// clusterNodes reads CLUSTER NODES from addr.
func clusterNodes(ctx context.Context, addr string) ([]clusterNode, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	out, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var nodes []clusterNode
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		nodes = append(nodes, clusterNode{
			id: f[0], addr: addr, masterID: f[3],
			master: strings.Contains(f[2], "master"),
			failed: strings.Contains(f[2], "fail"),
			slots:  parseSlots(f[8:]),
		})
	}
	return nodes, nil
}
