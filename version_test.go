package ratelimit

import (
	"os"
	"regexp"
	"testing"
	"time"
)

// TestChangelogNamesVersion checks that CHANGELOG.md and Version agree:
// the newest release heading under [Unreleased] is Version's, with a date,
// and its link reference exists.
func TestChangelogNamesVersion(t *testing.T) {
	data, err := os.ReadFile("CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if !regexp.MustCompile(`(?m)^## \[Unreleased\]$`).MatchString(text) {
		t.Error("CHANGELOG.md has no ## [Unreleased] section")
	}
	releases := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+[^\]]*)\] - (\d{4}-\d{2}-\d{2})$`).FindAllStringSubmatch(text, -1)
	if len(releases) == 0 {
		t.Fatal("CHANGELOG.md has no release heading such as ## [0.1.0] - 2026-11-27")
	}
	if newest := releases[0][1]; newest != Version {
		t.Errorf("the newest release in CHANGELOG.md is %s, but Version is %s", newest, Version)
	}
	if _, err := time.Parse(time.DateOnly, releases[0][2]); err != nil {
		t.Errorf("release %s: date %q: %v", releases[0][1], releases[0][2], err)
	}
	if !regexp.MustCompile(`(?m)^\[` + regexp.QuoteMeta(Version) + `\]: https://`).MatchString(text) {
		t.Errorf("CHANGELOG.md has no link reference [%s]: https://...", Version)
	}
}

// TestSupportedVersions checks that the versions the README claims are
// those that are built: the newest Caddy is the one go.mod requires (every
// test runs against it), the oldest is the one scripts/test.sh builds
// against, and Go's is go.mod's go line.
func TestSupportedVersions(t *testing.T) {
	read := func(name string) string {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	readme, gomod, script := read("README.md"), read("go.mod"), read("scripts/test.sh")
	claim := regexp.MustCompile(`(?m)^\| Caddy \| (v2\.\d+\.\d+) to (v2\.\d+\.\d+) \|`).FindStringSubmatch(readme)
	if claim == nil {
		t.Fatal("README.md has no row | Caddy | <oldest> to <newest> | in its supported versions")
	}
	required := regexp.MustCompile(`(?m)^\s*github\.com/caddyserver/caddy/v2 (v\S+)$`).FindStringSubmatch(gomod)
	if required == nil || required[1] != claim[2] {
		t.Errorf("README.md claims Caddy up to %s, go.mod requires %v", claim[2], required)
	}
	oldest := regexp.MustCompile(`(?m)^oldest_caddy=(\S+)$`).FindStringSubmatch(script)
	if oldest == nil || oldest[1] != claim[1] {
		t.Errorf("README.md claims Caddy from %s, scripts/test.sh builds against %v", claim[1], oldest)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(gomod)
	if goLine == nil {
		t.Fatal("go.mod has no go line")
	}
	if !regexp.MustCompile(`(?m)^\| Go \| ` + regexp.QuoteMeta(goLine[1]) + ` or later `).MatchString(readme) {
		t.Errorf("README.md does not claim Go %s or later, go.mod's go line", goLine[1])
	}
}
