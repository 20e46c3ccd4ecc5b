package cfargs

import (
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestOne(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  string
		ok    bool
	}{
		{"key value", "value", true},
		{"key", "", false},
		{"key a b", "", false},
	} {
		d := caddyfile.NewTestDispenser(tc.input)
		d.Next()
		var got string
		err := One(d, &got)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("%q: got %q, %v", tc.input, got, err)
		}
	}
}
