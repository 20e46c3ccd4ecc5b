package machine

import (
	"runtime"
	"strings"
	"testing"
)

func TestDescribe(t *testing.T) {
	if got := Describe(); !strings.Contains(got, runtime.GOOS+"/"+runtime.GOARCH) || !strings.Contains(got, "cores") {
		t.Fatalf("Describe() = %q, want the cores and %s/%s", got, runtime.GOOS, runtime.GOARCH)
	}
}

func TestVersion(t *testing.T) {
	if got := Version("go", "version"); !strings.HasPrefix(got, "go version") {
		t.Fatalf("Version(go version) = %q", got)
	}
	if got := Version("no-such-command-here"); got != "" {
		t.Fatalf("Version of a missing command = %q, want empty", got)
	}
}
