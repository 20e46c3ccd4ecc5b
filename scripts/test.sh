#!/usr/bin/env bash
# Runs every check the project has: go vet, gofmt, and the tests under the
# race detector. Tests that need Redis or PostgreSQL start their own
# servers, so this installs Debian's redis-server and postgresql when they
# are missing, and tzdata, whose zone names a calendar test lists.
set -euo pipefail
cd "$(dirname "$0")/.."

# Tests that need Redis or PostgreSQL run their own servers
# (internal/redistest, internal/pgtest), from redis-server and redis-cli,
# and from initdb and postgres on PATH or in Debian's
# /usr/lib/postgresql/*/bin.
. scripts/lib/debian.sh
install_missing redis-server postgresql tzdata

echo "== go vet"
go vet ./...

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:" >&2
	echo "$unformatted" >&2
	exit 1
fi

# The oldest Caddy the README claims (TestSupportedVersions checks that
# they agree): the plugin and its Caddy must build against it as they do
# against the Caddy of go.mod. The build uses copies of go.mod and go.sum
# in which only Caddy is downgraded (what lowering go.mod's requirement
# would do), so the repo's go.mod is never touched. Skipped by -short.
oldest_caddy=v2.11.5
if [[ " $* " != *" -short "* ]]; then
	echo "== go build and go vet against Caddy $oldest_caddy"
	modtmp=$(mktemp -d)
	trap 'rm -rf "$modtmp"' EXIT
	cp go.mod go.sum "$modtmp/"
	go get -modfile="$modtmp/go.mod" "github.com/caddyserver/caddy/v2@$oldest_caddy"
	go mod tidy -modfile="$modtmp/go.mod"
	if ! grep -q "github.com/caddyserver/caddy/v2 $oldest_caddy\$" "$modtmp/go.mod"; then
		echo "the build against Caddy $oldest_caddy resolved another Caddy:" >&2
		grep 'caddyserver/caddy/v2 ' "$modtmp/go.mod" >&2
		exit 1
	fi
	go build -modfile="$modtmp/go.mod" ./...
	go vet -modfile="$modtmp/go.mod" .
fi

echo "== go test -race"
# The log is kept so that a failure's name and message are printed again
# last: the servers' and Caddy's logs of a long package run would
# otherwise bury them where a CI tail cannot see them.
testlog=$(mktemp)
trap 'rm -rf "${modtmp:-}" "$testlog"' EXIT
status=0
go test -race -count=1 "$@" ./... 2>&1 | tee "$testlog" || status=$?
if [ "$status" -ne 0 ]; then
	echo "== failed tests (again, from the log above)"
	grep -E -A 12 -- '^\s*--- FAIL|^panic:|^FAIL\s' "$testlog" | grep -v -E '^\S+\s+(DEBUG|INFO)\s' || true
	exit "$status"
fi

# The lock order that syncapp/doc.go states, checked on every lock the
# tests take (internal/lockorder). Not under -race: the check serializes
# lock calls, which would hide races from the detector. The fleets' tests
# (TestFleet...) are left out: they take up to ten times as long so, and
# what they assert depends on round trips coming back in time.
echo "== go test -tags lockorder (the lock order)"
go test -tags lockorder -count=1 -skip 'TestFleet' "$@" ./internal/lockorder ./window ./syncapp 2>&1 | tee "$testlog" || status=$?
if [ "$status" -ne 0 ]; then
	echo "== failed tests (again, from the log above)"
	grep -E -A 12 -- '^\s*--- FAIL|^panic:|^FAIL\s' "$testlog" | grep -v -E '^\S+\s+(DEBUG|INFO)\s' || true
	exit "$status"
fi
