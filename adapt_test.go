package ratelimit

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// caddyAdapt adapts a Caddyfile to JSON.
func caddyAdapt(src string) ([]byte, []caddyconfig.Warning, error) {
	return caddyconfig.GetAdapter("caddyfile").Adapt([]byte(src), nil)
}

// TestCaddyfileAdapt compares each testdata/*.caddyfiletest, a Caddyfile
// and the JSON it must adapt to, separated by a line of dashes.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		caddyfile, json, ok := strings.Cut(string(data), "----------")
		if !ok {
			t.Fatalf("%s: no ---------- line", f)
		}
		if !caddytest.CompareAdapt(t, f, caddyfile, "caddyfile", strings.TrimSpace(json)) {
			t.Errorf("%s: adapted JSON differs", f)
		}
	}
}
