package caddyproc

import "testing"

func TestWithoutRace(t *testing.T) {
	if got := withoutRace("-buildvcs=false -race -tags=x"); got != "-buildvcs=false -tags=x" {
		t.Errorf("withoutRace = %q", got)
	}
}
