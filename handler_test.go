package ratelimit

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func TestBoundKey(t *testing.T) {
	short := strings.Repeat("a", maxKeyLen)
	if got := boundKey(short); got != short {
		t.Fatal("a key of maxKeyLen bytes was changed")
	}
	long1 := strings.Repeat("a", 10000) + "1"
	long2 := strings.Repeat("a", 10000) + "2"
	b1, b2 := boundKey(long1), boundKey(long2)
	if b1 == b2 {
		t.Fatal("two long keys with a common prefix share a bounded key")
	}
	if len(b1) <= maxKeyLen || len(b1) > maxKeyLen+32 {
		t.Fatalf("bounded key of %d bytes, want just over %d", len(b1), maxKeyLen)
	}
	if boundKey(long1) != b1 {
		t.Fatal("bounding is not stable")
	}
}

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
	if got := sfString("api-\"x\\y\n-é"); got != `"api-\"x\\y_-__"` {
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
		{10, 500 * time.Millisecond, ``},                             // a sub-second window has no item
		{10, 1500 * time.Millisecond, ``},                            // nor has a fractional one
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

// TestBlockSizes keeps the header blocks at the size classes their
// comments name: a block a few bytes larger would take the next class.
func TestBlockSizes(t *testing.T) {
	for i, tc := range []struct {
		got, want uintptr
	}{
		{unsafe.Sizeof(placeholders{}), 32},
		{unsafe.Sizeof(block5{}), 160},
		{unsafe.Sizeof(block7{}), 192},
		{unsafe.Sizeof(block9{}), 256},
		{unsafe.Sizeof(block13{}), 352},
	} {
		if tc.got != tc.want {
			t.Errorf("Test %d: %d bytes, want %d", i, tc.got, tc.want)
		}
	}
}

// TestHeadersFitTheirBlock sets the headers of various handlers with the
// longest numbers they can show (every limit's whole count left, a reset
// of two windows), and checks the values, that every header has a slice of
// its own, and that up to four limits (of up to 1e12) need nothing beyond
// the block.
func TestHeadersFitTheirBlock(t *testing.T) {
	lim := func(n float64, d time.Duration) Limit { return Limit{Limit: n, Window: caddy.Duration(d)} }
	for i, tc := range []struct {
		ns     string
		draft  bool
		limits []Limit
	}{
		{"default", false, []Limit{lim(100, time.Minute)}},
		{"default", false, []Limit{lim(1e9, time.Second), lim(1e9, time.Minute)}},
		{"default", true, []Limit{lim(1e12, time.Minute), lim(1e12, time.Hour)}},
		{"default", true, []Limit{lim(2.5, time.Second), lim(10, 500*time.Millisecond)}},
		{"a-rather-long-namespace-name", true, []Limit{lim(5, time.Minute), lim(1000, 90*time.Second), lim(100, time.Hour)}},
		{"api", true, []Limit{lim(1e12, time.Second), lim(1e12, time.Minute), lim(1e12, time.Hour), lim(1e12, 365*24*time.Hour)}},
		{"api", true, []Limit{lim(1, time.Second), lim(2, time.Minute), lim(3, time.Hour), lim(4, 24*time.Hour), lim(5, 30*24*time.Hour)}},
	} {
		h := &Handler{Namespace: tc.ns, Limits: tc.limits, DraftHeaders: tc.draft, ErrorCode: DefaultErrorCode}
		if err := h.validate(); err != nil {
			t.Fatalf("Test %d: %v", i, err)
		}
		left := make([]int, len(h.limits))
		for j, l := range h.limits {
			left[j] = int(l.max)
		}
		shown := len(h.limits) - 1
		reset := int(2*h.limits[shown].size/time.Second) + 1
		set := func() http.Header {
			hdr := http.Header{}
			_, vals, text := h.newBlock()
			h.setHeaders(hdr, vals, text, left, shown, reset)
			return hdr
		}
		hdr := set()
		want := http.Header{
			"Ratelimit-Limit":     {h.limits[shown].limitValue},
			"Ratelimit-Remaining": {strconv.Itoa(left[shown])},
			"Ratelimit-Reset":     {strconv.Itoa(reset)},
		}
		for j, l := range h.limits {
			want[l.limitHeader] = []string{l.limitValue}
			want[l.leftHeader] = []string{strconv.Itoa(left[j])}
		}
		if tc.draft {
			want["Ratelimit-Policy"] = []string{h.policy}
			if p := h.limits[shown].policyName; h.limits[shown].policy != "" {
				want["Ratelimit"] = []string{p + ";r=" + strconv.Itoa(left[shown]) + ";t=" + strconv.Itoa(reset)}
			}
		}
		if !reflect.DeepEqual(hdr, want) {
			t.Errorf("Test %d: headers\n%v\nwant\n%v", i, hdr, want)
		}
		other := set()
		for name, v := range hdr {
			if cap(v) != 1 {
				t.Errorf("Test %d: %s has capacity %d: an Add would write into another header's value", i, name, cap(v))
			}
			if &v[0] == &other[name][0] {
				t.Errorf("Test %d: %s shares its value slice with another request's", i, name)
			}
		}
		if len(h.limits) > maxInlineLimits {
			continue
		}
		hdr = http.Header{}
		if allocs := testing.AllocsPerRun(100, func() {
			clear(hdr)
			_, vals, text := h.newBlock()
			h.setHeaders(hdr, vals, text, left, shown, reset)
		}); allocs != 1 {
			t.Errorf("Test %d: %v allocations, want the block's one", i, allocs)
		}
	}
}
