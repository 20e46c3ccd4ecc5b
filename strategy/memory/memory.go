package memory

import (
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

func init() {
	caddy.RegisterModule(Memory{})
}

// Memory is a store that keeps the shared counters in this process's
// memory. Stores opened from memory strategies with the same name share one
// data set, which lives as long as the process (across config reloads); its
// counters expire on their own.
type Memory struct {
	// Name names the data set. Every memory strategy of the same name, in
	// any namespace or config of this process, shares its counters, and
	// strategies of different names share nothing.
	//
	// Default: empty, the data set of every unnamed memory strategy.
	Name string `json:"name,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Memory) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rate_limit.strategies.memory",
		New: func() caddy.Module { return new(Memory) },
	}
}

// StoreKey returns the name: strategies of the same name open one store.
func (m *Memory) StoreKey() string { return m.Name }

// Open returns a new store of the named data set, for Go code and tests
// as for the rate_limit app (OpenStore). It allocates the data set on
// first use, never blocks and never fails; close the store when done:
//
//	s, err := (&memory.Memory{Name: "test"}).Open()
//	if err != nil { ... }
//	defer s.Close()
func (m *Memory) Open() (*Store, error) {
	return newStore(shared(m.Name)), nil
}

// OpenStore returns a new store of the named data set (see Open and
// strategy.Strategy).
func (m *Memory) OpenStore() (strategy.Store, error) {
	return strategy.OpenStore(m.Open)
}

// ValidateWindow refuses window sizes that are not positive whole
// milliseconds. Memory could hold any size, but it takes those that Redis
// takes, so that what works on one works on the other.
func (m *Memory) ValidateWindow(size time.Duration) error {
	return errs.Settings(strategy.CheckSize(size))
}

// Interface guards
var (
	_ caddy.Module          = (*Memory)(nil)
	_ strategy.Strategy     = (*Memory)(nil)
	_ caddyfile.Unmarshaler = (*Memory)(nil)
)
