package faults

import (
	"cmp"
	"fmt"
	"os"
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

// TestFaultsQuick runs short versions of a few faults on every go test
// run: Redis paused 2 s with periodic syncs, Redis killed and restarted
// with synchronous hits and rates, and a node killed with kill -9. It
// checks the promises that hold on main and that a regression breaks
// loudly: no hit counted twice, none lost beyond what the fault allows,
// no turn of a rate lost or counted twice, no 5xx, every node syncing
// again, every ban reaching every node, and a ban outliving a Redis
// restarted empty (its time back in the store is reported, not
// asserted). It waits for events (a
// recovery, a ban), never asserts on latencies, and uses bounds of 20 s
// where the promise is 5 s, so that a loaded machine does not fail it.
// Skipped under -short.
func TestFaultsQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Caddy processes and Redis: not under -short")
	}
	redistest.Require(t)
	r := &Runner{
		T: t, Caddy: caddyproc.TestBinary(t, "FAULTS_CADDY"), Dir: t.TempDir(), Nodes: 3, Scale: 0.2, Quick: true,
		Rates: Rates{Count: 40, Limit: 30, Conc: 20, Rate: 20},
	}
	t.Cleanup(r.Close)
	rows := []Row{
		{Fault: mustFault(t, "redis-pause")},
		{Fault: mustFault(t, "redis-kill"), Sync: true},
		{Fault: mustFault(t, "node-kill")},
	}
	for _, row := range rows {
		o, err := r.RunRow(t.Context(), row)
		if err != nil {
			t.Fatalf("%s: %v", row.ID(), err)
		}
		t.Logf("%s: %s", row.ID(), o.Summary())
		if o.Admitted == 0 {
			t.Errorf("%s: no hit of the judged keys was admitted", row.ID())
		}
		if o.hasRates() && o.Turns.Admitted == 0 {
			t.Errorf("%s: no request of %s was admitted", row.ID(), RatePath)
		}
		for _, c := range o.Checks() {
			// Latency and time bounds are reported, not asserted: a
			// loaded machine may miss them.
			timed := strings.Contains(c.Promise, "≤ 5 s") || strings.Contains(c.Promise, "≤ 3 s") ||
				strings.Contains(c.Promise, "≤ 2 s") || strings.Contains(c.Promise, "≤ 1 s") ||
				strings.Contains(c.Promise, "p99") || strings.Contains(c.Promise, "900 ms") ||
				strings.Contains(c.Promise, "killed node's last sync_rate")
			if !c.Held && !timed {
				t.Errorf("%s: %s: %s", row.ID(), c.Promise, c.Figure)
			}
		}
		if !row.Fault.NodeFault && o.RecoveryMax < 0 {
			t.Errorf("%s: a node never synced again after the store came back: %v", row.ID(), o.Recovery)
		}
		if row.Fault.Name == "node-kill" && o.Lost > o.LastSecond {
			t.Errorf("%s: %g hits lost, more than the killed node admitted in its last second (%g)", row.ID(), o.Lost, o.LastSecond)
		}
		if o.BanLag < 0 {
			t.Errorf("%s: the ban set off during the fault did not reach every node within 20 s", row.ID())
		}
		if o.BanBack == -1 {
			t.Errorf("%s: the ban set off before the fault was not back in the store within 20 s", row.ID())
		}
	}
}

func mustFault(t *testing.T, name string) *Fault {
	t.Helper()
	f, ok := FaultByName(name)
	if !ok {
		t.Fatalf("no fault %q", name)
	}
	return f
}

// TestFaultsFull runs the fault table when FAULTS_FULL is set:
// scripts/bench-faults.sh sets it and documents the other settings.
func TestFaultsFull(t *testing.T) {
	if os.Getenv("FAULTS_FULL") == "" {
		t.Skip("the fault table runs for many minutes: FAULTS_FULL=1, or scripts/bench-faults.sh")
	}
	scale := 1.0
	if v := os.Getenv("FAULTS_SCALE"); v != "" {
		var err error
		if scale, err = strconv.ParseFloat(v, 64); err != nil || scale <= 0 {
			t.Fatalf("FAULTS_SCALE: want a positive number, got %q", v)
		}
	}
	var filter *regexp.Regexp
	if f := os.Getenv("FAULTS"); f != "" {
		var err error
		if filter, err = regexp.Compile(f); err != nil {
			t.Fatalf("FAULTS: %v", err)
		}
	}
	modes := os.Getenv("FAULTS_MODES")
	var rows []Row
	for _, f := range Faults {
		for _, sync := range []bool{false, true} {
			row := Row{Fault: f, Sync: sync}
			if filter != nil && !filter.MatchString(row.ID()) {
				continue
			}
			if modes == "periodic" && sync || modes == "sync" && !sync {
				continue
			}
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		t.Fatal("FAULTS matches no row")
	}
	rates := DefaultRates
	if v := os.Getenv("FAULTS_RATE"); v != "" {
		total, err := strconv.ParseFloat(v, 64)
		if err != nil || total <= 0 {
			t.Fatalf("FAULTS_RATE: want requests per second, got %q", v)
		}
		f := total / rates.Total()
		for i := range rates {
			rates[i] *= f
		}
	}
	bin := caddyproc.TestBinary(t, "FAULTS_CADDY")
	versions := []string{"Redis: " + machine.Version("redis-server", "--version")}
	if b, err := pgtest.Find(); err == nil {
		versions = append(versions, "PostgreSQL: "+machine.Version(b.Postgres, "--version"))
	}
	fmt.Fprintf(os.Stderr, "faults: %d rows, 3 nodes, %.0f requests/s, scale %g\n", len(rows), rates.Total(), scale)
	// FAULTS_DIR keeps the nodes' configs and logs there, a directory per row.
	dir := cmp.Or(os.Getenv("FAULTS_DIR"), t.TempDir())
	r := &Runner{T: t, Caddy: bin, Dir: dir, Nodes: 3, Scale: scale, Rates: rates, Progress: os.Stderr}
	t.Cleanup(r.Close)
	rep := Report{
		Date:      time.Now().UTC(),
		MachineAt: machine.Describe(),
		Command:   caddyproc.Env("FAULTS_COMMAND", "FAULTS_FULL=1 go test -run TestFaultsFull ./internal/faults"),
		Source:    caddyproc.Env("FAULTS_SOURCE", "the working tree"),
		Go:        runtime.Version(),
		Versions:  versions,
		Scale:     scale,
		Rates:     rates,
		Nodes:     3,
	}
	began := time.Now()
	for _, row := range rows {
		o, err := r.RunRow(t.Context(), row)
		if err != nil {
			t.Errorf("%s: %v", row.ID(), err)
			rep.Errors = append(rep.Errors, fmt.Sprintf("%s: %v", row.ID(), err))
			continue
		}
		rep.Outcomes = append(rep.Outcomes, o)
	}
	rep.Elapsed = time.Since(began)
	rep.MachineEnd = machine.Describe()
	md, err := rep.Markdown()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Print(md)
	if out := os.Getenv("OUT"); out != "" {
		if err := rep.WriteDoc(out); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "faults: wrote the results into %s\n", out)
	}
}
