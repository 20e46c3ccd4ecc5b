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
