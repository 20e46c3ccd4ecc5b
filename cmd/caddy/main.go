// Command caddy is Caddy with this plugin built in, for running the
// examples from a checkout without xcaddy:
//
//	go run ./cmd/caddy run --config testdata/Caddyfile
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules, and this plugin.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/ratesync/caddy-ratelimit"
)

func main() {
	caddycmd.Main()
}
