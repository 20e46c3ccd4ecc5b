#!/usr/bin/env bash
# Runs every check the project has: go vet, gofmt, and the tests under the
# race detector. Tests that need Redis or PostgreSQL start their own
# servers, so this installs Debian's redis-server and postgresql when they
# are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Tests that need Redis or PostgreSQL run their own servers
# (internal/redistest, internal/pgtest), from redis-server and redis-cli,
# and from initdb and postgres on PATH or in Debian's
# /usr/lib/postgresql/*/bin.
. scripts/lib/debian.sh
install_missing redis-server postgresql

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
