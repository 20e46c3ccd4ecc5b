package ratelimit

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestWindowNames(t *testing.T) {
	for size, want := range map[time.Duration]string{
		time.Second:            "Second",
		time.Minute:            "Minute",
		time.Hour:              "Hour",
		24 * time.Hour:         "Day",
		30 * 24 * time.Hour:    "Month",
		365 * 24 * time.Hour:   "Year",
		90 * time.Second:       "90",
		500 * time.Millisecond: "0.5",
	} {
		if got := windowName(size); got != want {
			t.Errorf("windowName(%v) = %q, want %q", size, got, want)
		}
	}
}

func TestSFString(t *testing.T) {
	if got := sfString(policyName("api-\"x\\y\n", "é")); got != `"api-%22x%5cy%0a-%c3%a9"` {
		t.Fatalf("sfString = %s", got)
	}
	if got := sfString(`a"b\c`); got != `"a\"b\\c"` {
		t.Fatalf("sfString = %s", got)
	}
}

func TestDraftPolicyIntegers(t *testing.T) {
	for i, tc := range []struct {
		limit float64
		size  time.Duration
		want  string
	}{
		{100, time.Minute, `"n";q=100;w=60`},
		{2.5, time.Second, `"n";q=2;w=1`},                            // q rounded down
		{0.5, time.Hour, `"n";q=0;w=3600`},                           // below one request
		{10, 500 * time.Millisecond, `"n";q=10`},                     // a sub-second window has no w
		{10, 1500 * time.Millisecond, `"n";q=10`},                    // nor has a fractional one
		{1e12, 30 * 24 * time.Hour, `"n";q=1000000000000;w=2592000`}, // no exponent
	} {
		if got := draftPolicy(`"n"`, tc.limit, tc.size); got != tc.want {
			t.Errorf("Test %d: draftPolicy(%v, %v) = %q, want %q", i, tc.limit, tc.size, got, tc.want)
		}
	}
}

// TestKeyFuncMatchesReplaceAll checks that the direct reads of common key
// placeholders give what Caddy's replacer gives for the same request.
func TestKeyFuncMatchesReplaceAll(t *testing.T) {
	newRequest := func(remote string, tlsDone *bool, headers ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/a?x=1", nil)
		r.RemoteAddr = remote
		if tlsDone != nil {
			r.TLS = &tls.ConnectionState{HandshakeComplete: *tlsDone}
		}
		for i := 0; i+1 < len(headers); i += 2 {
			r.Header.Add(headers[i], headers[i+1])
		}
		return caddyhttp.PrepareRequest(r, caddy.NewReplacer(), httptest.NewRecorder(), nil)
	}
	done, early := true, false
	requests := []*http.Request{
		newRequest("203.0.113.7:4711", nil, "X-Key", "k1"),
		newRequest("[2001:db8::1]:443", &done, "x-key", "a", "X-Key", "b"),
		newRequest("/run/caddy.sock", nil),
		newRequest("203.0.113.7:4711", &early, "X-Key", "{not a placeholder}"),
		newRequest("", nil, "X-Key", ""),
	}
	for i, v := range []any{"10.0.0.1", nil, 42, "", nil} {
		if v != nil {
			caddyhttp.SetVar(requests[i].Context(), "client_ip", v)
		}
	}
	for _, template := range []string{
		"{http.request.remote.host}",
		"{http.request.header.X-Key}",
		"{http.request.header.x-key}",
		"{http.request.uri.query}",
		"{http.request.uri.query.x}",
		"{http.vars.client_ip}",
		"{http.vars.nosuch}",
		"{http.request.method}-{http.request.header.X-Key}",
		"static",
		"{unknown.placeholder}",
	} {
		key := keyFunc(template)
		for i, r := range requests {
			repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
			if got, want := key(r, repl), repl.ReplaceAll(template, ""); got != want {
				t.Errorf("%s, request %d: %q, want %q", template, i, got, want)
			}
		}
	}
}

// TestPlaceholdersDescribeTheLastHandler chains two rate_limit handlers:
// the placeholders describe the second, which counted the request last.
func TestPlaceholdersDescribeTheLastHandler(t *testing.T) {
	repl := caddy.NewReplacer()
	first := findPlaceholders(repl)
	if first != nil {
		t.Fatal("a new replacer has rate_limit placeholders")
	}
	lims := []limit{{nsValue: "a", nameValue: "Minute", limitAsAny: "5"}, {nsValue: "b", nameValue: "Hour", limitAsAny: "100"}}
	p := new(placeholders)
	repl.Map(p.get)
	*p = placeholders{lim: &lims[0], remaining: 4, reset: 12}
	if findPlaceholders(repl) != p {
		t.Fatal("the registered placeholders are not found")
	}
	*findPlaceholders(repl) = placeholders{lim: &lims[1], remaining: 0, reset: 3600, exceeded: true}
	for name, want := range map[string]string{
		"namespace": "b", "exceeded": "true", "window": "Hour", "limit": "100", "remaining": "0", "reset": "3600",
	} {
		if got := repl.ReplaceAll("{http.rate_limit."+name+"}", "-"); got != want {
			t.Errorf("{http.rate_limit.%s} = %q, want %q", name, got, want)
		}
	}
	if got := repl.ReplaceAll("{http.rate_limit.nosuch}", "-"); got != "-" {
		t.Errorf("an unknown rate_limit placeholder = %q, want it unknown", got)
	}
}
