package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"testing"
)

// Behind trusted proxies the default key is the forwarded client's
// address; a keyed handler with the address as its fallback keeps keyed
// and anonymous clients apart, and anonymous ones from each other; an
// IPv6 client is its /64 by default, and ipv4_prefix groups IPv4 ones.
// Handlers of one namespace count a key in one counter, so each route
// here gets addresses of its own.
func TestClientKeysBehindTrustedProxies(t *testing.T) {
	tester := loadWithOptions(t, `
	servers {
		trusted_proxies static private_ranges
	}`, `
	http://localhost:9080 {
		rate_limit /default {
			limit 1 1h
		}
		rate_limit /keyed {
			key {http.request.header.X-API-Key} {client_ip}
			limit 1 1h
		}
		rate_limit /v6whole {
			limit 1 1h
			ipv6_prefix 128
		}
		rate_limit /login {
			key login-{client_ip}
			limit 1 1h
		}
		rate_limit /v4net {
			limit 1 1h
			ipv4_prefix 24
		}
		respond "ok"
	}`)
	// Addresses of this run only: the default zone keeps its counts
	// across the tests' loads.
	r := rand.Uint32()
	v4 := func(net, host int) string { return fmt.Sprintf("10.%d.%d.%d", (r>>8)&0xff, net, host) }
	v6 := func(net, host int) string { return fmt.Sprintf("2001:db8:%x:%x::%x", r&0xffff, net, host) }
	status := func(path, forwarded string, headers ...string) int {
		t.Helper()
		resp, _ := send(t, tester, http.MethodGet, path, "", append([]string{"X-Forwarded-For", forwarded}, headers...)...)
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name    string
		path    string
		from    string
		headers []string
		want    int
	}{
		{"client A", "/default", v4(1, 1), nil, 200},
		{"client A again", "/default", v4(1, 1), nil, 429},
		{"client B, its own key", "/default", v4(1, 2), nil, 200},

		{"client C keyed", "/keyed", v4(4, 1), []string{"X-API-Key", fmt.Sprint("key-", r)}, 200},
		{"client C anonymous: its address, not its API key's counter", "/keyed", v4(4, 1), nil, 200},
		{"client D anonymous: another address", "/keyed", v4(4, 2), nil, 200},
		{"client C anonymous again", "/keyed", v4(4, 1), nil, 429},
		{"another client with C's API key", "/keyed", v4(4, 3), []string{"X-API-Key", fmt.Sprint("key-", r)}, 429},

		{"IPv6 client", "/default", v6(1, 1), nil, 200},
		{"another address of its /64", "/default", v6(1, 2), nil, 429},
		{"an address of another /64", "/default", v6(2, 1), nil, 200},

		{"IPv6 client, ipv6_prefix 128", "/v6whole", v6(3, 1), nil, 200},
		{"another address of its /64, ipv6_prefix 128", "/v6whole", v6(3, 2), nil, 200},
		{"the first address again, ipv6_prefix 128", "/v6whole", v6(3, 1), nil, 429},

		{"IPv6 client, key login-{client_ip}", "/login", v6(4, 1), nil, 200},
		{"another address of its /64, key login-{client_ip}", "/login", v6(4, 2), nil, 429},

		{"IPv4 client, ipv4_prefix 24", "/v4net", v4(2, 1), nil, 200},
		{"another address of its /24", "/v4net", v4(2, 2), nil, 429},
		{"an address of another /24", "/v4net", v4(3, 1), nil, 200},
	} {
		if got := status(tc.path, tc.from, tc.headers...); got != tc.want {
			t.Errorf("%s (%s from %s): %d, want %d", tc.name, tc.path, tc.from, got, tc.want)
		}
	}
}

// Through a chain of two Caddy servers, the first a reverse_proxy in
// front of the limited one, both trusting the private ranges as a fleet
// behind a load balancer does: two clients with different
// X-Forwarded-For are limited apart by default, and one client keeps its
// counter whichever hop it comes through.
func TestClientKeysThroughAReverseProxyChain(t *testing.T) {
	tester := loadWithOptions(t, `
	servers {
		trusted_proxies static private_ranges
	}`, `
	http://localhost:9080 {
		reverse_proxy localhost:9082
	}
	http://localhost:9082 {
		rate_limit {
			limit 1 1h
		}
		respond "ok"
	}`)
	r := rand.Uint32()
	client := func(host int) string { return fmt.Sprintf("10.%d.%d.%d", (r>>16)&0xff, (r>>8)&0xff, host) }
	through := func(url, from string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-Forwarded-For", from)
		resp, err := tester.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		name, url, from string
		want            int
	}{
		{"client A through the proxy", "http://localhost:9080/", client(1), 200},
		{"client B through the proxy", "http://localhost:9080/", client(2), 200},
		{"client A again through the proxy", "http://localhost:9080/", client(1), 429},
		{"client B again, straight to the limited server", "http://localhost:9082/", client(2), 429},
		{"client C straight to the limited server", "http://localhost:9082/", client(3), 200},
	} {
		if got := through(tc.url, tc.from); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
