package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/internal/poll"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// bigBatch returns a batch of n diffs of distinct keys in one window, with
// values that differ by key.
func bigBatch(ns string, n int, size time.Duration, start int64) strategy.Batch {
	diffs := make([]window.Diff, n)
	for i := range diffs {
		diffs[i] = window.Diff{Key: fmt.Sprintf("key-%d", i), Size: size, Start: start, Value: float64(i%5) + 1}
	}
	return strategy.Batch{ID: newID(), Namespace: ns, Diffs: diffs}
}

// stored reads every counter of a batch with a plain client: how many the
// store holds, and whether each holds exactly its diff's value.
func stored(t *testing.T, c *goredis.Client, r *Store, b strategy.Batch) (present int, wrong []string) {
	t.Helper()
	ctx := testCtx(t)
	pipe := c.Pipeline()
	cmds := make([]*goredis.StringCmd, len(b.Diffs))
	for i, d := range b.Diffs {
		cmds[i] = pipe.Get(ctx, counterKeyOf(r, b.Namespace, d.Key, d.Size, d.Start))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatalf("reading counters: %v", err)
	}
	for i, cmd := range cmds {
		v, err := cmd.Float64()
		if errors.Is(err, goredis.Nil) {
			continue
		}
		if err != nil {
			t.Fatalf("reading counter %d: %v", i, err)
		}
		present++
		if v != b.Diffs[i].Value {
			wrong = append(wrong, fmt.Sprintf("%s=%v (want %v)", b.Diffs[i].Key, v, b.Diffs[i].Value))
		}
	}
	return present, wrong
}

// warmUp opens a connection for pipelines and one for single commands
// (go-redis pools them apart) and loads the push script, so that the next
// push is written at once.
func warmUp(t *testing.T, r *Store, size time.Duration, start int64) {
	t.Helper()
	if err := r.PushDiffs(testCtx(t), strategy.Batch{ID: newID(), Namespace: "warm-up", Diffs: []window.Diff{
		{Key: "k", Size: size, Start: start, Value: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := r.client.Ping(testCtx(t)).Err(); err != nil {
		t.Fatal(err)
	}
}

// killHook kills a server once the first pipeline of a push completed.
type killHook struct {
	once sync.Once
	kill func()
}

func (h *killHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *killHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *killHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		h.once.Do(h.kill)
		return err
	}
}

// A server killed in the middle of a push: the push fails, and once the
// server is back, the same batch again applies what is missing and
// nothing twice. The server keeps an append-only file, synced on every
// write, so what the first attempt applied survives the kill.
func TestPushServerKilledMidway(t *testing.T) {
	srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	c := srv.Client("")
	r := open(t, &Redis{
		Addresses:   []string{srv.Addr},
		DialTimeout: caddy.Duration(500 * time.Millisecond),
		ReadTimeout: caddy.Duration(5 * time.Second),
	})
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	warmUp(t, r, size, start)
	r.client.AddHook(&killHook{kill: srv.Kill})
	batch := bigBatch("killed", 5000, size, start) // five pipelines

	err := r.PushDiffs(testCtx(t), batch)
	if err == nil {
		t.Fatal("a push to a server killed midway succeeded")
	}
	if !strings.Contains(err.Error(), `namespace "killed"`) {
		t.Errorf("err = %q, want it to name the namespace", err)
	}
	t.Logf("push to a killed server: %v", err)

	srv.Restart()
	present, wrong := stored(t, c, r, batch)
	if present == 0 || present == len(batch.Diffs) {
		t.Fatalf("after the kill the store holds %d of %d counters, want part of them", present, len(batch.Diffs))
	}
	if len(wrong) > 0 {
		t.Fatalf("counters with wrong values before the retry: %v", wrong[:min(5, len(wrong))])
	}
	t.Logf("the first attempt applied %d of %d diffs before the kill", present, len(batch.Diffs))
	if err := r.PushDiffs(testCtx(t), batch); err != nil {
		t.Fatalf("retrying the batch: %v", err)
	}
	present, wrong = stored(t, c, r, batch)
	if present != len(batch.Diffs) || len(wrong) > 0 {
		t.Fatalf("after the retry: %d of %d counters, wrong: %v", present, len(batch.Diffs), wrong[:min(5, len(wrong))])
	}
}

// A server killed before a push, and restarted empty: the push fails, the
// retry applies the batch once.
func TestPushServerDown(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client("")
	r := open(t, &Redis{Addresses: []string{srv.Addr}, DialTimeout: caddy.Duration(500 * time.Millisecond)})
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	batch := bigBatch("down", 2000, size, start)
	if _, _, err := hitOne(testCtx(t), r, "down", "warm", size, start, 1); err != nil {
		t.Fatal(err) // a pooled connection that will break
	}
	srv.Kill()
	if err := r.PushDiffs(testCtx(t), batch); err == nil {
		t.Fatal("a push to a dead server succeeded")
	}
	if _, err := r.GetCounters(testCtx(t), "down", []string{"key-1"}, []time.Duration{size}, time.Now()); err == nil {
		t.Error("a fetch from a dead server succeeded")
	}
	if _, _, err := hitOne(testCtx(t), r, "down", "key-1", size, start, 1); err == nil {
		t.Error("a hit on a dead server succeeded")
	}
	srv.Restart()
	if err := r.PushDiffs(testCtx(t), batch); err != nil {
		t.Fatalf("retrying the batch: %v", err)
	}
	if present, wrong := stored(t, c, r, batch); present != len(batch.Diffs) || len(wrong) > 0 {
		t.Fatalf("after the retry: %d of %d counters, wrong: %v", present, len(batch.Diffs), wrong[:min(5, len(wrong))])
	}
}

// The reply of a push is lost: the server applied it but the client timed
// out. The retry must not apply it again.
func TestPushReplyLost(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client("")
	r := open(t, &Redis{
		Addresses:   []string{srv.Addr},
		ReadTimeout: caddy.Duration(time.Second),
	})
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	batch := bigBatch("lost", 100, size, start)
	warmUp(t, r, size, start) // so the push is written at once, not dialed

	srv.Pause()
	err := r.PushDiffs(testCtx(t), batch)
	srv.Resume()
	if err == nil {
		t.Fatal("a push to a frozen server succeeded")
	}
	// The server reads the push it was sent while frozen, and applies it.
	var present int
	if !poll.For(20*time.Second, func() bool {
		var wrong []string
		present, wrong = stored(t, c, r, batch)
		if len(wrong) > 0 {
			t.Fatalf("counters with wrong values: %v", wrong[:min(5, len(wrong))])
		}
		return present == len(batch.Diffs)
	}) {
		t.Fatalf("the frozen server applied %d of %d diffs after it resumed", present, len(batch.Diffs))
	}
	if err := r.PushDiffs(testCtx(t), batch); err != nil {
		t.Fatalf("retrying the batch: %v", err)
	}
	if present, wrong := stored(t, c, r, batch); present != len(batch.Diffs) || len(wrong) > 0 {
		t.Fatalf("the retry applied the batch again: %d of %d counters, wrong: %v", present, len(batch.Diffs), wrong[:min(5, len(wrong))])
	}
}

func TestPushSameBatchTwice(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	for _, n := range []int{1, 300, 2500} { // one script; a split bucket; several pipelines
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			batch := bigBatch(fmt.Sprintf("twice-%d", n), n, size, start)
			if n == 300 {
				// Put every diff in one bucket, so that it takes two script
				// runs, and push the retry in another order.
				batch.Diffs = batch.Diffs[:0]
				for i := 0; len(batch.Diffs) < n; i++ {
					if k := fmt.Sprint("k", i); bucketOf(batch.Namespace, k) == 0 {
						batch.Diffs = append(batch.Diffs, window.Diff{Key: k, Size: size, Start: start, Value: 1})
					}
				}
			}
			for attempt := range 3 {
				if err := r.PushDiffs(ctx, batch); err != nil {
					t.Fatalf("attempt %d: %v", attempt, err)
				}
				if n == 300 {
					batch.Diffs = append([]window.Diff(nil), batch.Diffs...)
					for i, j := 0, len(batch.Diffs)-1; i < j; i, j = i+1, j-1 {
						batch.Diffs[i], batch.Diffs[j] = batch.Diffs[j], batch.Diffs[i]
					}
				}
			}
			if present, wrong := stored(t, c, r, batch); present != n || len(wrong) > 0 {
				t.Fatalf("%d of %d counters, wrong: %v", present, n, wrong[:min(5, len(wrong))])
			}
			// A new batch with the same diffs counts again.
			batch.ID = newID()
			if err := r.PushDiffs(ctx, batch); err != nil {
				t.Fatal(err)
			}
			_, wrong := stored(t, c, r, batch)
			if len(wrong) != n {
				t.Errorf("a new batch changed %d of %d counters, want all", len(wrong), n)
			}
		})
	}
}

// A server that lost its scripts (restarted, SCRIPT FLUSH) gets them again.
func TestScriptsReloaded(t *testing.T) {
	srv, r := startStandalone(t)
	c := srv.Client("")
	ctx := testCtx(t)
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	for i := range 3 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := r.PushDiffs(ctx, strategy.Batch{ID: newID(), Namespace: "s", Diffs: []window.Diff{
			{Key: "k", Size: size, Start: start, Value: 1},
		}}); err != nil {
			t.Fatalf("push %d after SCRIPT FLUSH: %v", i, err)
		}
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		cur, _, err := hitOne(ctx, r, "s", "k", size, start, 1)
		if err != nil {
			t.Fatalf("hit %d after SCRIPT FLUSH: %v", i, err)
		}
		if want := float64(2 * (i + 1)); cur != want {
			t.Errorf("count after round %d = %v, want %v", i, cur, want)
		}
	}
}

// A hit that surely never reached Redis says so (ErrNotSent); one that may
// have reached it does not.
func TestHitNotSent(t *testing.T) {
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	windows := []strategy.WindowHit{
		{Size: time.Minute, Start: window.Start(steadyNow().UnixNano(), time.Minute), Value: 1, Max: 100},
		{Size: size, Start: start, Value: 1, Max: 1000},
	}

	t.Run("killed server", func(t *testing.T) {
		srv := redistest.Start(t)
		r := open(t, &Redis{Addresses: []string{srv.Addr}, DialTimeout: caddy.Duration(500 * time.Millisecond)})
		if _, _, err := r.Hit(testCtx(t), "ns", "k", "", windows, false); err != nil {
			t.Fatal(err) // a pooled connection that the kill breaks
		}
		srv.Kill()
		_, rejected, err := r.Hit(testCtx(t), "ns", "k", "", windows, false)
		var op *net.OpError
		if !errors.Is(err, strategy.ErrNotSent) || !errors.As(err, &op) || op.Op != "dial" {
			t.Fatalf("Hit on a killed server: err = %v, want ErrNotSent wrapping a dial error", err)
		}
		if rejected != -1 {
			t.Errorf("rejected = %d, want -1", rejected)
		}
		t.Logf("hit on a killed server: %v", err)
		if _, err := r.GetWindow(testCtx(t), "ns", "k", size, start); !errors.Is(err, strategy.ErrNotSent) {
			t.Errorf("GetWindow on a killed server: err = %v, want ErrNotSent", err)
		}
		if _, err := r.GetCounters(testCtx(t), "ns", []string{"k"}, []time.Duration{size}, time.Now()); !errors.Is(err, strategy.ErrNotSent) {
			t.Errorf("GetCounters on a killed server: err = %v, want ErrNotSent", err)
		}
	})

	t.Run("paused server", func(t *testing.T) {
		srv := redistest.Start(t)
		r := open(t, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(5 * time.Second)})
		if _, _, err := r.Hit(testCtx(t), "ns", "k", "", windows, false); err != nil {
			t.Fatal(err) // so the next hit is written at once, not dialed
		}
		srv.Pause()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // the server is paused: it times out
		_, _, err := r.Hit(ctx, "ns", "k", "", windows, false)
		cancel()
		srv.Resume()
		if err == nil || errors.Is(err, strategy.ErrNotSent) {
			t.Fatalf("Hit on a paused server: err = %v, want an error without ErrNotSent", err)
		}
		t.Logf("hit on a paused server: %v", err)
		// Rightly so: the server applies the hit once it runs again.
		waitForWindow(t, r, "ns", "k", size, start, 2)
	})

	t.Run("closed store", func(t *testing.T) {
		_, r := startStandalone(t)
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		_, _, err := r.Hit(testCtx(t), "ns", "k", "", windows, false)
		if !errors.Is(err, strategy.ErrNotSent) || !errors.Is(err, goredis.ErrClosed) {
			t.Fatalf("Hit on a closed store: err = %v, want ErrNotSent and ErrClosed", err)
		}
	})
}

// A hit with an ID sent to a paused server fails without ErrNotSent; the
// caller pushes its diffs as a batch of the hit's ID once the server runs
// again. The server runs both, the hit it was sent while paused and the
// batch, in either order, and the hit counts once.
func TestHitIDPausedServerThenBatch(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client("")
	r := open(t, &Redis{Addresses: []string{srv.Addr}, ReadTimeout: caddy.Duration(5 * time.Second)})
	windows := []strategy.WindowHit{
		{Size: time.Minute, Start: window.Start(steadyNow().UnixNano(), time.Minute), Value: 1, Max: 100},
		{Size: time.Hour, Start: window.Start(steadyNow().UnixNano(), time.Hour), Value: 1, Max: 1000},
	}
	// Load both scripts and open a connection, so that the hit is written
	// at once and each call is one EVALSHA.
	if _, _, err := r.Hit(testCtx(t), "paused", "warm", newID(), windows, false); err != nil {
		t.Fatal(err)
	}
	warmUp(t, r, time.Hour, windows[1].Start)
	if err := c.Ping(testCtx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	resetStats(t, c)

	id := newID()
	srv.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // the server is paused: it times out
	_, _, err := r.Hit(ctx, "paused", "k", id, windows, false)
	cancel()
	srv.Resume()
	if err == nil || errors.Is(err, strategy.ErrNotSent) {
		t.Fatalf("Hit on a paused server: err = %v, want an error without ErrNotSent", err)
	}
	t.Logf("hit on a paused server: %v", err)
	if err := r.PushDiffs(testCtx(t), strategy.Batch{ID: id, Namespace: "paused", Diffs: hitDiffs("k", windows)}); err != nil {
		t.Fatalf("pushing the hit as a batch: %v", err)
	}
	// Wait until the server ran both the hit and the batch.
	if !poll.For(20*time.Second, func() bool { return serverCalls(t, c)["evalsha"] >= 2 }) {
		t.Fatalf("the server ran %v, want the hit's and the batch's EVALSHA", serverCalls(t, c))
	}
	checkWindows(t, r, "paused", "k", windows, 1, 1)
	if calls := serverCalls(t, c); calls["evalsha"] != 2 {
		t.Errorf("the server ran %v, want 2 EVALSHA", calls)
	}
	// Both checked and set the same marker, whichever ran first.
	if got, want := keysOf(t, c, "*:push:*"+id), []string{r.dedupeKey(bucketOf("paused", "k"), 0, id)}; !slices.Equal(got, want) {
		t.Errorf("markers of the hit's ID: %q, want %q", got, want)
	}
}

// waitForWindow waits until a window holds want.
func waitForWindow(t *testing.T, r *Store, ns, key string, size time.Duration, start int64, want float64) {
	t.Helper()
	poll.Until(t, 20*time.Second, fmt.Sprintf("the window to hold %v", want), func() bool {
		v, err := r.GetWindow(testCtx(t), ns, key, size, start)
		return err == nil && v == want
	})
}

// replyDropper is a TCP proxy in front of a Redis server that, once armed,
// passes the next request to the server, waits for its reply and closes
// the client's connection instead of passing the reply on: the request is
// applied and its reply lost, as when a connection breaks at the wrong
// moment.
type replyDropper struct {
	addr  string
	armed chan struct{} // holds a token while armed
}

func newReplyDropper(t *testing.T, server string) *replyDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &replyDropper{addr: ln.Addr().String(), armed: make(chan struct{}, 1)}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(client, server)
		}
	}()
	return p
}

func (p *replyDropper) arm() { p.armed <- struct{}{} }

func (p *replyDropper) serve(client net.Conn, server string) {
	defer client.Close()
	srv, err := net.Dial("tcp", server)
	if err != nil {
		return
	}
	defer srv.Close()
	go func() { _, _ = io.Copy(client, srv) }()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-p.armed:
			// Stop relaying replies: a second connection to the server
			// takes the reply, so that the first does not pass it on.
			srv.Close()
			s2, err := net.Dial("tcp", server)
			if err != nil {
				return
			}
			defer s2.Close()
			if _, err := s2.Write(buf[:n]); err != nil {
				return
			}
			_ = s2.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, _ = s2.Read(buf) // the request was applied
			return              // and the client's connection closes
		default:
		}
		if _, err := srv.Write(buf[:n]); err != nil {
			return
		}
	}
}

// A hit whose reply is lost after Redis applied it is not sent again: it
// counts once. (go-redis resends other commands after an EOF, which would
// count it twice.)
func TestHitReplyLostCountsOnce(t *testing.T) {
	srv := redistest.Start(t)
	p := newReplyDropper(t, srv.Addr)
	r := open(t, &Redis{Addresses: []string{p.addr}, ReadTimeout: caddy.Duration(5 * time.Second)})
	size := time.Hour
	start := window.Start(steadyNow().UnixNano(), size)
	windows := []strategy.WindowHit{{Size: size, Start: start, Value: 1, Max: math.Inf(1)}}
	ctx := testCtx(t)
	if _, _, err := r.Hit(ctx, "lost", "k", "", windows, false); err != nil {
		t.Fatal(err) // a pooled connection, and the script cached
	}
	p.arm()
	_, _, err := r.Hit(ctx, "lost", "k", "", windows, false)
	if err == nil {
		t.Fatal("a hit whose reply was lost succeeded")
	}
	if errors.Is(err, strategy.ErrNotSent) {
		t.Errorf("err = %v, which says the applied hit was not sent", err)
	}
	t.Logf("hit whose reply was lost: %v", err)
	if v, err := r.GetWindow(ctx, "lost", "k", size, start); err != nil || v != 2 {
		t.Errorf("the window holds %v, %v; want 2: the lost hit counts once", v, err)
	}
}
