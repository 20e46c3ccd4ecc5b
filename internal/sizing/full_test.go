package sizing

import (
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratesync/caddy-ratelimit/internal/caddyproc"
	"github.com/ratesync/caddy-ratelimit/internal/machine"
	"github.com/ratesync/caddy-ratelimit/internal/pgtest"
	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

// TestSizingFull runs the sizing rows when SIZING_FULL is set:
// scripts/bench-sizing.sh sets it and documents the other settings. It
// prints the table on stdout and, with OUT set, writes it into that page
// between its markers.
func TestSizingFull(t *testing.T) {
	if os.Getenv("SIZING_FULL") == "" {
		t.Skip("the sizing table runs for minutes: SIZING_FULL=1, or scripts/bench-sizing.sh")
	}
	warmup := caddyproc.EnvParsed(t, "SIZING_WARMUP", 4*time.Second, time.ParseDuration)
	measure := caddyproc.EnvParsed(t, "SIZING_MEASURE", 30*time.Second, time.ParseDuration)
	maxRate := caddyproc.EnvParsed(t, "SIZING_MAX_RATE", 1000.0, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) })
	if maxRate <= 0 || maxRate > 2000 || measure < time.Second {
		t.Fatal("want 0 < SIZING_MAX_RATE ≤ 2000 and SIZING_MEASURE ≥ 1s")
	}
	storeNames := strings.Split(caddyproc.Env("SIZING_STORES", "redis,postgres"), ",")
	rows := QuickPlan(storeNames, maxRate)
	if os.Getenv("SIZING_GRID") != "" {
		rows = FullPlan(storeNames, maxRate)
	}
	if f := os.Getenv("SIZING_ROWS"); f != "" {
		re, err := regexp.Compile(f)
		if err != nil {
			t.Fatalf("SIZING_ROWS: %v", err)
		}
		var kept []Row
		for _, r := range rows {
			if re.MatchString(r.ID()) {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	if len(rows) == 0 {
		t.Fatal("no row to run")
	}

	var (
		measured []Measured
		versions []string
		titles   = map[string]string{"redis": "Redis", "postgres": "PostgreSQL"}
		elapsed  time.Duration
	)
	if load := os.Getenv("SIZING_LOAD"); load != "" {
		// Only the report, from rows saved by earlier runs (SIZING_SAVE):
		// the later of two measurements of a row wins.
		byID := map[string]int{}
		for _, path := range strings.Split(load, ",") {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			ms, err := Load(f)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				if i, ok := byID[m.Row.ID()]; ok {
					measured[i] = m
					continue
				}
				byID[m.Row.ID()] = len(measured)
				measured = append(measured, m)
			}
		}
		// In the plan's order, whatever the files'.
		var kept []Measured
		for _, r := range rows {
			if i, ok := byID[r.ID()]; ok {
				kept = append(kept, measured[i])
				elapsed += measured[i].Took
			}
		}
		measured = kept
		versions = []string{"Caddy: " + machine.Version(caddyproc.TestBinary(t, "SIZING_CADDY"), "version")}
		if slices.Contains(storeNames, "redis") {
			versions = append(versions, "Redis: "+machine.Version("redis-server", "--version"))
		}
		if b, err := pgtest.Find(); err == nil && slices.Contains(storeNames, "postgres") {
			versions = append(versions, "PostgreSQL: "+machine.Version(b.Postgres, "--version"))
		}
	} else {
		measured, versions, elapsed = runRows(t, rows, storeNames, warmup, measure, maxRate)
	}
	if len(measured) == 0 {
		t.Fatal("no row measured")
	}
	rep := Report{
		Date:     time.Now().UTC(),
		Machine:  machine.Describe(),
		Command:  caddyproc.Env("SIZING_COMMAND", "SIZING_FULL=1 go test -run TestSizingFull ./internal/sizing"),
		Source:   caddyproc.Env("SIZING_SOURCE", "the working tree"),
		Versions: versions,
		Warmup:   warmup, Measure: measure, MaxRate: maxRate,
		Elapsed:   elapsed,
		Rows:      measured,
		Constants: map[string]Constants{},
		Titles:    titles,
	}
	for _, name := range storeNames {
		var mine []Measured
		for _, m := range measured {
			if m.Row.Store == name {
				mine = append(mine, m)
			}
		}
		if len(mine) > 0 {
			rep.Constants[name] = Fit(mine, Constants{})
		}
	}
	fmt.Fprintf(os.Stderr, "sizing: Go %s\n", runtime.Version())
	fmt.Print(rep.Markdown())
	if out := os.Getenv("OUT"); out != "" {
		if err := rep.WriteDoc(out); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "sizing: wrote the table into %s\n", out)
	}
}

// runRows starts the stores and runs the rows, and returns what it
// measured, the versions of the programs and how long it took. A row that
// fails is left out, and fails the test once the others have run.
func runRows(t *testing.T, rows []Row, storeNames []string, warmup, measure time.Duration, maxRate float64) ([]Measured, []string, time.Duration) {
	bin := caddyproc.TestBinary(t, "SIZING_CADDY")
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
			dsn := srv.CreateDB(t, "sizing")
			st, err := NewPostgresStore(t.Context(), dsn, "sizing", srv.DSN("postgres"), srv.Dir+"/data")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			stores[name] = st
			if b, err := pgtest.Find(); err == nil {
				versions = append(versions, "PostgreSQL: "+machine.Version(b.Postgres, "--version"))
			}
		default:
			t.Fatalf("SIZING_STORES: unknown store %q: want redis and/or postgres", name)
		}
	}
	fmt.Fprintf(os.Stderr, "sizing: %d rows, %v of warm-up and %v measured each, at most %.0f requests a second\n",
		len(rows), warmup, measure, maxRate)
	r := &Runner{Caddy: bin, Dir: t.TempDir(), Warmup: warmup, Measure: measure, Stores: stores, Progress: os.Stderr}
	if path := os.Getenv("SIZING_SAVE"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r.Save = f
	}
	began := time.Now()
	measured, err := r.Run(t.Context(), rows)
	if err != nil {
		t.Error(err)
	}
	return measured, versions, time.Since(began)
}
