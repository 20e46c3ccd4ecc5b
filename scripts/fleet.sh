#!/usr/bin/env bash
# A fleet on one machine: starts a redis-server and two Caddy nodes with
# this plugin on loopback (testdata/fleet.Caddyfile), sends requests to
# both in turn, and shows that they share one limit of 5 per minute.
# Everything it starts is stopped when it ends.
#
#	./scripts/fleet.sh [requests]    # default 8
set -euo pipefail
cd "$(dirname "$0")/.."
requests=${1:-8}

. scripts/lib/debian.sh
install_missing redis-server

work=$(mktemp -d)
pids=()
cleanup() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# A port nobody listens on, from the kernel's ephemeral range.
free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
pids+=($!)

echo "building Caddy with the plugin..."
go build -o "$work/caddy" ./cmd/caddy

nodes=()
for n in 1 2; do
	node_port=$(free_port)
	admin_port=$(free_port)
	NODE_PORT=$node_port ADMIN_PORT=$admin_port REDIS_ADDR=127.0.0.1:$redis_port \
		"$work/caddy" run --config testdata/fleet.Caddyfile --adapter caddyfile >"$work/node$n.log" 2>&1 &
	pids+=($!)
	nodes+=("$node_port")
	# Wait for the node's admin endpoint, which counts no hit.
	for _ in $(seq 200); do
		curl -s -o /dev/null "http://127.0.0.1:$admin_port/config/" && break
		sleep 0.1
	done
done

echo "redis-server on 127.0.0.1:$redis_port; nodes on 127.0.0.1:${nodes[0]} and 127.0.0.1:${nodes[1]}"
echo "limit 5 per minute per client, shared by both nodes (sync_rate 100ms, sync_above 0.5):"
for i in $(seq "$requests"); do
	port=${nodes[$(((i - 1) % 2))]}
	status=$(curl -s -o "$work/body" -D "$work/headers" -w '%{http_code}' "http://127.0.0.1:$port/")
	shown=$(grep -i -E '^(RateLimit|RateLimit-Remaining|Retry-After):' "$work/headers" | tr -d '\r' | tr '\n' ' ' || true)
	echo "request $i -> node :$port  $status  $shown"
	sleep 0.25
done
