// Package ratelimit is a Caddy v2 plugin for rate limiting in the way of
// large API gateways: every node counts hits per key in memory with a
// sliding window, and every namespace syncs its counts with a central store
// (Redis or PostgreSQL) on a timer, so a fleet of Caddy servers enforces one shared limit.
//
// This package holds the HTTP handler (http.handlers.rate_limit) and its
// Caddyfile directive. The rate_limit app lives in syncapp, the counter
// engine in window, and the storage strategies in strategy. Importing this
// package, as xcaddy does, brings in all of them.
package ratelimit

import (
	// The app and the strategies are modules of their own; importing them
	// here registers them with Caddy.
	_ "github.com/ratesync/caddy-ratelimit/strategy/memory"
	_ "github.com/ratesync/caddy-ratelimit/strategy/postgres"
	_ "github.com/ratesync/caddy-ratelimit/strategy/redis"
	_ "github.com/ratesync/caddy-ratelimit/syncapp"
)
