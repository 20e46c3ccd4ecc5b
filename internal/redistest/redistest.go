// Package redistest starts real redis-server processes for tests, on free
// loopback ports, and stops them when the test ends. Tests own their
// servers, so they can kill, pause and restart them to test faults.
//
// When redis-server is missing, tests fail under CI (the CI environment
// variable is set) and are skipped elsewhere, so a developer without Redis
// can still run the rest.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/internal/proc"
)

// Require returns the path of redis-server, or ends the test: it fails
// under CI and is skipped elsewhere when they are missing, and is skipped
// in -short mode, the quick run of scripts/test.sh -short.
func Require(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: a quick run starts no redis-server")
	}
	path, err := exec.LookPath("redis-server")
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("redis-server is required in CI and was not found: %v (scripts/test.sh installs it)", err)
	}
	t.Skipf("redis-server not found (%v); scripts/test.sh installs it", err)
	return ""
}

// Server is one redis-server process that a test owns.
type Server struct {
	// Addr is host:port on the loopback interface.
	Addr string
	// Port is the server's TCP port.
	Port int

	t    testing.TB
	bin  string
	dir  string
	conf string // a config file to start with, for a sentinel
	args []string
	bus  bool // a cluster node: port+10000 must be free too

	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
}

// Start starts a redis-server with nothing persisted, plus the given
// arguments (for example "--requirepass", "secret"), and waits until it
// answers. It is killed when the test ends.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	s := &Server{t: t, bin: Require(t), dir: t.TempDir(), args: args}
	s.startOnFreePort()
	return s
}

// errPortTaken reports that another process took the port between the
// check that it was free and the server's bind.
var errPortTaken = errors.New("port taken")

// startOnFreePort starts the server on a free port, trying another one if
// the port is taken meanwhile (another test process may have picked it),
// and kills it when the test ends.
func (s *Server) startOnFreePort() {
	s.t.Helper()
	for attempt := 1; ; attempt++ {
		s.Port = freePort(s.t, s.bus)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		err := s.launch()
		if err == nil {
			s.t.Cleanup(s.Kill)
			return
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			s.t.Fatal(err)
		}
		// A cluster node may have written its port into its config.
		_ = os.Remove(filepath.Join(s.dir, "nodes.conf"))
	}
}

// launch starts redis-server on s.Port and waits until it answers.
func (s *Server) launch() error {
	logfile := filepath.Join(s.dir, "redis.log")
	_ = os.Remove(logfile) // the log tells why this launch failed
	var args []string
	if s.conf != "" {
		args = append(args, s.conf, "--sentinel")
	}
	args = append(args,
		"--port", strconv.Itoa(s.Port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", logfile)
	if s.conf == "" { // a sentinel refuses these
		args = append(args, "--save", "", "--appendonly", "no")
	}
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	proc.SetDeathSignal(cmd) // no redis-server outlives a crashed test
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %v", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			s.cmd = nil
			log, _ := os.ReadFile(logfile)
			if strings.Contains(string(log), "Address already in use") {
				return fmt.Errorf("redis-server on %s: %w", s.Addr, errPortTaken)
			}
			return fmt.Errorf("redis-server on %s exited at start:\n%s", s.Addr, log)
		default:
		}
		conn, err := net.DialTimeout("tcp", s.Addr, 100*time.Millisecond)
		if err == nil {
			conn.Close()
			if listensOn(cmd.Process.Pid, s.Port) {
				return nil
			}
			err = fmt.Errorf("another process listens on %s", s.Addr)
		}
		if time.Now().After(deadline) {
			s.Kill()
			log, _ := os.ReadFile(logfile)
			return fmt.Errorf("redis-server on %s did not start: %v\n%s", s.Addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once with SIGKILL; its data is lost.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT) // a paused server must die too
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts the server again, empty, on the same port. The server
// must have been killed. While the port is briefly taken (a client's
// outgoing connection may hold it as its local port), it tries again.
func (s *Server) Restart() {
	s.t.Helper()
	if s.cmd != nil {
		s.t.Fatal("redistest: Restart of a running server")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.launch()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || time.Now().After(deadline) {
			s.t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Pause freezes the server with SIGSTOP: connections stay open and
// commands hang, as with an overloaded or partitioned server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume undoes Pause.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("redistest: signal to a stopped server")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signalling redis-server: %v", err)
	}
}

// Client returns a plain client for the server, closed when the test ends.
// Pass the password for a server started with --requirepass.
func (s *Server) Client(password string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: password})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Cluster is a Redis Cluster, one process per node.
type Cluster struct {
	// Servers are the cluster's nodes, masters and replicas; Masters
	// tells which are masters.
	Servers []*Server
	// Addrs are their addresses, as a client's seed list.
	Addrs []string

	t    testing.TB
	args []string // every node's redis-server arguments
}

// StartCluster starts a Redis Cluster with the given number of masters
// (at least 3) and no replicas, assigns the slots, and waits until every
// node reports the cluster healthy.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return StartClusterWithReplicas(t, masters, 0)
}

// StartClusterWithReplicas starts a Redis Cluster with the given number of
// masters (at least 3), each with the given number of replicas, and waits
// until every node reports the cluster healthy and every replica's link to
// its master is up. The nodes' timeout is 15 s, so that the cluster itself
// never fails a node over during a test: tests do it with Promote.
func StartClusterWithReplicas(t testing.TB, masters, replicas int) *Cluster {
	t.Helper()
	return StartClusterTimeout(t, masters, replicas, 15*time.Second)
}

// StartClusterTimeout is StartClusterWithReplicas with the nodes'
// cluster-node-timeout: how long a master may not answer before the
// others hold it failed and its replica takes over. args are more
// redis-server arguments of every node (such as
// "--cluster-require-full-coverage", "no").
func StartClusterTimeout(t testing.TB, masters, replicas int, nodeTimeout time.Duration, args ...string) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	bin := Require(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is needed to create a cluster: %v", err)
	}
	c := &Cluster{t: t, args: append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10)}, args...)}
	for range masters * (1 + replicas) {
		c.startNode(bin)
	}
	create := append([]string{"--cluster", "create"}, c.Addrs...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, create...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Servers {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			info, err := rc.ClusterInfo(ctx).Result()
			ready := err == nil && strings.Contains(info, "cluster_state:ok")
			if ready {
				var repl string
				repl, err = rc.Info(ctx, "replication").Result()
				ready = err == nil && (strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
				info += repl
			}
			if ready {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("cluster node %s not ready: %v %s", s.Addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	// Every node must know every replica's master, which gossip spreads.
	for _, s := range c.Servers {
		for {
			nodes, err := s.nodes(ctx)
			var withSlots, replicasKnown int
			for _, n := range nodes {
				if n.master && n.slots > 0 {
					withSlots++
				}
				if !n.master && n.masterID != "-" {
					replicasKnown++
				}
			}
			if err == nil && withSlots == masters && replicasKnown == masters*replicas {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s does not know every master and replica: %v %v", s.Addr, nodes, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// startNode starts one more node with the cluster's arguments.
func (c *Cluster) startNode(bin string) *Server {
	s := &Server{t: c.t, bin: bin, dir: c.t.TempDir(), bus: true, args: c.args}
	s.startOnFreePort()
	c.Servers = append(c.Servers, s)
	c.Addrs = append(c.Addrs, s.Addr)
	return s
}

// AddMaster starts one more node with the cluster's settings, joins it to
// the cluster as a master without slots (redis-cli --cluster add-node),
// and returns once every running node knows it.
func (c *Cluster) AddMaster(t testing.TB) *Server {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redis-cli is needed to add a node: %v", err)
	}
	seed := c.Addrs[0]
	s := c.startNode(Require(t))
	if out, err := exec.Command(cli, "--cluster", "add-node", s.Addr, seed).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster add-node %s %s: %v\n%s", s.Addr, seed, err, out)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for _, o := range c.Servers {
		for o.cmd != nil {
			nodes, err := o.nodes(ctx)
			if err == nil && slices.ContainsFunc(nodes, func(n clusterNode) bool { return n.addr == s.Addr && n.master }) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: %s does not know the new master %s: %v %v", o.Addr, s.Addr, nodes, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return s
}

// Reshard moves n slots, taken from every master, to the master to, while
// the cluster serves (redis-cli --cluster reshard, which migrates their
// keys with MIGRATE), and returns once it is done.
func (c *Cluster) Reshard(ctx context.Context, to *Server, n int) error {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return fmt.Errorf("redis-cli is needed to reshard: %w", err)
	}
	rc := redis.NewClient(&redis.Options{Addr: to.Addr})
	id, err := rc.ClusterMyID(ctx).Result()
	rc.Close()
	if err != nil {
		return fmt.Errorf("CLUSTER MYID on %s: %w", to.Addr, err)
	}
	out, err := exec.CommandContext(ctx, cli, "--cluster", "reshard", to.Addr,
		"--cluster-from", "all", "--cluster-to", id, "--cluster-slots", strconv.Itoa(n), "--cluster-yes").CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster reshard: %w\n%s", err, out)
	}
	return nil
}

// Masters returns the running nodes that are masters holding slots, as
// the first running node sees them.
func (c *Cluster) Masters(t testing.TB) []*Server {
	t.Helper()
	for _, s := range c.Servers {
		if s.cmd == nil {
			continue
		}
		nodes, err := s.nodes(context.Background())
		if err != nil {
			t.Fatalf("redistest: reading the nodes of %s: %v", s.Addr, err)
		}
		var masters []*Server
		for _, n := range nodes {
			if n.master && n.slots > 0 {
				for _, m := range c.Servers {
					if m.Addr == n.addr {
						masters = append(masters, m)
					}
				}
			}
		}
		return masters
	}
	t.Fatal("redistest: no cluster node is running")
	return nil
}

// clusterNode is a line of CLUSTER NODES.
type clusterNode struct {
	id, addr, masterID string
	master             bool
	slots              int // the number of slot fields
}

// nodes returns the cluster's nodes as s sees them.
func (s *Server) nodes(ctx context.Context) ([]clusterNode, error) {
	rc := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rc.Close()
	out, err := rc.ClusterNodes(ctx).Result()
	if err != nil {
		return nil, err
	}
	var nodes []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		// <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot> ...
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		nodes = append(nodes, clusterNode{
			id: f[0], addr: addr, masterID: f[3],
			master: slices.Contains(strings.Split(f[2], ","), "master"),
			slots:  len(f) - 8,
		})
	}
	return nodes, nil
}

// ReplicaOf returns a replica of master, which must be running.
func (c *Cluster) ReplicaOf(t testing.TB, master *Server) *Server {
	t.Helper()
	nodes, err := master.nodes(context.Background())
	if err != nil {
		t.Fatalf("redistest: reading the nodes of %s: %v", master.Addr, err)
	}
	var masterID string
	for _, n := range nodes {
		if n.addr == master.Addr {
			masterID = n.id
		}
	}
	for _, n := range nodes {
		if n.masterID == masterID && !n.master {
			for _, s := range c.Servers {
				if s.Addr == n.addr {
					return s
				}
			}
		}
	}
	t.Fatalf("redistest: %s has no replica", master.Addr)
	return nil
}

// Promote makes replica a master at once, with CLUSTER FAILOVER TAKEOVER,
// which needs neither its master (which may be dead) nor the other
// masters' agreement, and returns once every running node reports it as a
// master holding slots.
func (c *Cluster) Promote(t testing.TB, replica *Server) {
	t.Helper()
	ctx := context.Background()
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rc.Close()
	if err := rc.Do(ctx, "cluster", "failover", "takeover").Err(); err != nil {
		t.Fatalf("redistest: CLUSTER FAILOVER TAKEOVER on %s: %v", replica.Addr, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Servers {
		if s.cmd == nil {
			continue // killed
		}
		for {
			nodes, err := s.nodes(ctx)
			promoted := false
			for _, n := range nodes {
				promoted = promoted || n.addr == replica.Addr && n.master && n.slots > 0
			}
			if promoted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: %s does not see %s promoted: %v %v", s.Addr, replica.Addr, nodes, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// freePort returns a loopback TCP port nobody listens on; with bus, port
// +10000 (a cluster node's bus port) is free too. Ports are picked at
// random below the kernel's ephemeral range, where outgoing connections
// and other processes asking the kernel for a port do not land.
func freePort(t testing.TB, bus bool) int {
	t.Helper()
	lo, hi := 10000, ephemeralStart()
	if bus {
		hi -= 10000
	}
	for range 1000 {
		var port int
		if hi-lo >= 1000 {
			port = lo + rand.IntN(hi-lo)
		} else { // an unusual range: let the kernel choose
			port = listenable(0)
		}
		if port > 0 && listenable(port) > 0 && (!bus || port+10000 <= 65535 && listenable(port+10000) > 0) {
			return port
		}
	}
	t.Fatal("redistest: no free port")
	return 0
}

// FreePort returns a free loopback port, picked as Start picks a server's:
// for a second listener of a server, such as its --tls-port.
func FreePort(t testing.TB) int {
	t.Helper()
	return freePort(t, false)
}

// listenable listens on a loopback port (0: any) and closes it again,
// returning the port, or 0 when it is taken.
func listenable(port int) int {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ephemeralStart returns the first port of the kernel's ephemeral range,
// or Linux's default where it cannot be read.
func ephemeralStart() int {
	var first int
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	if _, err := fmt.Sscan(string(b), &first); err != nil {
		return 32768
	}
	return first
}

// StartSentinel starts a Redis Sentinel that monitors master under the
// given name, deems it down after downAfter without an answer, and waits
// until it reports the master's address. Alone, it is a quorum: it fails
// over to a replica once the master is down.
func StartSentinel(t testing.TB, master *Server, name string, downAfter time.Duration) *Server {
	t.Helper()
	s := &Server{t: t, bin: Require(t), dir: t.TempDir()}
	// Sentinel rewrites its config file, so it must be a file of its own.
	conf := filepath.Join(s.dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s %d\n",
		name, master.Port, name, downAfter.Milliseconds())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s.conf = conf
	s.startOnFreePort()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		addr, err := c.GetMasterAddrByName(context.Background(), name).Result()
		if err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(master.Port) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("sentinel on %s does not know master %s: %v %v", s.Addr, name, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Migration is a slot of a Cluster left half-way through its move to
// another master, as a reshard that broke: the source MIGRATING, the
// target IMPORTING, some of its keys moved.
type Migration struct {
	Slot       int
	Src, Dst   string // addresses
	srcID, dst string
}

// BeginMigration starts moving slot from its master to another master
// (CLUSTER SETSLOT IMPORTING on the target, MIGRATING on the source),
// moves half of the slot's keys (MIGRATE), and leaves it so.
func (c *Cluster) BeginMigration(ctx context.Context, slot int) (*Migration, error) {
	seed := redis.NewClient(&redis.Options{Addr: c.Addrs[0]})
	ranges, err := seed.ClusterSlots(ctx).Result()
	seed.Close()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	m := &Migration{Slot: slot}
	var masters []string
	for _, r := range ranges {
		addr := r.Nodes[0].Addr
		if !slices.Contains(masters, addr) {
			masters = append(masters, addr)
		}
		if slot >= r.Start && slot <= r.End {
			m.Src, m.srcID = addr, r.Nodes[0].ID
		}
	}
	for _, r := range ranges {
		if a := r.Nodes[0].Addr; a != m.Src && m.Dst == "" {
			m.Dst, m.dst = a, r.Nodes[0].ID
		}
	}
	if m.Src == "" || m.Dst == "" {
		return nil, fmt.Errorf("slot %d: no master serves it, or no other master: %v", slot, ranges)
	}
	if err := m.do(ctx, m.Dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.srcID); err != nil {
		return nil, err
	}
	if err := m.do(ctx, m.Src, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.dst); err != nil {
		return nil, err
	}
	keys, err := m.keys(ctx)
	if err != nil {
		return nil, err
	}
	return m, m.move(ctx, keys[:len(keys)/2])
}

// Finish moves the slot's other keys and gives it to the target on every
// master, as redis-cli --cluster fix would.
func (m *Migration) Finish(ctx context.Context) error {
	for {
		keys, err := m.keys(ctx)
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		if err := m.move(ctx, keys); err != nil {
			return err
		}
	}
	seed := redis.NewClient(&redis.Options{Addr: m.Dst})
	ranges, err := seed.ClusterSlots(ctx).Result()
	seed.Close()
	if err != nil {
		return fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	addrs := []string{m.Dst, m.Src}
	for _, r := range ranges {
		if a := r.Nodes[0].Addr; !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	for _, a := range addrs {
		if err := m.do(ctx, a, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.dst); err != nil {
			return err
		}
	}
	return nil
}

// keys returns up to 1,000 keys of the slot left on the source.
func (m *Migration) keys(ctx context.Context) ([]string, error) {
	c := redis.NewClient(&redis.Options{Addr: m.Src})
	defer c.Close()
	keys, err := c.ClusterGetKeysInSlot(ctx, m.Slot, 1000).Result()
	if err != nil {
		return nil, fmt.Errorf("CLUSTER GETKEYSINSLOT %d on %s: %w", m.Slot, m.Src, err)
	}
	return keys, nil
}

// move migrates keys from the source to the target.
func (m *Migration) move(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	host, port, _ := net.SplitHostPort(m.Dst)
	args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	return m.do(ctx, m.Src, args...)
}

// do sends one command to the node at addr.
func (m *Migration) do(ctx context.Context, addr string, args ...any) error {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	if err := c.Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("%v on %s: %w", args[:min(len(args), 4)], addr, err)
	}
	return nil
}
