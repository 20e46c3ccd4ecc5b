#!/usr/bin/env bash
# Injects faults into a fleet of 3 Caddy nodes sharing a store, under
# load, and reports for each fault and sync mode (sync_rate 100ms and 0):
# hits admitted against what the store holds (lost, counted twice), 5xx,
# latency during the fault, admitted / limit during and after it, how soon
# every node syncs again once the store serves, max_concurrent and bans
# after it, failure log lines, goroutines and store connections; and
# whether each promise of issue 21 held (internal/faults does the work).
#
#	./scripts/bench-faults.sh                          # every fault, full durations: about 15 minutes
#	./scripts/bench-faults.sh -o docs/faults.md        # and write that page
#	./scripts/bench-faults.sh -f 'redis-pause|node'    # only these faults (regexp of row IDs)
#	./scripts/bench-faults.sh -s 0.5                   # durations halved (a 5 s pause, 22.5 s of flapping, 50 reloads)
#	./scripts/bench-faults.sh -m sync                  # only sync_rate 0 (or periodic)
#	./scripts/bench-faults.sh -r 300                   # 300 requests/s instead of 600
#	./scripts/bench-faults.sh -q                       # the quick mode of go test: under a minute
#
# A row ID is <fault>-<periodic|sync>. Faults, in order: redis-pause,
# redis-kill, postgres-stop, redis-flap, node-kill, node-stop, reloads,
# redis-slow, sentinel-failover, cluster-failover.
#
# It installs Debian's redis-server and postgresql when they are missing,
# and never touches the machine's own Redis or PostgreSQL: its servers,
# like the Caddy nodes, run on free loopback ports and stop at exit.
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
faults="" scale="" modes="" rate="" out="" quick=""
while getopts "f:s:m:r:o:qh" opt; do
	case $opt in
	f) faults=$OPTARG ;;
	s) scale=$OPTARG ;;
	m) modes=$OPTARG ;;
	r) rate=$OPTARG ;;
	o) out=$OPTARG ;;
	q) quick=1 ;;
	*) usage ;;
	esac
done
command="./scripts/bench-faults.sh $*"
invoked_from=$PWD
cd "$(dirname "$0")/.."

. scripts/lib/debian.sh
install_missing redis-server postgresql

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-faults.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The harness is the test binary of internal/faults, built without -race;
# it builds Caddy itself (go build ./cmd/caddy, cached between runs).
echo "building the harness..." >&2
go test -c -o "$work/faults.test" ./internal/faults

if [ -n "$out" ]; then
	case $out in /*) ;; *) out="$invoked_from/$out" ;; esac
	export OUT=$out
fi
source="the working tree at commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain -- '*.go' go.mod go.sum 2>/dev/null)" ]; then
	source="$source, with uncommitted changes"
fi
export FAULTS_SOURCE=$source FAULTS_COMMAND=$command
[ -n "$faults" ] && export FAULTS=$faults
[ -n "$scale" ] && export FAULTS_SCALE=$scale
[ -n "$modes" ] && export FAULTS_MODES=$modes
[ -n "$rate" ] && export FAULTS_RATE=$rate

cd internal/faults
if [ -n "$quick" ]; then
	exec "$work/faults.test" -test.run '^TestFaultsQuick$' -test.v -test.count=1
fi
FAULTS_FULL=1 "$work/faults.test" -test.run '^TestFaultsFull$' -test.count=1 -test.timeout=90m
