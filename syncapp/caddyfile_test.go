package syncapp

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
)

func TestGlobalOption(t *testing.T) {
	for i, tc := range []struct {
		input string
		want  string
	}{
		{`rate_limit`, `{}`},
		{`rate_limit {
			zone default {
				max_keys 1000
			}
			zone big {
				max_keys 5000000
			}
			namespace local {
				sync_rate off
			}
			namespace api {
				zone big
				sync_rate 100ms
				sync_above 0.8
				window_sizes 1s 1m
			}
			namespace strict {
				sync_rate 0
				on_store_failure SHARE
			}
			flush_timeout 2s
		}`, `{"zones":{"big":{"max_keys":5000000},"default":{"max_keys":1000}},` +
			`"namespaces":{"api":{"zone":"big","sync_rate":"100ms","sync_above":0.8,"window_sizes":[1000000000,60000000000]},` +
			`"local":{"sync_rate":"off"},"strict":{"sync_rate":"0","on_store_failure":"share"}},"flush_timeout":2000000000}`},
	} {
		got, err := parseGlobalOption(caddyfile.NewTestDispenser(tc.input), nil)
		if err != nil {
			t.Errorf("Test %d: %v", i, err)
			continue
		}
		if js := string(got.(httpcaddyfile.App).Value); js != tc.want {
			t.Errorf("Test %d:\n got %s\nwant %s", i, js, tc.want)
		}
	}
}

func TestGlobalOptionBlocksMerge(t *testing.T) {
	first, err := parseGlobalOption(caddyfile.NewTestDispenser(`rate_limit {
		zone z {
			max_keys 10
		}
	}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	merged, err := parseGlobalOption(caddyfile.NewTestDispenser(`rate_limit {
		namespace n {
			zone z
		}
	}`), first)
	if err != nil {
		t.Fatal(err)
	}
	var app App
	if err := json.Unmarshal(merged.(httpcaddyfile.App).Value, &app); err != nil {
		t.Fatal(err)
	}
	if app.Zones["z"] == nil || app.Namespaces["n"] == nil {
		t.Fatalf("merged app lost a block: %s", merged.(httpcaddyfile.App).Value)
	}
	_, err = parseGlobalOption(caddyfile.NewTestDispenser(`rate_limit {
		zone z {
			max_keys 20
		}
	}`), merged)
	if err == nil || !strings.Contains(err.Error(), `zone "z" is defined twice`) {
		t.Fatalf("a zone defined twice: error = %v", err)
	}
}

func TestGlobalOptionBadInput(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  string
	}{
		{`rate_limit { zone z { max_keys 0 } }`, `max_keys: want a whole number of 1 or more, got "0"`},
		{`rate_limit { zone z { max_keys lots } }`, `max_keys: want a whole number of 1 or more, got "lots"`},
		{`rate_limit { zone z { capacity 5 } }`, `unrecognized subdirective 'capacity'`},
		{`rate_limit { namespace n { sync_rate 500us } }`, `sync_rate: 500µs is too short`},
		{`rate_limit { namespace n { sync_rate sometimes } }`, `sync_rate: invalid value "sometimes"`},
		{`rate_limit { namespace n { sync_above 0 } }`, `namespace "n": sync_above: "0" is not a fraction of a limit: want a number in (0, 1]`},
		{`rate_limit { namespace n { sync_above 1.01 } }`, `sync_above: "1.01" is not a fraction`},
		{`rate_limit { namespace n { sync_above most } }`, `sync_above: "most" is not a fraction`},
		{`rate_limit { namespace n { sync_above } }`, `wrong argument count`},
		{`rate_limit { namespace n { on_store_failure block } }`, `namespace "n": on_store_failure: unknown policy "block": want allow, share or deny`},
		{`rate_limit { namespace n { on_store_failure } }`, `wrong argument count`},
		{`rate_limit { namespace n { window_sizes 1m -1s } }`, `window_sizes: invalid window "-1s"`},
		{`rate_limit { namespace n { window_sizes } }`, `wrong argument count`},
		{`rate_limit { namespace n { strategy nosuch } }`, `rate_limit.strategies.nosuch`},
		{`rate_limit { namespace n { speed 5 } }`, `unrecognized subdirective 'speed'`},
		{`rate_limit { namespace n { } namespace n { } }`, `namespace "n" is defined twice`},
		{"rate_limit { namespace n { sync_rate 1s\nsync_rate 2s } }", `duplicate subdirective 'sync_rate'`},
		{`rate_limit { flush_timeout soon }`, `flush_timeout: want a duration of 0 or more, got "soon"`},
		{`rate_limit { bogus }`, `unrecognized subdirective 'bogus'`},
		{`rate_limit extra`, `wrong argument count`},
	} {
		// Blocks are written on one line above for brevity; a Caddyfile
		// has them on lines of their own.
		input := strings.NewReplacer("{ ", "{\n", " }", "\n}").Replace(tc.input)
		_, err := parseGlobalOption(caddyfile.NewTestDispenser(input), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want %q", tc.input, err, tc.want)
		}
	}
}
