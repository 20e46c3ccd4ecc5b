package redis

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// minReloadInterval is the least time between the starts of two reloads
// of a Cluster's slot map that failures ask for, so that a node that
// stays down costs at most five CLUSTER SLOTS a second per store.
const minReloadInterval = 200 * time.Millisecond

// topology keeps a Cluster client's map of slots to masters fresh after
// connection failures.
//
// go-redis reloads the map on its own when a node answers MOVED or ASK,
// and otherwise once a minute. A master that dies answers nothing: a
// refused dial, an EOF or a timeout reloads nothing, so until the next
// periodic reload every command of the dead master's slots went to its
// address, even after its replica was promoted, and every pipeline that
// held one failed. So every node client gets a hook (nodeHook) that, on a
// connection failure, reloads the map in the background, at most once per
// minReloadInterval; and the store's calls, after a failure, wait for a
// reload and send once more what failed on a node whose slots have moved
// to another master since (see Store.resendable).
type topology struct {
	cc *goredis.ClusterClient
	// timeout bounds a reload in the background.
	timeout time.Duration

	mu sync.Mutex
	// running is closed when the reload in flight ends; nil when none is.
	running chan struct{}
	// started is when the reload in flight, or else the last one, started.
	started time.Time
	// done is when the last reload that ended started.
	done       time.Time
	background bool // a reload in the background is queued or running
	closed     bool // set by close: no more reloads in the background
	wg         sync.WaitGroup
}

// newTopology watches the nodes of cc, which must not have been used yet:
// only node clients made after it get the hook.
func newTopology(cc *goredis.ClusterClient, timeout time.Duration) *topology {
	t := &topology{cc: cc, timeout: timeout}
	cc.OnNewNode(func(c *goredis.Client) {
		c.AddHook(nodeHook{t: t, addr: c.Options().Addr})
	})
	return t
}

// refresh makes sure that the slot map was reloaded after since, the time
// a failure was seen, unless one was started less than minReloadInterval
// ago: it waits for the reload in flight, or runs one. It returns false
// when no reload started after since ended (the interval, a cancelled
// ctx); the map may still be newer than the failure.
func (t *topology) refresh(ctx context.Context, since time.Time) bool {
	for {
		t.mu.Lock()
		if t.done.After(since) {
			t.mu.Unlock()
			return true
		}
		if ch := t.running; ch != nil {
			t.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return false
			}
		}
		now := time.Now()
		if t.closed || now.Sub(t.started) < minReloadInterval {
			t.mu.Unlock()
			return false
		}
		ch := make(chan struct{})
		t.running, t.started = ch, now
		t.mu.Unlock()

		// ForEachMaster reloads the map before it calls fn on each
		// master (falling back to the map it has if no node answers); it
		// is the only way go-redis offers to reload it and wait for the
		// result, where ReloadState reloads it in the background.
		_ = t.cc.ForEachMaster(ctx, func(context.Context, *goredis.Client) error { return nil })

		t.mu.Lock()
		t.running, t.done = nil, now
		t.mu.Unlock()
		close(ch)
		return true
	}
}

// refreshSoon reloads the slot map in the background, unless a reload in
// the background is queued already.
func (t *topology) refreshSoon() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.background || t.closed {
		return
	}
	t.background = true
	t.wg.Add(1)
	since := time.Now()
	go func() {
		defer t.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), t.timeout)
		defer cancel()
		t.refresh(ctx, since)
		t.mu.Lock()
		t.background = false
		t.mu.Unlock()
	}()
}

// close stops reloads in the background and waits for the one running.
func (t *topology) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

// masterOf returns the address of the master that the map gives key's
// slot to, or "" if it has none.
func (t *topology) masterOf(ctx context.Context, key string) string {
	c, err := t.cc.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// connFailure reports whether err is a failure of the connection to a
// node (a refused or timed-out dial, an EOF, a reset, an i/o timeout),
// rather than an error that Redis replied, a cancelled call or a closed
// client.
func connFailure(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// failedNodes are the addresses of the nodes whose connections failed
// during one call of the store.
type failedNodes struct {
	mu    sync.Mutex
	addrs []string
}

func (f *failedNodes) add(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.addrs, addr) {
		f.addrs = append(f.addrs, addr)
	}
}

func (f *failedNodes) has(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.addrs, addr)
}

// failedNodesKey is the context key of a call's failedNodes.
type failedNodesKey struct{}

// nodeHook is the hook of every node client of a Cluster store: it
// records a connection failure in the call's failedNodes, if the context
// holds one, and has the slot map reloaded.
type nodeHook struct {
	t    *topology
	addr string
}

func (h nodeHook) failed(ctx context.Context, name string, err error) {
	// A reload's own CLUSTER SLOTS asks for no other reload.
	if !connFailure(err) || name == "cluster" {
		return
	}
	if f, ok := ctx.Value(failedNodesKey{}).(*failedNodes); ok {
		f.add(h.addr)
	}
	h.t.refreshSoon()
}

// DialHook leaves dialing as it is: a failed dial reaches ProcessHook and
// ProcessPipelineHook as their error.
func (h nodeHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

// ProcessHook watches the commands sent alone.
func (h nodeHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		h.failed(ctx, cmd.Name(), err)
		return err
	}
}

// ProcessPipelineHook watches the pipelines, of which a Cluster client
// sends one per node.
func (h nodeHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		h.failed(ctx, "", err)
		return err
	}
}

// watch returns ctx with a record of the nodes that fail during a call,
// on a Cluster; elsewhere it returns ctx and nil.
func (s *Store) watch(ctx context.Context) (context.Context, *failedNodes) {
	if s.topo == nil {
		return ctx, nil
	}
	f := new(failedNodes)
	return context.WithValue(ctx, failedNodesKey{}, f), f
}

// resendable returns, on a Cluster, which of the commands of a failed call
// may be sent again: those that failed on a connection failure, and whose
// slot the map, reloaded since the failure, gives to a master that did not
// fail during the call, such as a replica promoted after its master died.
// keyOf(i) is a key of command i. It returns nothing when failed is nil
// (not a Cluster) or the map still gives every failed command to a node
// that failed, so that a node that stays down is not tried twice per call.
func (s *Store) resendable(ctx context.Context, failed *failedNodes, cmds []goredis.Cmder, keyOf func(i int) string) []int {
	if failed == nil {
		return nil
	}
	var failing []int
	for i, cmd := range cmds {
		if connFailure(cmd.Err()) {
			failing = append(failing, i)
		}
	}
	if len(failing) == 0 {
		return nil
	}
	s.topo.refresh(ctx, time.Now())
	var again []int
	for _, i := range failing {
		if addr := s.topo.masterOf(ctx, keyOf(i)); addr != "" && !failed.has(addr) {
			again = append(again, i)
		}
	}
	return again
}

// sendAgain sends once more, in one pipeline, the commands of a failed
// pipeline that resendable picks, each remade by remake (a new command of
// the same arguments, which takes its place in cmds), on a Cluster. It
// returns the first error of a command that did not succeed in the end.
// The commands must be harmless to apply twice.
func (s *Store) sendAgain(ctx context.Context, failed *failedNodes, cmds []goredis.Cmder, remake func(i int) goredis.Cmder) error {
	again := s.resendable(ctx, failed, cmds, func(i int) string {
		key, _ := cmds[i].Args()[1].(string)
		return key
	})
	if len(again) > 0 {
		pipe := s.client.Pipeline()
		for _, i := range again {
			cmds[i] = remake(i)
			_ = pipe.Process(ctx, cmds[i])
		}
		_, _ = pipe.Exec(ctx)
	}
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return err
		}
	}
	return nil
}
