package syncapp

import (
	"encoding/json"
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/strategy"
)

// strategyNamespace is the Caddy module namespace of storage strategies.
const strategyNamespace = "rate_limit.strategies"

// loadStrategy loads, provisions and validates a strategy module from its
// JSON ({"module": "<name>", ...}).
//
// It does what ctx.LoadModule does, but leaves the module out of the
// context's cleanup: Caddy cleans up a context's modules in no particular
// order, and at a graceful stop the app must push its last diffs through
// the strategy before the strategy closes its connections. The app cleans
// its strategies up itself, after that push.
func loadStrategy(ctx caddy.Context, raw json.RawMessage) (strategy.Strategy, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("strategy: %v", err)
	}
	var name string
	if err := json.Unmarshal(fields["module"], &name); err != nil || name == "" {
		return nil, fmt.Errorf(`strategy: want the module's name in "module", such as "redis"`)
	}
	delete(fields, "module")
	info, err := caddy.GetModule(strategyNamespace + "." + name)
	if err != nil {
		return nil, fmt.Errorf("strategy: unknown module %s.%s: %v", strategyNamespace, name, err)
	}
	mod := info.New()
	st, ok := mod.(strategy.Strategy)
	if !ok {
		return nil, fmt.Errorf("strategy: module %s is not a rate limit strategy", info.ID)
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("strategy: %v", err)
	}
	if err := caddy.StrictUnmarshalJSON(body, mod); err != nil {
		return nil, fmt.Errorf("strategy %s: %v", name, err)
	}
	if p, ok := mod.(caddy.Provisioner); ok {
		if err := p.Provision(ctx); err != nil {
			cleanupStrategy(st)
			return nil, fmt.Errorf("strategy %s: %v", name, err)
		}
	}
	if v, ok := mod.(caddy.Validator); ok {
		if err := v.Validate(); err != nil {
			cleanupStrategy(st)
			return nil, fmt.Errorf("strategy %s: %v", name, err)
		}
	}
	return st, nil
}

// cleanupStrategy releases what a strategy holds, such as connections.
func cleanupStrategy(st strategy.Strategy) error {
	if c, ok := st.(caddy.CleanerUpper); ok {
		return c.Cleanup()
	}
	return nil
}
