package ratelimit

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/ratesync/caddy-ratelimit/internal/redistest"
)

func init() {
	caddy.RegisterModule(admissionRecorder{})
	httpcaddyfile.RegisterHandlerDirective("test_admitted", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		return new(admissionRecorder), nil
	})
}

// admitted records when requests passed the rate_limit handlers before
// it, by X-Key, on the server's clock.
var admitted = struct {
	sync.Mutex
	at map[string][]time.Time
}{at: make(map[string][]time.Time)}

// admissionRecorder is a test handler (directive test_admitted) that
// records the time each request reaches it in admitted.
type admissionRecorder struct{}

func (admissionRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_admitted", New: func() caddy.Module { return new(admissionRecorder) }}
}

func (admissionRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	now := time.Now()
	admitted.Lock()
	key := r.Header.Get("X-Key")
	admitted.at[key] = append(admitted.at[key], now)
	admitted.Unlock()
	return next.ServeHTTP(w, r)
}

// TestMaxDelay sends 15 simultaneous requests of one key to limit 5 1s:
// with max_delay 3s all are served, spread over at least 2 s, and no
// sliding second holds more than 5 admissions (the 10 that waited are
// the outcome delayed, and their waits in the histogram); with max_delay
// 100ms some are rejected at once. Admissions are recorded by the next
// handler, which a loaded machine may run a little late: two of them
// recorded less than a second apart by up to recordJitter are not taken
// for a limit overrun.
func TestMaxDelay(t *testing.T) {
	tester := loadWithOptions(t, "order test_admitted after rate_limit", `
	http://localhost:9080 {
		rate_limit /wait {
			key {http.request.header.X-Key}
			limit 5 1s
			max_delay 3s
		}
		rate_limit /short {
			key {http.request.header.X-Key}
			limit 5 1s
			max_delay 100ms
		}
		test_admitted
		respond "ok"
	}`)

	const (
		delayed = `caddy_rate_limit_requests_total{namespace="default",outcome="delayed"}`
		delays  = `caddy_rate_limit_delay_seconds_count{namespace="default"}`
		waited  = `caddy_rate_limit_delay_seconds_sum{namespace="default"}`
	)
	delayedBefore, delaysBefore, waitedBefore := metricValue(t, delayed), metricValue(t, delays), metricValue(t, waited)
	key := uniqueKey(t)
	start := time.Now()
	if got, _ := simultaneous(t, tester, "/wait", key, 15); got[http.StatusOK] != 15 {
		t.Fatalf("max_delay 3s: statuses %v, want all 15 served", got)
	}
	t.Logf("15 served in %v", time.Since(start).Round(time.Millisecond))
	admitted.Lock()
	at := slices.Clone(admitted.at[key])
	admitted.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	if len(at) != 15 {
		t.Fatalf("%d admissions recorded, want 15", len(at))
	}
	if spread := at[14].Sub(at[0]); spread < 2*time.Second {
		t.Errorf("admissions spread over %v, want at least 2s", spread)
	}
	const recordJitter = 100 * time.Millisecond
	for i := 5; i < len(at); i++ {
		if d := at[i].Sub(at[i-5]); d < time.Second-recordJitter {
			t.Errorf("admissions %d to %d within %v: 6 in one sliding second", i-4, i+1, d)
		}
	}
	t.Logf("admitted at +%v", offsets(at))
	if got := metricValue(t, delayed) - delayedBefore; got != 10 {
		t.Errorf("outcome delayed: +%v, want +10", got)
	}
	if got := metricValue(t, delays) - delaysBefore; got != 10 {
		t.Errorf("delays observed: +%v, want +10", got)
	}
	// 5 waited about a second, 5 about two; none more than max_delay (a
	// loaded machine wakes them late, never early).
	if got := metricValue(t, waited) - waitedBefore; got < 14 || got > 10*3 {
		t.Errorf("seconds waited: +%v, want about 15, and at most 30", got)
	}

	// A round in which the machine spread the 15 requests over more than
	// a second may serve them all; it says nothing, and is played again.
	for round := 1; ; round++ {
		got, _ := simultaneous(t, tester, "/short", uniqueKey(t), 15)
		if got[http.StatusOK] < 5 || got[http.StatusOK]+got[http.StatusTooManyRequests] != 15 {
			t.Fatalf("max_delay 100ms: statuses %v, want at least 5 served and the others rejected", got)
		}
		if got[http.StatusTooManyRequests] > 0 {
			break
		}
		if round == 5 {
			t.Fatalf("max_delay 100ms: in 5 rounds of 15 simultaneous requests none was rejected")
		}
	}
}

// TestMaxDelayWhereTheStoreDecides sends 15 simultaneous requests of one
// key to limit 5 1s with max_delay 5s in a synchronous namespace on
// Redis: the store's sliding rate gives the waits, every try that finds
// no room counts nothing, so all are served, the last ones more than a
// second and a half after the first.
func TestMaxDelayWhereTheStoreDecides(t *testing.T) {
	srv := redistest.Start(t)
	tester := loadWithOptions(t, fmt.Sprintf(`
		order test_admitted after rate_limit
		rate_limit {
			namespace strict {
				sync_rate 0
				strategy redis {
					addresses %s
				}
			}
		}`, srv.Addr), `
	http://localhost:9080 {
		rate_limit {
			namespace strict
			key {http.request.header.X-Key}
			limit 5 1s
			max_delay 5s
		}
		test_admitted
		respond "ok"
	}`)
	key := uniqueKey(t)
	get(t, tester, "/", "warm-up-"+key) // connect to the store first
	if got, _ := simultaneous(t, tester, "/", key, 15); got[http.StatusOK] != 15 {
		t.Fatalf("statuses %v, want all 15 served", got)
	}
	admitted.Lock()
	at := slices.Clone(admitted.at[key])
	admitted.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	t.Logf("admitted at +%v", offsets(at))
	if spread := at[len(at)-1].Sub(at[0]); len(at) != 15 || spread < 1500*time.Millisecond {
		t.Errorf("%d admissions spread over %v, want 15 over at least 1.5s", len(at), spread)
	}
}

// offsets returns each of the sorted times at as its distance from the
// first.
func offsets(at []time.Time) []string {
	var s []string
	for _, a := range at {
		s = append(s, fmt.Sprint(a.Sub(at[0]).Round(time.Millisecond)))
	}
	return s
}
