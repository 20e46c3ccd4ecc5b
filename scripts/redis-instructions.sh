#!/usr/bin/env bash
# Counts the instructions redis-server runs per synchronous hit for
# batches of 10 hits with two limits (strategy/redis's
# BenchmarkBatchInstructions): of 1, 32 and 1,000 keys, far from their
# limits and over them, and batches of 12 hits over 32 keys shaped as
# the speed harness's 32-key route sends them. The server runs under valgrind's callgrind, so the
# counts do not move with the machine's load: two versions of the batch
# script compare in one run of each, where CPU time needs many.
#
#	./scripts/redis-instructions.sh          # about 2 minutes
#	BATCHES=500 ./scripts/redis-instructions.sh
#
# It installs Debian's valgrind and redis-server when they are missing,
# and runs its own redis-server on a free loopback port, stopped at exit.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib/debian.sh
install_missing valgrind redis-server

work=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
	redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do
	redis-cli -p "$port" ping >/dev/null 2>&1 && break
	sleep 0.1
done
redis-cli -p "$port" ping >/dev/null

CALLGRIND_REDIS_ADDR=127.0.0.1:$port CALLGRIND_REDIS_PID=$pid CALLGRIND_REDIS_OUT="$work/callgrind.out" \
	go test -run '^$' -bench BenchmarkBatchInstructions -benchtime "${BATCHES:-200}x" ./strategy/redis/ |
	grep -E '^(Benchmark|ok|FAIL)'
