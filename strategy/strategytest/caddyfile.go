package strategytest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// CaddyfileCase is a Caddyfile block of a store's module and the
// configuration it unmarshals to.
type CaddyfileCase struct {
	// Name names the case's subtest.
	Name string
	// Input is the block, starting with the module's name.
	Input string
	// Want is the JSON of the result, in any field order and spacing. A
	// field the module does not have fails the test.
	Want string
}

// CaddyfileError is a Caddyfile block that a store's module refuses.
type CaddyfileError struct {
	// Name names the case's subtest.
	Name string
	// Input is the block, starting with the module's name.
	Input string
	// Want are strings that the error contains, each of them.
	Want []string
}

// UnmarshalCaddyfile checks, in a subtest a case, that the module *M
// unmarshals each case's Input to its Want.
func UnmarshalCaddyfile[M any, PM interface {
	*M
	caddyfile.Unmarshaler
}](t *testing.T, cases []CaddyfileCase) {
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			var m M
			if err := PM(&m).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.Input)); err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if want := canonical[M](t, tc.Want); string(got) != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

// UnmarshalCaddyfileErrors checks, in a subtest a case, that the module
// *M refuses each case's Input with an error that contains its Want and
// does not show secret, a password that the inputs hold.
func UnmarshalCaddyfileErrors[M any, PM interface {
	*M
	caddyfile.Unmarshaler
}](t *testing.T, secret string, cases []CaddyfileError) {
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			var m M
			err := PM(&m).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.Input))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.Want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %q, want it to contain %q", err, w)
				}
			}
			if secret != "" && strings.Contains(err.Error(), secret) {
				t.Errorf("err = %q shows the password", err)
			}
		})
	}
}

// canonical returns the JSON text s as json.Marshal writes an M: fields in
// struct order, no spaces. A field that M does not have fails the test.
func canonical[M any](t *testing.T, s string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var m M
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("bad JSON in test: %v", err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
