package ratelimit

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestExampleConfigsLoad adapts and validates (provisions, as caddy
// validate does, which never connects to a store) the configs that the
// README's commands run, and checks that each is formatted as caddy fmt
// formats it.
func TestExampleConfigsLoad(t *testing.T) {
	t.Setenv("NODE_PORT", "8081")
	t.Setenv("ADMIN_PORT", "2021")
	t.Setenv("REDIS_ADDR", "127.0.0.1:6390")
	for _, name := range []string{"testdata/Caddyfile", "testdata/fleet.Caddyfile"} {
		t.Run(name, func(t *testing.T) {
			src, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			if formatted := caddyfile.Format(src); !bytes.Equal(formatted, src) {
				t.Errorf("%s is not formatted as caddy fmt formats it:\n%s", name, formatted)
			}
			cfgJSON, warnings, err := caddyAdapt(string(src))
			if err != nil {
				t.Fatalf("adapting: %v", err)
			}
			for _, w := range warnings {
				t.Errorf("adapting: warning: %s", w)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
				t.Fatal(err)
			}
			if err := caddy.Validate(&cfg); err != nil {
				t.Fatalf("validating: %v", err)
			}
		})
	}
}
