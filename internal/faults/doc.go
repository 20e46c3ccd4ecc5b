// Package faults is the fault harness: it measures what a fleet of Caddy
// nodes sharing a real store does while the store, or a node, fails.
//
// For each row (a fault, in periodic or synchronous mode) it starts N
// Caddy processes on loopback (internal/caddyproc), each with an admin
// endpoint and one namespace on a store the harness owns
// (internal/redistest, internal/pgtest: never the machine's own servers),
// sends known traffic (a route whose every hit must reach the store, one
// over its limit, one with max_concurrent in front of the harness's
// upstream, bans, and at sync_rate 0 a rate whose every request has a key
// of its own), injects the fault, and reports: hits admitted against what
// the store holds (lost, counted twice), the rate's turns admitted against
// the store's TATs (rates.go), 5xx, latency during the fault, admitted /
// limit during and after it, how soon every node syncs again once the
// store serves (from each node's /metrics), when max_concurrent admits
// again and whether its cap holds, how soon a ban reaches every node,
// failure log lines, goroutines and store connections; and, next to each
// row, whether its promises held.
//
// TestFaultsQuick runs three short faults in every go test run (not under
// -short); TestFaultsFull, run by scripts/bench-faults.sh, runs the whole
// table, prints it as the Markdown docs/faults.md holds
// (results.md.tmpl) and can write it into that page, between its markers.
package faults
