package ratelimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestMaskAddress(t *testing.T) {
	for _, tc := range []struct {
		key            string
		v4bits, v6bits int
		want           string
	}{
		{"203.0.113.7", 32, 64, "203.0.113.7"},
		{"203.0.113.7", 24, 64, "203.0.113.0/24"},
		{"2001:db8:1:2:aaaa::1", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:bbbb::9", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:3::1", 32, 64, "2001:db8:1:3::/64"},
		{"2001:DB8::1", 32, 128, "2001:db8::1"},        // whole: the address as Go writes it
		{"2001:db8::1", 32, 48, "2001:db8::/48"},       // a shorter network
		{"fe80::1%eth0", 32, 64, "fe80::/64"},          // the zone dropped
		{"::ffff:203.0.113.7", 32, 64, "203.0.113.7"},  // IPv4-mapped: the IPv4 address
		{"::ffff:203.0.113.7", 16, 64, "203.0.0.0/16"}, // and its network
		{"api-key-1", 24, 64, "api-key-1"},             // not an address
		{"a:b", 32, 64, "a:b"},
		{"", 24, 64, ""},
		{"[2001:db8::1]", 32, 64, "[2001:db8::1]"}, // not an address either
	} {
		if got := maskAddress(tc.key, tc.v4bits, tc.v6bits); got != tc.want {
			t.Errorf("maskAddress(%q, %d, %d) = %q, want %q", tc.key, tc.v4bits, tc.v6bits, got, tc.want)
		}
	}
}

// The key is the first template that renders non-empty, masked when it is
// an address; "" when none does.
func TestClientKeysFallBack(t *testing.T) {
	request := func(remote string, headers ...string) (*http.Request, *caddy.Replacer) {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		r.RemoteAddr = remote
		for i := 0; i+1 < len(headers); i += 2 {
			r.Header.Set(headers[i], headers[i+1])
		}
		repl := caddy.NewReplacer()
		return caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil), repl
	}
	key := clientKeys([]string{"{http.request.header.X-API-Key}", "{http.request.header.X-Alt}", "{http.request.remote.host}"}, 32, 64)
	for _, tc := range []struct {
		remote  string
		headers []string
		want    string
	}{
		{"203.0.113.7:1", []string{"X-API-Key", "k1", "X-Alt", "alt"}, "k1"},
		{"203.0.113.7:1", []string{"X-Alt", "alt"}, "alt"},
		{"203.0.113.7:1", nil, "203.0.113.7"},
		{"[2001:db8:1:2::7]:1", nil, "2001:db8:1:2::/64"},
		{"[2001:db8:1:2::7]:1", []string{"X-API-Key", "2001:db8:9:9::1"}, "2001:db8:9:9::/64"},
		{"@", nil, "@"},
	} {
		r, repl := request(tc.remote, tc.headers...)
		if got := key(r, repl); got != tc.want {
			t.Errorf("remote %s, headers %v: key %q, want %q", tc.remote, tc.headers, got, tc.want)
		}
	}
	composite := clientKeys([]string{"login-{http.request.remote.host}-{http.request.header.X-Alt}"}, 32, 64)
	if r, repl := request("[2001:db8:1:2::7]:1", "X-Alt", "2001:db8:5:6::1"); composite(r, repl) != "login-2001:db8:1:2::/64-2001:db8:5:6::/64" {
		t.Errorf("a key of text and addresses: %q, want each address masked", composite(r, repl))
	}
	none := clientKeys([]string{"{http.request.header.X-API-Key}", "{http.request.header.X-Alt}"}, 32, 64)
	if r, repl := request("203.0.113.7:1"); none(r, repl) != "" {
		t.Errorf("no template renders: key %q, want the empty key", none(r, repl))
	}
}

// {client_ip}, the Caddyfile's shorthand, means {http.vars.client_ip} in
// JSON too, and a request no Caddy server prepared is keyed by its remote
// host.
func TestClientIPKey(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
	r.RemoteAddr = "192.0.2.1:5"
	repl := caddy.NewReplacer()
	for _, template := range []string{"{client_ip}", "{http.vars.client_ip}", DefaultKey} {
		if got := keyFunc(template)(r, repl); got != "192.0.2.1" {
			t.Errorf("%s of an unprepared request: %q, want its remote host", template, got)
		}
	}
	r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
	caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "198.51.100.4")
	if got := keyFunc("{client_ip}")(r, repl); got != "198.51.100.4" {
		t.Errorf("{client_ip}: %q, want the variable's 198.51.100.4", got)
	}
}

// What the default key costs per request, against rendering it without
// masking: an IPv4 client (no parse) and an IPv6 one (masked to its /64).
func BenchmarkClientKey(b *testing.B) {
	for _, remote := range []string{"203.0.113.7:4711", "[2001:db8:1:2::7]:4711"} {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		r.RemoteAddr = remote
		repl := caddy.NewReplacer()
		r = caddyhttp.PrepareRequest(r, repl, httptest.NewRecorder(), nil)
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, remote[:strings.LastIndexByte(remote, ':')])
		for name, key := range map[string]func(*http.Request, *caddy.Replacer) string{
			"unmasked": keyFunc(DefaultKey),
			"masked":   clientKeys([]string{DefaultKey}, DefaultIPv4Prefix, DefaultIPv6Prefix),
		} {
			b.Run(remote+"/"+name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = key(r, repl)
				}
			})
		}
	}
}
