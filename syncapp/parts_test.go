package syncapp

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/window"
)

// TestClusterMasterDownBlindsOnlyItsParts kills one master of a
// three-master Cluster under two nodes: the keys of the other masters
// keep syncing (periodic: each node sees the other's hits; sync_rate 0:
// every hit reaches the store), the dead master's keys count locally, a
// node that held the whole store down finds the live masters back, and
// once the master is back their hits reach the store, each once.
func TestClusterMasterDownBlindsOnlyItsParts(t *testing.T) {
	for _, syncRate := range []string{"100ms", "0"} {
		t.Run("sync_rate "+syncRate, func(t *testing.T) {
			cl := redistest.StartCluster(t, 3)
			addrs, _ := json.Marshal(cl.Addrs)
			s := fleetStore{strategy: fmt.Sprintf(`{"module": "redis", "addresses": %s, "dial_timeout": "500ms", "read_timeout": "1s"}`, addrs)}
			cfg := s.config(syncRate, "1h")
			var nodes []*Namespace
			for range 2 {
				ns := start(t, caddy.NewUsagePool(), cfg).ns("api")
				if ns.road != nil {
					neverStall(ns.road.hits)
				}
				nodes = append(nodes, ns)
			}
			ctx := context.Background()

			// The keys, by whether the master to kill serves them.
			dead := cl.Masters(t)[0]
			cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs})
			defer cc.Close()
			var onDead, onLive []string
			for i := 0; len(onDead) < 10 || len(onLive) < 10; i++ {
				key := "client-" + strconv.Itoa(i)
				m, err := cc.MasterForKey(ctx, "rl:{"+strconv.Itoa(nodes[0].health.partOf(key))+"}:")
				if err != nil {
					t.Fatal(err)
				}
				if m.Options().Addr == dead.Addr {
					onDead = append(onDead, key)
				} else {
					onLive = append(onLive, key)
				}
			}
			onDead, onLive = onDead[:10], onLive[:10]
			limits := []Limit{{Size: time.Hour, Max: 1e6}}
			hitAll := func(keys []string) {
				out := make([]window.Sample, 1)
				for _, ns := range nodes {
					for _, k := range keys {
						ns.Hit(ctx, k, limits, 1, false, false, out)
					}
				}
			}
			hitAll(append(onLive[:1:1], onDead[:1]...)) // every node connected
			poll.Until(t, 10*time.Second, "the first hits to reach the store", func() bool {
				return s.total(t, onLive[0], time.Hour) == 2 && s.total(t, onDead[0], time.Hour) == 2
			})

			dead.Kill()
			hitAll(onDead) // finds the master dead
			hitAll(onLive)
			poll.Until(t, 10*time.Second, "the dead master's parts to be down on every node, and only they", func() bool {
				for _, ns := range nodes {
					if ns.health.down() || !ns.health.downFor(onDead[0]) || ns.health.downFor(onLive[0]) {
						return false
					}
				}
				return true
			})
			// The live masters' keys sync: in the store, and each node
			// sees the other's hits.
			poll.Until(t, 10*time.Second, "the live masters' keys to sync on every node", func() bool {
				for _, k := range onLive {
					want := 2.0
					if k == onLive[0] {
						want = 4 // and 2 before the kill
					}
					if s.total(t, k, time.Hour) != want {
						return false
					}
					for _, ns := range nodes {
						if syncRate != "0" && ns.counters.Read(k, time.Hour).Current != want {
							return false
						}
					}
				}
				return true
			})
			// More hits of the live keys reach the store while the dead
			// master stays dead.
			hitAll(onLive)
			poll.Until(t, 10*time.Second, "more hits of the live keys to sync", func() bool {
				return s.total(t, onLive[1], time.Hour) == 4
			})
			for _, ns := range nodes {
				if ns.health.down() {
					t.Fatal("a node holds the whole store down")
				}
			}
			// A node that holds the whole store down (here, synchronous
			// hits that waited too long) pings every master, and syncs
			// again with the live ones while the dead one stays dead.
			nodes[0].health.stalled()
			poll.Until(t, 10*time.Second, "a node that held the whole store down to hold only the dead master's parts down", func() bool {
				h := nodes[0].health
				return !h.down() && h.downFor(onDead[0]) && !h.downFor(onLive[0])
			})
			hitAll(onLive)
			poll.Until(t, 10*time.Second, "the live keys to sync after the stall", func() bool {
				return s.total(t, onLive[1], time.Hour) == 6
			})

			dead.Restart() // empty: the dead keys' hits since the kill are the nodes'
			reader := s.open(t)
			poll.Until(t, 30*time.Second, "the dead master's keys to sync again, each hit once", func() bool {
				counts, err := reader.GetCounters(ctx, "api", onDead, []time.Duration{time.Hour}, time.Now())
				total := 0.0
				for _, c := range counts {
					total += c.Value
				}
				if err != nil || total != 2*float64(len(onDead)) {
					return false
				}
				for _, ns := range nodes {
					if ns.health.partsDown() > 0 {
						return false
					}
				}
				return true
			})
			for _, k := range onDead {
				if v := s.total(t, k, time.Hour); v != 2 {
					t.Errorf("key %q: the store counts %v, want the 2 hits since the kill", k, v)
				}
			}
		})
	}
}
