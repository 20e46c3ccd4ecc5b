package ratelimit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// Defaults of the networks an address key is masked to.
const (
	// DefaultIPv4Prefix keeps an IPv4 address whole.
	DefaultIPv4Prefix = 32
	// DefaultIPv6Prefix masks an IPv6 address to its /64, the network an
	// ISP hands one customer: a client cycling through its addresses is
	// one client.
	DefaultIPv6Prefix = 64
)

// clientKeys returns how a handler builds a request's key: the first of
// templates (the key, then its fallbacks) that renders non-empty, or ""
// when none does. A placeholder's value that is an IP address is masked
// to its network (see maskAddress), in a key of one placeholder as in
// one that puts it among other text ("login-{client_ip}").
func clientKeys(templates []string, v4bits, v6bits int) func(*http.Request, *caddy.Replacer) string {
	funcs := make([]func(*http.Request, *caddy.Replacer) string, len(templates))
	for i, t := range templates {
		funcs[i] = maskedKey(t, v4bits, v6bits)
	}
	if len(funcs) == 1 {
		return funcs[0]
	}
	return func(r *http.Request, repl *caddy.Replacer) string {
		for _, f := range funcs {
			if k := f(r, repl); k != "" {
				return k
			}
		}
		return ""
	}
}

// maskedKey returns how one template renders, its addresses masked.
func maskedKey(template string, v4bits, v6bits int) func(*http.Request, *caddy.Replacer) string {
	if _, ok := singlePlaceholder(template); ok || !strings.Contains(template, "{") {
		render := keyFunc(template)
		return func(r *http.Request, repl *caddy.Replacer) string {
			return maskAddress(render(r, repl), v4bits, v6bits)
		}
	}
	mask := func(_ string, v any) (any, error) {
		if s, ok := v.(string); ok {
			return maskAddress(s, v4bits, v6bits), nil
		}
		return v, nil
	}
	return func(_ *http.Request, repl *caddy.Replacer) string {
		k, _ := repl.ReplaceFunc(template, mask) // mask never fails
		return k
	}
}

// maskAddress returns key, or when key is an IP address, its network of
// v4bits or v6bits written as a prefix ("2001:db8:1:2::/64"): an IPv4
// address kept whole (32 bits, the default) stays as it is, so that the
// default key of an IPv4 client is its address. An IPv4-mapped IPv6
// address is the IPv4 one, and a zone is dropped.
func maskAddress(key string, v4bits, v6bits int) string {
	if v4bits == 32 && strings.IndexByte(key, ':') < 0 {
		return key // no IPv6 address; an IPv4 one kept whole
	}
	addr, err := netip.ParseAddr(key)
	if err != nil {
		return key
	}
	addr = addr.Unmap().WithZone("")
	bits := v6bits
	if addr.Is4() {
		bits = v4bits
	}
	if bits == addr.BitLen() {
		return addr.String()
	}
	p, err := addr.Prefix(bits)
	if err != nil {
		return key // bits are checked at provision
	}
	return p.String()
}

// checkPrefix checks an ipv4_prefix or ipv6_prefix: 1 to max bits.
func checkPrefix(field string, bits, max int) error {
	if bits < 1 || bits > max {
		return fmt.Errorf("%s: %d is not a network's prefix length: want 1 to %d", field, bits, max)
	}
	return nil
}
