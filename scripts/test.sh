#!/usr/bin/env bash
# Runs every check the project has: go vet, gofmt, and the tests under the
# race detector. Tests that need Redis or PostgreSQL start their own
# servers, so this installs Debian's redis-server and postgresql when they
# are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
	echo "redis-server not found: installing Debian's redis-server" >&2
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi

# Tests that need PostgreSQL run their own servers (internal/pgtest), from
# initdb and postgres on PATH or in Debian's /usr/lib/postgresql/*/bin.
if ! command -v initdb >/dev/null && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
	echo "initdb not found: installing Debian's postgresql" >&2
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq postgresql >/dev/null
fi

echo "== go vet"
go vet ./...

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi

echo "== go test -race"
go test -race -count=1 "$@" ./...
