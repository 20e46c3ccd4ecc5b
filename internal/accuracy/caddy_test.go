package accuracy

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestNodeConfig(t *testing.T) {
	strategy := json.RawMessage(`{"module":"redis","addresses":["127.0.0.1:7000"]}`)
	for _, tc := range []struct {
		name      string
		rate      time.Duration
		above     float64
		syncRate  string
		syncAbove any
	}{
		{"synchronous", 0, 0, "0", nil},
		{"periodic", 100 * time.Millisecond, 0, "100ms", nil},
		{"sync_above", 10 * time.Millisecond, 0.8, "10ms", 0.8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := NodeConfig{Listen: "127.0.0.1:8080", SyncRate: tc.rate, SyncAbove: tc.above, Strategy: strategy, Limit: 200, ManyLimit: 40}.JSON()
			if err != nil {
				t.Fatal(err)
			}
			var cfg struct {
				Apps struct {
					RateLimit struct {
						Namespaces map[string]map[string]any `json:"namespaces"`
					} `json:"rate_limit"`
					HTTP struct {
						Servers map[string]struct {
							Listen []string `json:"listen"`
							Routes []struct {
								Handle []map[string]any `json:"handle"`
							} `json:"routes"`
						} `json:"servers"`
					} `json:"http"`
				} `json:"apps"`
			}
			if err := json.Unmarshal(b, &cfg); err != nil {
				t.Fatal(err)
			}
			ns := cfg.Apps.RateLimit.Namespaces["api"]
			if ns["sync_rate"] != tc.syncRate || ns["sync_above"] != tc.syncAbove {
				t.Errorf("namespace %v: want sync_rate %q, sync_above %v", ns, tc.syncRate, tc.syncAbove)
			}
			srv := cfg.Apps.HTTP.Servers["accuracy"]
			if len(srv.Listen) != 1 || srv.Listen[0] != "127.0.0.1:8080" || len(srv.Routes) != 3 {
				t.Fatalf("server: %+v", srv)
			}
			limited := srv.Routes[1].Handle[0]
			if limited["handler"] != "rate_limit" || limited["window_type"] != "fixed" {
				t.Errorf("limited route: %v", limited)
			}
			if !strings.Contains(string(b), "{time.now.unix_ms}") {
				t.Error("the answers do not carry the node's clock")
			}
		})
	}
}

func TestRowID(t *testing.T) {
	r := Row{Pattern: Steady2x, Store: "redis", SyncRate: 100 * time.Millisecond, SyncAbove: 0.8}
	if got := r.ID(); got != "redis-steady2x-sync100ms-above08" {
		t.Errorf("ID = %q", got)
	}
	if got := (Row{Pattern: Burst10x, Store: "postgres"}).ID(); got != "postgres-burst10x-sync0-aboveoff" {
		t.Errorf("ID = %q", got)
	}
	if n := len(FullPlan([]string{"redis", "postgres"}, true)); n != 140 {
		t.Errorf("full plan: %d rows, want 2 stores × 7 patterns × (1 + 3 rates × 3 sync_above) = 140", n)
	}
	if n := len(FullPlan([]string{"redis"}, false)); n != 28 {
		t.Errorf("plan without sync_above: %d rows, want 7 × (1 + 3) = 28", n)
	}
}
