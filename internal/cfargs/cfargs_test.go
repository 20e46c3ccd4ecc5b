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
	// Each reader starts from 7, which an error must leave alone.
	readInt := func(d *caddyfile.Dispenser) (int64, error) {
		got := 7
		err := Int(d, "max_waiting", 1, &got)
		return int64(got), err
	}
	readInt32 := func(d *caddyfile.Dispenser) (int64, error) {
		got := int32(7)
		err := Int32(d, "max_conns", 0, &got)
		return int64(got), err
	}
	for _, tc := range []struct {
		input string
		read  func(*caddyfile.Dispenser) (int64, error)
		want  int64
		err   string
	}{
		{"max_waiting 3", readInt, 3, ""},
		{"max_waiting 1", readInt, 1, ""},
		{"max_waiting 0", readInt, 7, `max_waiting: want a whole number of 1 or more, got "0"`},
		{"max_waiting 2.5", readInt, 7, `max_waiting: want a whole number of 1 or more, got "2.5"`},
		{"max_waiting 1 2", readInt, 7, "wrong argument count"},
		{"max_conns 0", readInt32, 0, ""},
		{"max_conns 2147483647", readInt32, 2147483647, ""},
		{"max_conns -1", readInt32, 7, `max_conns: want a whole number from 0 to 2147483647, got "-1"`},
		{"max_conns 3000000000", readInt32, 7, `max_conns: want a whole number from 0 to 2147483647, got "3000000000"`},
		{"max_conns ten", readInt32, 7, `max_conns: want a whole number from 0 to 2147483647, got "ten"`},
		{"max_conns", readInt32, 7, "wrong argument count"},
	} {
		d := caddyfile.NewTestDispenser(tc.input)
		d.Next()
		got, err := tc.read(d)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%q: got %d, %v; want %d", tc.input, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || got != tc.want):
			t.Errorf("%q: got %d, error %v; want %d and an error with %q", tc.input, got, err, tc.want, tc.err)
		}
	}
}

func TestList(t *testing.T) {
	d := caddyfile.NewTestDispenser("addresses a:1 b:2\naddresses c:3\naddresses")
	var got []string
	for range 2 {
		d.Next()
		if err := List(d, &got); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(got, " ") != "a:1 b:2 c:3" {
		t.Errorf("got %q, want the arguments of both lines", got)
	}
	d.Next()
	if err := List(d, &got); err == nil || !strings.Contains(err.Error(), "wrong argument count") {
		t.Errorf("no arguments: error %v, want an argument count error", err)
	}
}

func TestFlagAndNoArgs(t *testing.T) {
	d := caddyfile.NewTestDispenser("insecure_skip_verify\ninsecure_skip_verify yes")
	d.Next()
	var on bool
	if err := Flag(d, &on); err != nil || !on {
		t.Errorf("flag alone: %v, %v; want true", on, err)
	}
	d.Next()
	on = false
	if err := Flag(d, &on); err == nil || on {
		t.Errorf("flag with an argument: %v, %v; want an error, unset", on, err)
	}
	d = caddyfile.NewTestDispenser("redis\nredis extra")
	d.Next()
	if err := NoArgs(d); err != nil {
		t.Errorf("no argument: %v", err)
	}
	d.Next()
	if err := NoArgs(d); err == nil || !strings.Contains(err.Error(), "wrong argument count") {
		t.Errorf("an argument: %v, want an argument count error", err)
	}
}

func TestBlock(t *testing.T) {
	// parse records the arguments of the subdirectives one and many.
	parse := func(d *caddyfile.Dispenser, got map[string][]string) map[string]func() error {
		m := make(map[string]func() error)
		for _, name := range []string{"one", "many"} {
			m[name] = func() error {
				got[name] = append(got[name], d.RemainingArgs()...)
				return nil
			}
		}
		return m
	}
	for _, tc := range []struct {
		input, kind, want, err string
	}{
		{"x {\n one a\n many b\n many c\n}\ny", "", "many=b,c one=a", ""},
		{"x {\n}", "", "", ""},
		{"x", "", "", ""},
		{"x {\n one a\n one b\n}", "", "", "duplicate subdirective 'one'"},
		{"x {\n two a\n}", "", "", "unrecognized subdirective 'two'"},
		{"x {\n two a\n}", "tls", "", "unrecognized tls subdirective 'two'"},
		{"x {\n one a\n one b\n}", "tls", "", "duplicate tls subdirective 'one'"},
	} {
		d := caddyfile.NewTestDispenser(tc.input)
		d.Next()
		got := make(map[string][]string)
		err := Block(d, tc.kind, parse(d, got), "many")
		var parts []string
		for _, name := range []string{"many", "one"} {
			if args, ok := got[name]; ok {
				parts = append(parts, name+"="+strings.Join(args, ","))
			}
		}
		switch {
		case tc.err == "" && (err != nil || strings.Join(parts, " ") != tc.want):
			t.Errorf("%q: got %q, %v; want %q", tc.input, parts, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one with %q", tc.input, err, tc.err)
		}
	}
}

func TestModule(t *testing.T) {
	var dsn string
	parse := func(d *caddyfile.Dispenser) map[string]func() error {
		return map[string]func() error{"dsn": func() error { return One(d, &dsn) }}
	}
	d := caddyfile.NewTestDispenser("postgres {\n dsn a\n}\nnext")
	if err := Module(d, parse(d)); err != nil || dsn != "a" {
		t.Errorf("a block: dsn %q, error %v", dsn, err)
	}
	if !d.Next() || d.Val() != "next" {
		t.Errorf("after the block: at %q, want next", d.Val())
	}
	d = caddyfile.NewTestDispenser("postgres extra")
	if err := Module(d, parse(d)); err == nil || !strings.Contains(err.Error(), "wrong argument count") {
		t.Errorf("an argument: error %v, want an argument count error", err)
	}
}

// Secret reads one value, and its errors show none of the tokens.
func TestSecret(t *testing.T) {
	for _, tc := range []struct {
		input, want string
	}{
		{"password S3cret", ""},
		{"password", "got 0 arguments"},
		{"password my S3cret", "got 2 arguments (quote it)"},
	} {
		d := caddyfile.NewTestDispenser(tc.input)
		d.Next()
		var got string
		err := Secret(d, "password", "quote it", &got)
		switch {
		case tc.want == "" && (err != nil || got != "S3cret"):
			t.Errorf("%q: %q, %v", tc.input, got, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want one containing %q", tc.input, err, tc.want)
		case err != nil && strings.Contains(err.Error(), "S3cret"):
			t.Errorf("%q: the error shows the secret: %v", tc.input, err)
		}
	}
}
