package cfargs

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
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

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		input, want string
		ok          bool
	}{
		{"ban 5s", "5s", true},
		{"ban 0", "0s", true},
		{"ban -1s", `ban: want a duration of 0 or more, got "-1s"`, false},
		{"ban soon", `ban: want a duration of 0 or more, got "soon"`, false},
		{"ban", "wrong argument count", false},
	} {
		d := caddyfile.NewTestDispenser(tc.input)
		d.Next()
		var got caddy.Duration
		err := Duration(d, "ban", &got)
		switch {
		case tc.ok && (err != nil || time.Duration(got).String() != tc.want):
			t.Errorf("%q: got %v, %v; want %s", tc.input, time.Duration(got), err, tc.want)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want one with %q", tc.input, err, tc.want)
		}
	}
}

func TestInt(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  int
		err   string
	}{
		{"max_waiting 3", 3, ""},
		{"max_waiting 1", 1, ""},
		{"max_waiting 0", 0, `max_waiting: want a whole number of 1 or more, got "0"`},
		{"max_waiting 2.5", 0, `max_waiting: want a whole number of 1 or more, got "2.5"`},
		{"max_waiting 1 2", 0, "wrong argument count"},
	} {
		d := caddyfile.NewTestDispenser(tc.input)
		d.Next()
		var got int
		err := Int(d, "max_waiting", 1, &got)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%q: got %d, %v; want %d", tc.input, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one with %q", tc.input, err, tc.err)
		}
	}
}
