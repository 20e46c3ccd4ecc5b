#!/usr/bin/env bash
# Measures what the rate_limit handler costs over HTTP: builds Caddy with
# the plugin once, serves a bare route and rate-limited routes from one
# process on loopback (scripts/bench-http.Caddyfile), with its own
# redis-server, drives them with wrk in interleaved pairs and prints the
# ratio limited/bare per case (cmd/bench-http does the runs and the report).
#
#	./scripts/bench-http.sh                     # 7 cases x 5 pairs of 3 s runs: about 4 minutes
#	QUICK=1 ./scripts/bench-http.sh             # 2 pairs of 1 s runs: a smoke test
#	PROFILE=local ./scripts/bench-http.sh       # also a 10 s CPU profile of Caddy under /local load
#
# Settings, from the environment:
#	PAIRS=5 DURATION=3s WARMUP=1s CONNECTIONS=32 THREADS=1
#	CASES=local,local-kong,local-both,local-hidden,local-one,local-newkey,periodic,sync,sync-100,draft-only,headers-only  (a subset, in any order)
#	PROFILE=<case or bare> PROFILE_OUT=caddy-<case>.pprof PROFILE_SECONDS=10
#
# It installs Debian's wrk and redis-server when they are missing, and
# never touches the machine's own Redis: its redis-server, like Caddy, runs
# on a free loopback port and is stopped at exit.
set -euo pipefail

# How this was invoked, with the settings that were given, for the report.
command="./scripts/bench-http.sh"
for v in QUICK PAIRS DURATION WARMUP CONNECTIONS THREADS CASES PROFILE PROFILE_OUT PROFILE_SECONDS; do
	[ -n "${!v:-}" ] && command="$v=${!v} $command"
done
invoked_from=$PWD
cd "$(dirname "$0")/.."

. scripts/lib/debian.sh
install_missing wrk redis-server

if [ -n "${QUICK:-}" ] && [ "${QUICK}" != 0 ]; then
	: "${PAIRS:=2}" "${DURATION:=1s}" "${WARMUP:=1s}" "${PROFILE_SECONDS:=3}"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-http.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "building Caddy with the plugin and the harness..." >&2
go build -o "$work/caddy" ./cmd/caddy
go build -o "$work/bench-http" ./cmd/bench-http

profile_out=""
if [ -n "${PROFILE:-}" ]; then
	profile_out=${PROFILE_OUT:-caddy-$PROFILE.pprof}
	case $profile_out in /*) ;; *) profile_out="$invoked_from/$profile_out" ;; esac
fi

# The harness stops Caddy and its redis-server itself, also on Ctrl-C;
# the kernel kills them if the harness is killed outright.
"$work/bench-http" \
	-caddy "$work/caddy" \
	-caddyfile scripts/bench-http.Caddyfile \
	-workdir "$work" \
	-command "$command" \
	-pairs "${PAIRS:-5}" \
	-duration "${DURATION:-3s}" \
	-warmup "${WARMUP:-1s}" \
	-connections "${CONNECTIONS:-32}" \
	-threads "${THREADS:-1}" \
	-cases "${CASES:-}" \
	-profile "${PROFILE:-}" \
	-profile-out "$profile_out" \
	-profile-seconds "${PROFILE_SECONDS:-10}s"

if [ -n "$profile_out" ]; then
	echo
	echo "== go tool pprof -top -nodecount=30 $profile_out"
	go tool pprof -top -nodecount=30 "$work/caddy" "$profile_out" 2>/dev/null
	echo
	# The handler's callees, then its lines: the line that calls next holds
	# the rest of the route, every other line the handler's own cost.
	handler='ratelimit\.\(\*Handler\)\.ServeHTTP$'
	echo "== go tool pprof -peek '$handler' $profile_out"
	go tool pprof -peek "$handler" "$work/caddy" "$profile_out" 2>/dev/null
	echo
	echo "== go tool pprof -list '$handler' $profile_out (source as it is now, built at the start of this run)"
	go tool pprof -list "$handler" "$work/caddy" "$profile_out" 2>/dev/null
fi
