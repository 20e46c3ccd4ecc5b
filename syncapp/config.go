package syncapp

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// DefaultMaxKeys is the capacity of a zone that does not set max_keys. A
// full zone of short keys with one window size takes about 120 MB.
const DefaultMaxKeys = 1_000_000

// ZoneConfig configures a zone: the memory that holds the counters of the
// namespaces that use it.
type ZoneConfig struct {
	// The most keys the zone holds, over all its namespaces and window
	// sizes. Past it, the least recently used keys are evicted (and counted
	// in the caddy_rate_limit_evictions_total metric). Default: 1000000.
	MaxKeys int `json:"max_keys,omitempty"`
}

// NamespaceConfig configures a namespace: a set of counters, the zone that
// holds them and how they sync with a central store.
type NamespaceConfig struct {
	// The zone that holds the namespace's counters. Default: "default".
	Zone string `json:"zone,omitempty"`

	// How the namespace syncs with its store. Omitted, "off" or negative:
	// local only, nothing leaves the node. 0: synchronous, every hit is
	// applied to the store, to all its limits at once, and answered with
	// the store's counts; a hit goes at once when no round trip is out,
	// and the hits that arrive while one is out go together in the next
	// (one Redis script run, per slot on a Cluster; one PostgreSQL
	// function call), so a request waits for at most one round trip ahead
	// of its own. A duration of at least 1ms (e.g. "100ms", "10s"):
	// periodic, hits count locally and every sync_rate the node pushes its
	// diffs and fetches the merged counts. A namespace with a strategy
	// needs a sync_rate: omitted, it is a load error; "off" keeps the
	// strategy unused.
	SyncRate *SyncRate `json:"sync_rate,omitempty"`

	// In a periodic namespace, the fraction of a limit, in (0, 1], from
	// which a key is counted at the store: a hit that brings the key's
	// rate on this node to sync_above of any of its limits or more is applied
	// synchronously (one round trip; the store decides on its counts and
	// this node's unpushed diffs), until the rate falls back below. Keys
	// far from their limits stay local. The fleet then admits exactly the
	// limit as long as the other nodes admit less than (1 - sync_above) ×
	// the limit within one sync_rate. The store must be able to apply
	// synchronous hits. Default: off.
	SyncAbove *float64 `json:"sync_above,omitempty"`

	// What the node does while it cannot reach the store: "allow" (the
	// default) enforces every limit on this node's own counts, so a
	// client spread over N nodes may get up to N times its limit
	// meanwhile; "share" enforces on each node its share of every limit,
	// the limit divided by the number of nodes the fleet had when the
	// store was last reached (each node's hits since then count as many
	// times as there are nodes), so that the fleet stays within the
	// limit; "deny" rejects every request of the namespace with the
	// handler's error_code and a Retry-After of 1 second. Bans this node
	// knows of hold under every policy. A node that never reached the
	// store does not know the fleet's size, and shares as allow.
	OnStoreFailure string `json:"on_store_failure,omitempty"`

	// Window sizes whose counters the namespace syncs, in addition to those
	// of the rate_limit handlers that use it (which are merged in
	// automatically). Durations such as "1s" or "1m".
	WindowSizes []caddy.Duration `json:"window_sizes,omitempty"`

	// The store to sync with, required when sync_rate is 0 or a duration,
	// and refused when sync_rate is omitted (it would never be used): a
	// module in the rate_limit.strategies namespace, such as
	// {"module": "redis", "addresses": ["127.0.0.1:6379"]}.
	StrategyRaw json.RawMessage `json:"strategy,omitempty" caddy:"namespace=rate_limit.strategies inline_key=module"`
}

// Mode is how a namespace syncs with its store.
type Mode int

const (
	// Local counts on this node only; no store is created.
	Local Mode = iota
	// Synchronous applies every hit to the store; the hits that arrive
	// together share one round trip.
	Synchronous
	// Periodic pushes diffs and fetches counts every sync_rate.
	Periodic
)

// String returns the mode's name: local, synchronous or periodic.
func (m Mode) String() string {
	switch m {
	case Synchronous:
		return "synchronous"
	case Periodic:
		return "periodic"
	}
	return "local"
}

// MinSyncRate is the shortest periodic sync_rate.
const MinSyncRate = time.Millisecond

// SyncRate is a namespace's sync_rate. In JSON it is "off", or a duration
// as a string ("0", "100ms", "1m") or as integer nanoseconds; a negative
// value means off.
type SyncRate time.Duration

// SyncOff is the SyncRate of a local-only namespace.
const SyncOff = SyncRate(-1)

// ParseSyncRate parses a sync_rate as written in a Caddyfile or JSON.
func ParseSyncRate(s string) (SyncRate, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "off":
		return SyncOff, nil
	case "0":
		return 0, nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("sync_rate: invalid value %q: want off, 0 or a duration such as 100ms", s)
	}
	if d < 0 {
		return SyncOff, nil
	}
	return SyncRate(d), nil
}

// Mode returns the sync mode the rate selects. A nil rate is local.
func (r *SyncRate) Mode() Mode {
	switch {
	case r == nil || *r < 0:
		return Local
	case *r == 0:
		return Synchronous
	}
	return Periodic
}

// Validate refuses rates between 0 and MinSyncRate.
func (r *SyncRate) Validate() error {
	if r != nil && *r > 0 && time.Duration(*r) < MinSyncRate {
		return fmt.Errorf("sync_rate: %v is too short: use 0 for synchronous, or at least %v", time.Duration(*r), MinSyncRate)
	}
	return nil
}

// String returns the rate as the Caddyfile writes it.
func (r SyncRate) String() string {
	switch {
	case r < 0:
		return "off"
	case r == 0:
		return "0"
	}
	return time.Duration(r).String()
}

// MarshalJSON writes the rate as a string: "off", "0" or a duration.
func (r SyncRate) MarshalJSON() ([]byte, error) { return json.Marshal(r.String()) }

// UnmarshalJSON reads "off", a duration string, or integer nanoseconds.
func (r *SyncRate) UnmarshalJSON(b []byte) error {
	var n int64
	if err := json.Unmarshal(b, &n); err == nil {
		*r = SyncRate(n)
		if n < 0 {
			*r = SyncOff
		}
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("sync_rate: want a string or a number, got %s", b)
	}
	var err error
	*r, err = ParseSyncRate(s)
	return err
}

// validateSyncAbove refuses a sync_above outside (0, 1], or on a namespace
// that is not periodic.
func validateSyncAbove(v *float64, mode Mode) error {
	if v == nil {
		return nil
	}
	if !isFraction(*v) {
		return fmt.Errorf("sync_above: %v is not a fraction of a limit: want a number in (0, 1], such as 0.8", *v)
	}
	if mode != Periodic {
		return fmt.Errorf("sync_above: only a periodic namespace (sync_rate of at least %v) counts keys near their limits at the store; this one is %s", MinSyncRate, mode)
	}
	return nil
}

// isFraction says whether v is a fraction of a limit, in (0, 1]: not NaN.
func isFraction(v float64) bool { return v > 0 && v <= 1 }
