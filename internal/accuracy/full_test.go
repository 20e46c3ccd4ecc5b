package accuracy

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
	"github.com/ratesync/caddy-ratelimit/internal/machine"
	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// TestAccuracyFull runs the whole table and the spread clients' family
// (SpreadPlan), on Redis and PostgreSQL, when
// ACCURACY_FULL is set: scripts/bench-accuracy.sh sets it and documents
// the other settings. It prints the latest results on stdout as the
// Markdown docs/accuracy.md holds, and with OUT set replaces that part of
// the page (between its markers) and writes the plots next to it.
func TestAccuracyFull(t *testing.T) {
	if os.Getenv("ACCURACY_FULL") == "" {
		t.Skip("the full accuracy table runs for minutes: ACCURACY_FULL=1, or scripts/bench-accuracy.sh")
	}
	nodes := caddyproc.EnvParsed(t, "ACCURACY_NODES", 3, strconv.Atoi)
	limit := caddyproc.EnvParsed(t, "ACCURACY_LIMIT", 200, strconv.Atoi)
	duration := caddyproc.EnvParsed(t, "ACCURACY_DURATION", 3*time.Second, time.ParseDuration)
	if nodes < 2 || limit < 10 || duration < Window || duration%Window != 0 {
		t.Fatalf("want ACCURACY_NODES ≥ 2, ACCURACY_LIMIT ≥ 10 and ACCURACY_DURATION a whole number of %v windows", Window)
	}
	storeNames := strings.Split(caddyproc.Env("ACCURACY_STORES", "redis,postgres"), ",")
	var filter *regexp.Regexp
	if f := os.Getenv("ACCURACY_ROWS"); f != "" {
		var err error
		if filter, err = regexp.Compile(f); err != nil {
			t.Fatalf("ACCURACY_ROWS: %v", err)
		}
	}

	bin := caddyproc.TestBinary(t, "ACCURACY_CADDY")
	stores := map[string]Store{}
	versions := []string{"Caddy: " + machine.Version(bin, "version")}
	for _, name := range storeNames {
		switch name {
		case "redis":
			srv := redistest.Start(t)
			st := NewRedisStore(srv.Addr)
			t.Cleanup(func() { st.Close() })
			stores[name] = st
			versions = append(versions, "Redis: "+machine.Version("redis-server", "--version"))
		case "postgres":
			srv := pgtest.Start(t)
			dsn := srv.CreateDB(t, "accuracy")
			st, err := NewPostgresStore(t.Context(), dsn, "accuracy", srv.DSN("postgres"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			stores[name] = st
			if b, err := pgtest.Find(); err == nil {
				versions = append(versions, "PostgreSQL: "+machine.Version(b.Postgres, "--version"))
			}
		default:
			t.Fatalf("ACCURACY_STORES: unknown store %q: want redis and/or postgres", name)
		}
	}
	above := supportsSyncAbove(t, bin, stores[storeNames[0]])
	if !above {
		t.Log("the plugin does not know sync_above yet: its rows are left out")
	}
	repeat := caddyproc.EnvParsed(t, "ACCURACY_REPEAT", 1, strconv.Atoi)
	var rows []Row
	for _, row := range FullPlan(storeNames, above) {
		if filter == nil || filter.MatchString(row.ID()) {
			for range max(repeat, 1) {
				rows = append(rows, row)
			}
		}
	}
	var spread []SpreadRow
	for _, row := range SpreadPlan(storeNames, above) {
		if filter == nil || filter.MatchString(row.ID()) {
			spread = append(spread, row)
		}
	}
	if len(rows)+len(spread) == 0 {
		t.Fatal("ACCURACY_ROWS matches no row")
	}
	fmt.Fprintf(os.Stderr, "accuracy: %d rows, %d nodes, limit %d per %v, %v of traffic per row; %d spread clients' rows\n",
		len(rows), nodes, limit, Window, duration, len(spread))

	r := &Runner{
		Caddy: bin, Dir: t.TempDir(), Nodes: nodes, Limit: float64(limit), Duration: duration,
		Stores: stores, Progress: os.Stderr, Verbose: os.Getenv("ACCURACY_VERBOSE") != "",
	}
	began := time.Now()
	outcomes, err := r.Run(t.Context(), rows)
	if err != nil {
		t.Fatal(err)
	}
	sr := &SpreadRunner{Caddy: bin, Dir: t.TempDir(), Stores: stores, Progress: os.Stderr, Verbose: r.Verbose}
	spreadOut, err := sr.Run(t.Context(), spread)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(began)

	rep := Report{
		Date:     time.Now().UTC(),
		Machine:  machine.Describe(),
		Command:  caddyproc.Env("ACCURACY_COMMAND", "ACCURACY_FULL=1 go test -run TestAccuracyFull ./internal/accuracy"),
		Source:   caddyproc.Env("ACCURACY_SOURCE", "the working tree"),
		Go:       runtime.Version(),
		Versions: versions,
		Nodes:    nodes,
		Limit:    float64(limit),
		Duration: duration,
		Elapsed:  elapsed,
		Outcomes: outcomes,
		Spread:   spreadOut,
		Stores:   stores,
	}
	md, err := rep.Markdown()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Print(md)
	if out := os.Getenv("OUT"); out != "" {
		if err := rep.WriteDoc(out); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "accuracy: wrote the results into %s and its plots in %s\n", out, filepath.Dir(out))
	}
}
