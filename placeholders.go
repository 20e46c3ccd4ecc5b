package ratelimit

import (
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// placeholderPrefix starts the name of every placeholder the handler sets.
const placeholderPrefix = "http.rate_limit."

// stateKey is a placeholder no one writes: asking the replacer for it
// finds the placeholders a rate_limit handler already registered for the
// request. Every request asks, and the replacer asks each provider before
// ours, so the key is shorter than every prefix and name Caddy's providers
// look for (env., file., http.request.…): each turns it down on its length
// alone, without comparing bytes. (In a CPU profile of Caddy under load,
// looking up the former key, http.rate_limit.\x00state, took a fifth of
// the handler's own time, most of it in Caddy's http.* provider.)
const stateKey = "\x00rl"

// placeholders answers the request's http.rate_limit.* placeholders. The
// first rate_limit handler of a request registers it as a replacer
// provider (a method value: one small allocation, instead of six replacer
// entries), and every later one overwrites its values, so the
// placeholders describe the last handler that counted the request, which
// is the one that rejected it, if any. Values are boxed or formatted only
// when something reads them.
type placeholders struct {
	lim       *limit // the limit shown, which also knows its namespace
	remaining int
	reset     int
	exceeded  bool
	// concurrency: max_concurrent rejected the request, so the policy
	// is the concurrency policy.
	concurrency bool
}

// findPlaceholders returns the placeholders an earlier rate_limit handler
// registered for the request, if any.
func findPlaceholders(repl *caddy.Replacer) *placeholders {
	if v, ok := repl.Get(stateKey); ok {
		return v.(*placeholders)
	}
	return nil
}

// get is the replacer provider.
func (p *placeholders) get(key string) (any, bool) {
	if key == stateKey {
		return p, true
	}
	name, ok := strings.CutPrefix(key, placeholderPrefix)
	if !ok {
		return nil, false
	}
	switch name {
	case "namespace":
		return p.lim.nsValue, true
	case "exceeded":
		return p.exceeded, true
	case "window":
		return p.lim.nameValue, true
	case "limit":
		return p.lim.limitAsAny, true
	case "remaining":
		return strconv.Itoa(p.remaining), true
	case "reset":
		return strconv.Itoa(p.reset), true
	case "policy":
		if p.concurrency {
			return p.lim.concurrencyValue, true
		}
		return p.lim.policyValue, true
	}
	return nil, false
}

// keyFunc returns how a handler builds its key for a request. A key that
// is one placeholder, as most are, is looked up directly, which is what
// ReplaceAll does for it without parsing the template or building a
// string. The most common ones are read from the request the way Caddy's
// own provider of http.* placeholders reads them, which also spares asking
// every provider in turn and boxing the value into an interface: the
// client address (the default key), a request header, the query string,
// and a variable (http.vars.*, such as {client_ip}). The one difference is
// that a static value another module set under that exact name with
// Replacer.Set, which no Caddy module does, would not be seen.
func keyFunc(template string) func(r *http.Request, repl *caddy.Replacer) string {
	name, ok := singlePlaceholder(template)
	switch {
	case !ok:
		return func(_ *http.Request, repl *caddy.Replacer) string { return repl.ReplaceAll(template, "") }
	case name == "http.request.remote.host":
		return func(r *http.Request, _ *caddy.Replacer) string { return remoteHost(r) }
	case name == "http.vars.client_ip" || name == "client_ip":
		// "{client_ip}" is the Caddyfile's shorthand, which JSON does not
		// expand: a key copied from a Caddyfile means the same.
		return clientIP
	case strings.HasPrefix(name, "http.request.header."):
		field := textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(name, "http.request.header."))
		return func(r *http.Request, _ *caddy.Replacer) string { return strings.Join(r.Header[field], ",") }
	case name == "http.request.uri.query":
		return func(r *http.Request, _ *caddy.Replacer) string { return r.URL.RawQuery }
	case strings.HasPrefix(name, "http.vars."):
		v := strings.TrimPrefix(name, "http.vars.")
		return func(r *http.Request, _ *caddy.Replacer) string {
			return caddy.ToString(caddyhttp.GetVar(r.Context(), v))
		}
	}
	return func(_ *http.Request, repl *caddy.Replacer) string {
		v, _ := repl.Get(name)
		return caddy.ToString(v)
	}
}

// remoteHost is {http.request.remote.host}: the host of the client's
// address, or the whole address when it has no port (a Unix socket), and
// nothing before a QUIC handshake completes, whose address may be forged.
func remoteHost(r *http.Request) string {
	if r.TLS != nil && !r.TLS.HandshakeComplete {
		return ""
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// clientIP is {http.vars.client_ip}: the client's address as the server
// determined it (behind its trusted_proxies, the forwarded one), and, as
// remoteHost, nothing before a QUIC handshake completes. A request that
// no Caddy server prepared has no such variable: its remote host.
func clientIP(r *http.Request, _ *caddy.Replacer) string {
	v := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey)
	switch {
	case v == nil:
		return remoteHost(r)
	case r.TLS != nil && !r.TLS.HandshakeComplete:
		return ""
	}
	if ip, ok := v.(string); ok {
		return ip
	}
	return caddy.ToString(v)
}

// singlePlaceholder reports whether template is exactly one placeholder,
// "{name}", with no escapes, nested braces or file lookups, and returns
// its name.
func singlePlaceholder(template string) (string, bool) {
	name, ok := strings.CutPrefix(template, "{")
	if !ok {
		return "", false
	}
	name, ok = strings.CutSuffix(name, "}")
	if !ok || name == "" || strings.ContainsAny(name, "{}\\") || strings.HasPrefix(name, "file.") {
		return "", false
	}
	return name, true
}
