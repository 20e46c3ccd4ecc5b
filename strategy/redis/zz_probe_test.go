package redis

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// TestProbeIr runs batches against PROBE_ADDR (a redis-server under
// callgrind, pid PROBE_PID) and dumps callgrind's counts around them.
func TestProbeIr(t *testing.T) {
	addr := os.Getenv("PROBE_ADDR")
	if addr == "" {
		t.Skip()
	}
	pid := os.Getenv("PROBE_PID")
	s := open(t, &Redis{Addresses: []string{addr}, ReadTimeout: caddy.Duration(300 * time.Second)})
	keys, _ := strconv.Atoi(os.Getenv("PROBE_KEYS"))
	size, _ := strconv.Atoi(os.Getenv("PROBE_SIZE"))
	iters, _ := strconv.Atoi(os.Getenv("PROBE_N"))
	limit := 1e15
	if v := os.Getenv("PROBE_LIMIT"); v != "" {
		limit, _ = strconv.ParseFloat(v, 64)
	}
	ctx := context.Background()
	now := time.Now().UnixNano()
	var windows []strategy.WindowHit
	for _, w := range []time.Duration{time.Minute, time.Hour} {
		windows = append(windows, strategy.WindowHit{Size: w, Start: window.Start(now, w), Value: 1, Max: limit, Weight: 0.5})
	}
	hits := make([]strategy.HitRequest, size)
	results := make([]strategy.HitResult, size)
	next := 0
	ns := fmt.Sprint("probe-", keys, "-", size, "-", os.Getenv("PROBE_TAG"))
	ignore := false
	batch := func(id string) {
		for i := range hits {
			hits[i] = strategy.HitRequest{Key: fmt.Sprint("203.0.113.", next%keys), Windows: windows}
			next++
		}
		s.HitBatch(ctx, ns, id, hits, results)
		for i := range results {
			if results[i].Err != nil && !ignore {
				t.Fatal(results[i].Err)
			}
		}
	}
	for i := range max(1, 2*keys/size) {
		batch(fmt.Sprint("warm-", i))
	}
	cg := func(arg string) {
		if out, err := exec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
			t.Fatal(string(out), err)
		}
	}
	if cut := os.Getenv("PROBE_CUT"); cut != "" {
		ignore = true
		src := batchSource
		if cut != "full" {
			i := strings.Index(src, cut)
			if i < 0 {
				t.Fatalf("no %q", cut)
			}
			src = src[:i] + "\nreturn {0}\n"
		}
		batchScript = goredis.NewScript(src)
		if err := batchScript.Load(ctx, s.client).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cg("-z")
	for i := range iters {
		batch(fmt.Sprint(ns, "-", i))
	}
	cg("-d")
}

var probeMin = goredis.NewScript(`
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return 0 end
local r = {}
for i = 2, #KEYS do
	r[i-1] = redis.call('INCRBYFLOAT', KEYS[i], ARGV[i])
end
return r
`)

func TestProbeMin(t *testing.T) {
	addr := os.Getenv("PROBE_ADDR")
	if addr == "" {
		t.Skip()
	}
	pid := os.Getenv("PROBE_PID")
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	ctx := context.Background()
	iters, _ := strconv.Atoi(os.Getenv("PROBE_N"))
	kind := os.Getenv("PROBE_KIND")
	batch := func(n int) {
		marker := fmt.Sprint("{0}m", kind, n)
		var cur []string
		for k := range 10 {
			key := (n*10 + k) % 32
			for w := range 2 {
				cur = append(cur, fmt.Sprintf("{0}c:%d:%d:ns:203.0.113.%d", w, 1, key))
			}
		}
		if kind == "multi" {
			if _, err := c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
				p.SetNX(ctx, marker, 1, time.Minute)
				for _, k := range cur {
					p.IncrByFloat(ctx, k, 1)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			return
		}
		ks := append([]string{marker}, cur...)
		args := []any{60000}
		for range cur {
			args = append(args, "1")
		}
		if err := probeMin.Run(ctx, c, ks, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		batch(-i - 1)
	}
	cg := func(arg string) {
		if out, err := exec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
			t.Fatal(string(out), err)
		}
	}
	cg("-z")
	for i := range iters {
		batch(i)
	}
	cg("-d")
}
