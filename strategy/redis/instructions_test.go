package redis

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/strategy"
	"github.com/ratesync/caddy-ratelimit/window"
)

// BenchmarkBatchInstructions counts the instructions a redis-server runs
// for batches of synchronous hits (see scripts/redis-instructions.sh,
// which starts the server under callgrind and sets CALLGRIND_REDIS_ADDR,
// CALLGRIND_REDIS_PID and CALLGRIND_REDIS_OUT, its --callgrind-out-file).
// Unlike CPU time, the
// count does not move with the machine's load: the same batches cost the
// same, to a percent, so two versions of the script compare in one run
// of each. Each case sends b.N batches of 10 hits with two limits, of 1,
// 32 or 1,000 keys, far from their limits or over them (a limit of 1), or
// of 12 hits over 32 keys as the speed harness sends them (keys=32/harness),
// after a push that gives each key's previous windows a count of its own
// and warm-up batches that make the current counters and fill the store's
// memory of previous counts; callgrind's counts are zeroed before and
// dumped after, and reported as instructions/hit.
func BenchmarkBatchInstructions(b *testing.B) {
	addr, pid, out := os.Getenv("CALLGRIND_REDIS_ADDR"), os.Getenv("CALLGRIND_REDIS_PID"), os.Getenv("CALLGRIND_REDIS_OUT")
	if addr == "" || pid == "" || out == "" {
		b.Skip("run by scripts/redis-instructions.sh, which starts redis-server under callgrind")
	}
	s := open(b, &Redis{Addresses: []string{addr}, ReadTimeout: caddy.Duration(5 * time.Minute)})
	callgrind := func(arg string) {
		if out, err := exec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
			b.Fatalf("callgrind_control %s: %v: %s", arg, err, out)
		}
	}
	type shape struct {
		name    string
		keys    int
		size    int             // hits a batch
		windows []time.Duration // the two limits' windows
		limit   float64
		ahead   time.Duration // how far ahead of the time the store's clock stands
	}
	var cases []shape
	for _, keys := range []int{1, 32, 1000} {
		cases = append(cases,
			shape{fmt.Sprintf("keys=%d/far", keys), keys, 10, []time.Duration{time.Minute, time.Hour}, 1e15, 0},
			shape{fmt.Sprintf("keys=%d/over", keys), keys, 10, []time.Duration{time.Minute, time.Hour}, 1, 0})
	}
	// The speed harness's synchronous 32-key route: limits of 1s and 1m,
	// and round trips of some 12 hits. The 1s windows' previous counts
	// are read every batch (see prevSettle). The clock stands 10s ahead,
	// so that no current counter expires in Redis while callgrind runs.
	cases = append(cases, shape{"keys=32/harness", 32, 12, []time.Duration{time.Second, time.Minute}, 1e15, 10 * time.Second})
	for _, c := range cases {
		keys, size := c.keys, c.size
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			// The store's clock stands still, so that the previous counts
			// it remembers stay usable however slowly callgrind runs
			// the batches, as they do when hits come as fast as a
			// busy node's: a count read about a second ago is read
			// again, which made the 1,000-key cases two-valued.
			now := time.Now().Add(c.ahead).UnixNano()
			s.now = func() time.Time { return time.Unix(0, now) }
			var windows []strategy.WindowHit
			for _, w := range c.windows {
				windows = append(windows, strategy.WindowHit{Size: w, Start: window.Start(now, w), Value: 1, Max: c.limit, Weight: 0.5})
			}
			ns := fmt.Sprintf("instructions-%s-%d", c.name, now)
			hits, results := make([]strategy.HitRequest, size), make([]strategy.HitResult, size)
			next := 0
			batch := func(id string) {
				for i := range hits {
					hits[i] = strategy.HitRequest{Key: fmt.Sprint("203.0.113.", next%keys), Windows: windows}
					next++
				}
				s.HitBatch(ctx, ns, id, hits, results)
				for i := range results {
					if results[i].Err != nil {
						b.Fatal(results[i].Err)
					}
				}
			}
			// The previous windows hold counts, as steady traffic leaves
			// them: a number for each key.
			var prevs []window.Diff
			for k := range keys {
				for _, w := range windows {
					prevs = append(prevs, window.Diff{Key: fmt.Sprint("203.0.113.", k), Size: w.Size, Start: w.Start - int64(w.Size), Value: float64(1000 + 37*k)})
				}
			}
			if err := s.PushDiffs(ctx, strategy.Batch{ID: ns + "-previous", Namespace: ns, Diffs: prevs}); err != nil {
				b.Fatal(err)
			}
			for i := range max(1, 2*keys/size) {
				batch(fmt.Sprint(ns, "-warm-up-", i))
			}
			callgrind("--zero")
			n := 0
			for b.Loop() {
				batch(fmt.Sprint(ns, "-", n))
				n++
			}
			callgrind("--dump")
			b.ReportMetric(float64(dumped(b, out))/float64(n*size), "instructions/hit")
		})
	}
}

// dumped returns the instructions counted in the newest of callgrind's
// dumps, the files out.1, out.2 and so on.
func dumped(b *testing.B, out string) int64 {
	files, err := filepath.Glob(out + ".*")
	if err != nil || len(files) == 0 {
		b.Fatalf("no callgrind dump %s.*: %v", out, err)
	}
	newest := slices.MaxFunc(files, func(x, y string) int {
		nx, _ := strconv.Atoi(strings.TrimPrefix(x, out+"."))
		ny, _ := strconv.Atoi(strings.TrimPrefix(y, out+"."))
		return cmp.Compare(nx, ny)
	})
	data, err := os.ReadFile(newest)
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if total, ok := strings.CutPrefix(line, "summary: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(total), 10, 64)
			if err != nil {
				b.Fatalf("%s: summary %q: %v", newest, total, err)
			}
			return n
		}
	}
	b.Fatalf("%s holds no summary", newest)
	return 0
}
