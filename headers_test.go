package ratelimit

import (
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
)

// TestBlockSizes keeps the header blocks at the size classes their
// comments name: a block a few bytes larger would take the next class.
func TestBlockSizes(t *testing.T) {
	for i, tc := range []struct {
		got, want uintptr
	}{
		{unsafe.Sizeof(placeholders{}), 32},
		{unsafe.Sizeof(block[[2]string, [48]byte]{}), 112},
		{unsafe.Sizeof(block[[5]string, [48]byte]{}), 160},
		{unsafe.Sizeof(block[[7]string, [48]byte]{}), 192},
		{unsafe.Sizeof(block[[9]string, [80]byte]{}), 256},
		{unsafe.Sizeof(block[[13]string, [112]byte]{}), 352},
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
		ns      string
		headers []string
		limits  []Limit
		ban     time.Duration
	}{
		{"default", []string{"kong"}, []Limit{lim(100, time.Minute)}, 0},
		{"default", []string{"kong"}, []Limit{lim(1e9, time.Second), lim(1e9, time.Minute)}, 0},
		{"default", nil, []Limit{lim(1e9, time.Second), lim(1e9, time.Minute)}, 0},
		{"default", []string{"draft"}, []Limit{lim(1e12, time.Minute), lim(1e12, time.Hour)}, 366 * 24 * time.Hour},
		{"default", []string{"draft", "kong"}, []Limit{lim(1e12, time.Minute), lim(1e12, time.Hour)}, 0},
		{"default", []string{"kong", "draft"}, []Limit{lim(2.5, time.Second), lim(10, 500*time.Millisecond)}, 0},
		{"a-rather-long-namespace-name", []string{"draft", "kong"}, []Limit{lim(5, time.Minute), lim(1000, 90*time.Second), lim(100, time.Hour)}, 0},
		{"api", []string{"draft", "kong"}, []Limit{lim(1e12, time.Second), lim(1e12, time.Minute), lim(1e12, time.Hour), lim(1e12, 365*24*time.Hour)}, 0},
		{"api", []string{"draft", "kong"}, []Limit{lim(1, time.Second), lim(2, time.Minute), lim(3, time.Hour), lim(4, 24*time.Hour), lim(5, 30*24*time.Hour)}, 0},
	} {
		h := &Handler{Namespace: tc.ns, Limits: tc.limits, Headers: tc.headers, Ban: caddy.Duration(tc.ban), ErrorCode: DefaultErrorCode}
		if err := h.validate(); err != nil {
			t.Fatalf("Test %d: %v", i, err)
		}
		left := make([]int, len(h.static.limits))
		for j, l := range h.static.limits {
			left[j] = int(l.max)
		}
		shown := len(h.static.limits) - 1
		reset := int((2*h.static.limits[shown].size+tc.ban)/time.Second) + 1
		set := func() http.Header {
			hdr := http.Header{}
			_, vals, text := h.newBlock()
			h.setHeaders(hdr, &h.static, vals, text, left, shown, reset)
			return hdr
		}
		hdr := set()
		want := http.Header{}
		if h.kong {
			want["Ratelimit-Limit"] = []string{h.static.limits[shown].headerLimit}
			want["Ratelimit-Remaining"] = []string{strconv.Itoa(left[shown])}
			want["Ratelimit-Reset"] = []string{strconv.Itoa(reset)}
			for j, l := range h.static.limits {
				want[l.limitHeader] = []string{l.headerLimit}
				want[l.leftHeader] = []string{strconv.Itoa(left[j])}
			}
		}
		if h.draft {
			want["Ratelimit-Policy"] = []string{h.static.policy}
			want["Ratelimit"] = []string{h.static.limits[shown].policyName + ";r=" + strconv.Itoa(left[shown]) + ";t=" + strconv.Itoa(reset)}
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
		if len(h.static.limits) > maxInlineLimits {
			continue
		}
		hdr = http.Header{}
		if allocs := testing.AllocsPerRun(100, func() {
			clear(hdr)
			_, vals, text := h.newBlock()
			h.setHeaders(hdr, &h.static, vals, text, left, shown, reset)
		}); allocs != 1 {
			t.Errorf("Test %d: %v allocations, want the block's one", i, allocs)
		}
	}
}

// TestParseHeaders checks the headers choice, its older spellings, and
// that bad input names the field and the value.
func TestParseHeaders(t *testing.T) {
	for i, tc := range []struct {
		headers     []string
		hide, draft bool
		wantDraft   bool
		wantKong    bool
		err         string
	}{
		{wantDraft: true},
		{headers: []string{"draft"}, wantDraft: true},
		{headers: []string{"kong"}, wantKong: true},
		{headers: []string{"kong", "draft"}, wantDraft: true, wantKong: true},
		{headers: []string{"both"}, wantDraft: true, wantKong: true},
		{headers: []string{"none"}},
		{hide: true},
		{hide: true, draft: true},
		{hide: true, headers: []string{"none"}},
		{draft: true, wantDraft: true},
		{draft: true, headers: []string{"kong"}, wantDraft: true, wantKong: true},
		{headers: []string{"ietf"}, err: `headers: unknown choice "ietf"`},
		{headers: []string{"draft", "draft"}, err: `headers: "draft" given twice`},
		{headers: []string{"none", "kong"}, err: `headers: none cannot be combined with other choices, got ["none" "kong"]`},
		{headers: []string{"both", "kong"}, err: `headers: both means draft kong and takes no other choice, got ["both" "kong"]`},
		{headers: []string{"none", "both"}, err: `headers: both means draft kong`},
		{hide: true, headers: []string{"kong"}, err: `hide_client_headers: contradicts headers ["kong"]`},
		{draft: true, headers: []string{"none"}, err: `draft_headers: contradicts headers ["none"]`},
	} {
		h := &Handler{Headers: tc.headers, HideClientHeaders: tc.hide, DraftHeaders: tc.draft}
		err := h.parseHeaders()
		if tc.err != "" {
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Errorf("Test %d: error %v, want %q", i, err, tc.err)
			}
			continue
		}
		if err != nil || h.draft != tc.wantDraft || h.kong != tc.wantKong {
			t.Errorf("Test %d: draft %v kong %v (error %v), want draft %v kong %v", i, h.draft, h.kong, err, tc.wantDraft, tc.wantKong)
		}
	}
}
