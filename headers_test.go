package ratelimit

import (
	"net/http"
	"reflect"
	"strconv"
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
