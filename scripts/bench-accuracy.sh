#!/usr/bin/env bash
# Measures how closely a fleet of Caddy nodes sharing a store keeps a rate
# limit: for each traffic pattern, sync_rate, sync_above and store (Redis,
# PostgreSQL), it starts 3 Caddy processes on loopback, sends them requests
# round-robin on a schedule, and prints a markdown table of the worst
# window's admitted / limit, the store's commands per 1,000 requests and
# the latency the limiter adds (internal/accuracy does the work).
#
#	./scripts/bench-accuracy.sh                         # the full table: about 10 minutes
#	OUT=docs/accuracy.md ./scripts/bench-accuracy.sh    # and write that page with its SVG plots
#	QUICK=1 ./scripts/bench-accuracy.sh                 # the quick rows of go test: under a minute
#	REV=HEAD OUT=docs/accuracy.md ./scripts/bench-accuracy.sh   # measure a commit, not the working tree
#
# Settings, from the environment:
#	ACCURACY_NODES=3 ACCURACY_LIMIT=200 ACCURACY_DURATION=3s
#	ACCURACY_STORES=redis,postgres
#	ACCURACY_VERBOSE=1 (how the worst window of each row over the limit went)
#	ACCURACY_ROWS=<regexp of row IDs>, such as 'redis-steady2x' or 'sync100ms'
#	   (an ID is <store>-<pattern>-sync<rate>-above<off|08|09>)
#	ACCURACY_REPEAT=1 (run each row this many times in a row: how much a row varies)
#
# It installs Debian's redis-server and postgresql when they are missing,
# and never touches the machine's own Redis or PostgreSQL: its servers,
# like the Caddy nodes, run on free loopback ports and stop at exit.
set -euo pipefail

command="./scripts/bench-accuracy.sh"
for v in QUICK REV OUT ACCURACY_NODES ACCURACY_LIMIT ACCURACY_DURATION ACCURACY_STORES ACCURACY_ROWS ACCURACY_REPEAT ACCURACY_VERBOSE; do
	[ -n "${!v:-}" ] && command="$v=$(printf %q "${!v}") $command"
done
invoked_from=$PWD
cd "$(dirname "$0")/.."
root=$PWD

. scripts/lib/debian.sh
install_missing redis-server postgresql

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-accuracy.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The harness is the test binary of internal/accuracy, built without -race;
# it builds Caddy itself (go build ./cmd/caddy, cached between runs).
echo "building the harness..." >&2
go test -c -o "$work/accuracy.test" ./internal/accuracy

if [ -n "${OUT:-}" ]; then
	case $OUT in /*) ;; *) OUT="$invoked_from/$OUT" ;; esac
	mkdir -p "$(dirname "$OUT")"
	export OUT
fi

# What the nodes run: the working tree (the harness builds it), or with REV
# a commit, exported and built here.
if [ -n "${REV:-}" ]; then
	rev=$(git rev-parse --short "$REV^{commit}")
	echo "building Caddy from commit $rev..." >&2
	mkdir "$work/src"
	git archive "$REV" | tar -x -C "$work/src"
	(cd "$work/src" && go build -o "$work/caddy" ./cmd/caddy)
	export ACCURACY_CADDY="$work/caddy" ACCURACY_SOURCE="commit $rev"
else
	ACCURACY_SOURCE="the working tree at commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
	if [ -n "$(git status --porcelain -- '*.go' go.mod go.sum 2>/dev/null)" ]; then
		ACCURACY_SOURCE="$ACCURACY_SOURCE, with uncommitted changes"
	fi
	export ACCURACY_SOURCE
fi

cd "$root/internal/accuracy"
if [ -n "${QUICK:-}" ] && [ "${QUICK}" != 0 ]; then
	exec "$work/accuracy.test" -test.run '^TestAccuracyQuick$' -test.v -test.count=1
fi
ACCURACY_FULL=1 ACCURACY_COMMAND="$command" \
	"$work/accuracy.test" -test.run '^TestAccuracyFull$' -test.count=1 -test.timeout=60m
