package accuracy

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// Settings of the quick test: 3 nodes, a limit of 200 per second and 3
// windows per row.
const (
	quickNodes    = 3
	quickLimit    = 200
	quickDuration = 3 * time.Second
)

// quickSlack is the allowance of the quick test's periodic rows beyond
// (N−1)·rate·interval, in hits: one more interval of the other nodes'
// hits. Sync runs are aligned across nodes and fetch a beat after they
// push, so the others' hits stay unseen for an interval and a beat, and
// for one more interval when a push is later than the beat, as on a
// loaded machine, which also starts runs late. At the quick test's 2×
// load that is 27 hits, far below the 200 that a fleet which does not
// sync at all would admit too many.
func quickSlack(o Outcome) float64 { return o.Claim.Others }

// supportsSyncAbove reports whether the plugin knows sync_above.
func supportsSyncAbove(t *testing.T, bin string, st Store) bool {
	t.Helper()
	cfg, err := NodeConfig{Listen: "127.0.0.1:1", SyncRate: 100 * time.Millisecond, SyncAbove: 0.8, Strategy: st.Strategy(), Limit: 1, ManyLimit: 1}.JSON()
	if err != nil {
		t.Fatal(err)
	}
	ok, err := ProbeConfig(t.Context(), bin, t.TempDir(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// quickCommandShare is the most of sync_rate 0's Redis commands that
// TestAccuracyQuick lets the sync_above 0.8 row run.
const quickCommandShare = 0.30

// TestAccuracyQuick runs a handful of rows on Redis: 3 nodes, steady load
// at twice the limit's rate, synchronous (the reference for the store's
// commands) and every 100ms with sync_above off and 0.8. It checks what
// holds on a loaded machine: each periodic row's overshoot stays within
// (N−1)·rate·interval plus quickSlack, and with sync_above 0.8 the fleet
// admits at most 1.01 × the limit at no more than quickCommandShare of
// the synchronous row's Redis commands.
func TestAccuracyQuick(t *testing.T) {
	srv := redistest.Start(t)
	bin := caddyproc.TestBinary(t, "ACCURACY_CADDY")
	st := NewRedisStore(srv.Addr)
	defer st.Close()

	rows := []Row{
		{Pattern: Steady2x, Store: "redis", SyncRate: 0},
		{Pattern: Steady2x, Store: "redis", SyncRate: 100 * time.Millisecond},
	}
	above := supportsSyncAbove(t, bin, st)
	if above {
		rows = append(rows, Row{Pattern: Steady2x, Store: "redis", SyncRate: 100 * time.Millisecond, SyncAbove: 0.8})
	} else {
		t.Log("the plugin does not know sync_above yet: its row is left out")
	}
	var progress bytes.Buffer
	r := &Runner{
		Caddy: bin, Dir: t.TempDir(), Nodes: quickNodes, Limit: quickLimit, Duration: quickDuration,
		Stores: map[string]Store{"redis": st}, Progress: &progress, Verbose: true,
	}
	outcomes, err := r.Run(t.Context(), rows)
	t.Logf("rows:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	WriteTables(&table, outcomes, r.Stores)
	t.Logf("\n%s", table.String())

	ref := outcomes[0]
	if ref.Worst != 1 {
		t.Errorf("sync_rate 0: admitted / limit %.3f (%d of %g), want exactly 1", ref.Worst, ref.WorstAdmitted, ref.Limit)
	}
	for _, o := range outcomes[1:] {
		allowed := o.Limit + o.Claim.Allowance + quickSlack(o)
		if float64(o.WorstAdmitted) > allowed {
			t.Errorf("%s: %d admitted in a window, over the limit %g + (N−1)·rate·interval %.1f + slack %.1f (%s)",
				o.Row, o.WorstAdmitted, o.Limit, o.Claim.Others, quickSlack(o), o.WorstDetail)
		}
	}
	// The design: each admission past the limit comes from the other
	// nodes' hits since the last push a node fetched. On a busy machine a
	// fetch may come back a few milliseconds after FetchAllowance and
	// leave the admissions just past it unexplained (a CI run met 2 of 15,
	// at 12 and 14ms after the push); a broken fetch, or one a whole
	// interval late, leaves most of them.
	if o := outcomes[1]; len(o.Unexplained)*3 > o.LagChecked {
		t.Errorf("%s: %d of %d admissions past the limit unexplained by the other nodes' unseen hits, want at most a third; the first: %v",
			o.Row, len(o.Unexplained), o.LagChecked, o.Unexplained[0])
	}
	if !above {
		return
	}
	o := outcomes[2]
	if o.Worst > 1+ExactTolerance {
		t.Errorf("%s: admitted / limit %.3f, want at most %.2f (%s)", o.Row, o.Worst, 1+ExactTolerance, o.WorstDetail)
	}
	// The full harness holds 25 % (docs/accuracy.md). Here a loaded
	// machine batches sync_rate 0's hits more, which lowers its commands
	// (a clean-clone CI under two hogs met 2,591 per 1,000 requests
	// against 3,012 idle) while the sync_above row's stay put (658 in
	// both), so the quick run allows 30 %.
	if share := o.OpsPer1k() / ref.OpsPer1k(); share > quickCommandShare {
		t.Errorf("%s: %.0f Redis commands per 1,000 requests, %.0f %% of sync_rate 0's %.0f: want at most %.0f %%",
			o.Row, o.OpsPer1k(), 100*share, ref.OpsPer1k(), 100*quickCommandShare)
	}
}

// TestAccuracyQuickSpread runs the spread clients' quick subset on Redis
// (SpreadQuickPlan): 6 nodes, eight clients of 5 per minute each sending
// a request every second, round-robin and at random over the nodes, at
// sync_rate 100ms with sync_above off and 0.5. Each client must keep its
// bound (SpreadBound): 5 with sync_above 0.5, and 5 without too, since no
// client sends twice within one interval and a beat: the store's feed of
// keys near their limits (strategy.NearFeed) tells every node.
func TestAccuracyQuickSpread(t *testing.T) {
	srv := redistest.Start(t)
	bin := caddyproc.TestBinary(t, "ACCURACY_CADDY")
	st := NewRedisStore(srv.Addr)
	defer st.Close()

	rows := SpreadQuickPlan("redis", supportsSyncAbove(t, bin, st))
	var progress bytes.Buffer
	r := &SpreadRunner{Caddy: bin, Dir: t.TempDir(), Stores: map[string]Store{"redis": st}, Progress: &progress, Verbose: true}
	outcomes, err := r.Run(t.Context(), rows)
	t.Logf("rows:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	WriteSpreadTables(&table, outcomes, r.Stores)
	t.Logf("\n%s", table.String())

	for _, o := range outcomes {
		if !o.Holds {
			b := o.Breach
			t.Errorf("%s: client %d admitted %d times, over its bound %d (every client: %v, bounds %v)",
				o.Row, b+1, o.Admitted[b], o.Bounds[b], o.Admitted, o.Bounds)
		}
	}
}
