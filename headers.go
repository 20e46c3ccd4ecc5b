package ratelimit

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unsafe"
)

// This file writes a request's rate limit headers with one allocation.
//
// What a request that shows headers sets outlives the handler: its
// placeholders, a value slice for each header (one per request, since a
// later handler may rewrite a value in place) and the text of its numbers
// (what each limit has left, and the reset). Rather than allocating each
// (and a string per number), the handler picks at provision the smallest
// block that holds the placeholders, the values and the longest numbers it
// can show, each block filling one size class of Go's allocator, and the
// numbers' strings view the block's bytes (unsafe.String).
// docs/performance.md gives the allocations a request then takes.

// parseHeaders reads headers, hide_client_headers and draft_headers into
// what responses carry.
func (h *Handler) parseHeaders() error {
	for i, v := range h.Headers {
		switch {
		case slices.Contains(h.Headers[:i], v):
			return fmt.Errorf("headers: %q given twice", v)
		case !slices.Contains([]string{"draft", "kong", "both", "none"}, v):
			return fmt.Errorf("headers: unknown choice %q: want draft, kong, both (draft kong), or none", v)
		case v == "both" && len(h.Headers) > 1:
			return fmt.Errorf("headers: both means draft kong and takes no other choice, got %q", h.Headers)
		}
	}
	none := slices.Contains(h.Headers, "none")
	switch {
	case none && len(h.Headers) > 1:
		return fmt.Errorf("headers: none cannot be combined with other choices, got %q", h.Headers)
	case h.HideClientHeaders && len(h.Headers) > 0 && !none:
		return fmt.Errorf("hide_client_headers: contradicts headers %q", h.Headers)
	case none && h.DraftHeaders && !h.HideClientHeaders:
		return fmt.Errorf("draft_headers: contradicts headers %q", h.Headers)
	}
	// hide_client_headers, the older spelling of none, also wins over
	// draft_headers, as it did when it was the only spelling.
	both := slices.Contains(h.Headers, "both")
	h.draft = !h.HideClientHeaders && (both || h.DraftHeaders || len(h.Headers) == 0 || slices.Contains(h.Headers, "draft"))
	h.kong = !h.HideClientHeaders && (both || slices.Contains(h.Headers, "kong"))
	return nil
}

// showsHeaders says whether responses carry rate limit headers.
func (h *Handler) showsHeaders() bool { return h.draft || h.kong }

// headerRoom returns how many header values a request sets, and how many
// bytes the numbers among them (and the RateLimit field) take as long as
// no count is negative.
func (h *Handler) headerRoom() (vals, text int) {
	var resetDigits, longest, counts int // longest: the longest RateLimit field
	for _, l := range h.static.limits {
		// RateLimit-Reset is at most two windows, or a ban and two windows.
		resetDigits = max(resetDigits, len(strconv.FormatInt(int64((2*l.size+time.Duration(h.Ban))/time.Second)+1, 10)))
		count := len(formatCount(math.Floor(l.max))) // remaining <= the limit
		longest = max(longest, len(l.policyName)+count)
		counts += count
	}
	if h.kong {
		vals += 2*len(h.static.limits) + 3
		text += counts + resetDigits
	}
	if h.draft {
		vals += 2
		text += longest + len(";r=;t=") + resetDigits
	}
	return vals, text
}

// block is what a request that shows headers keeps, in one allocation:
// the placeholders, the backing array of the header values (V, an array
// of strings) and the bytes of the numbers among them (T, an array of
// bytes).
type block[V, T any] struct {
	ph   placeholders
	vals V
	text T
}

// newBlock allocates a block and returns its parts, the arrays as empty
// slices with their length as capacity.
func newBlock[V, T any]() (*placeholders, []string, []byte) {
	b := new(block[V, T])
	vals := unsafe.Slice((*string)(unsafe.Pointer(&b.vals)), unsafe.Sizeof(b.vals)/unsafe.Sizeof(""))
	text := unsafe.Slice((*byte)(unsafe.Pointer(&b.text)), unsafe.Sizeof(b.text))
	return &b.ph, vals[:0], text[:0]
}

// blockFor returns how to allocate what a request's headers need: the
// smallest block with room for vals header values and text bytes of
// numbers, each block filling a size class of Go's allocator, or else
// three allocations.
func blockFor(vals, text int) func() (*placeholders, []string, []byte) {
	for _, b := range []struct {
		vals, text int
		alloc      func() (*placeholders, []string, []byte)
	}{
		{2, 48, newBlock[[2]string, [48]byte]},     // 112 bytes: the draft's two fields
		{5, 48, newBlock[[5]string, [48]byte]},     // 160 bytes: one limit
		{7, 48, newBlock[[7]string, [48]byte]},     // 192 bytes: two limits
		{9, 80, newBlock[[9]string, [80]byte]},     // 256 bytes: three limits, or two with the draft's fields
		{13, 112, newBlock[[13]string, [112]byte]}, // 352 bytes: four limits with the draft's fields
	} {
		if vals <= b.vals && text <= b.text {
			return b.alloc
		}
	}
	return func() (*placeholders, []string, []byte) {
		return new(placeholders), make([]string, 0, vals), make([]byte, 0, text)
	}
}

// setHeaders writes the rate limit headers. Their values are appended to
// vals, and the numbers among them to text, whose bytes the value strings
// share. Each header gets its own one-element slice of vals,
// capped so that a later Add copies instead of writing into its
// neighbour: no slice is shared with another request, since a later
// handler may rewrite a value in place (Caddy's header directive does).
func (h *Handler) setHeaders(hdr http.Header, p *plan, vals []string, text []byte, left []int, shown, reset int) {
	put := func(name, v string) {
		vals = append(vals, v) // within the block's capacity
		n := len(vals)
		hdr[name] = vals[n-1 : n : n]
	}
	// str returns text[start:] as a string sharing its bytes, which are
	// never written again: text only grows by append, and growing it
	// past its capacity leaves the strings made so far in the old array.
	str := func(start int) string { return unsafe.String(&text[start], len(text)-start) }
	if h.kong {
		var shownLeft string
		for i, l := range p.limits {
			start := len(text)
			text = strconv.AppendInt(text, int64(left[i]), 10)
			s := str(start)
			if i == shown {
				shownLeft = s
			}
			put(l.limitHeader, l.headerLimit)
			put(l.leftHeader, s)
		}
		start := len(text)
		text = strconv.AppendInt(text, int64(reset), 10)
		put("Ratelimit-Limit", p.limits[shown].headerLimit)
		put("Ratelimit-Remaining", shownLeft)
		put("Ratelimit-Reset", str(start))
	}
	if h.draft {
		// The IETF draft's structured fields: every policy, and the state
		// of the one shown.
		put("Ratelimit-Policy", p.policy)
		start := len(text)
		text = append(text, p.limits[shown].policyName...)
		text = append(text, ";r="...)
		text = strconv.AppendInt(text, int64(left[shown]), 10)
		text = append(text, ";t="...)
		text = strconv.AppendInt(text, int64(reset), 10)
		put("Ratelimit", str(start))
	}
}

// setConcurrencyField makes the RateLimit field of a max_concurrent
// rejection name the concurrency policy, with nothing remaining and t the
// seconds the rejection's Retry-After gives (before jitter).
func (h *Handler) setConcurrencyField(hdr http.Header, secs int) {
	if h.draft {
		hdr["Ratelimit"] = []string{sfString(h.concurrencyName) + ";r=0;t=" + strconv.Itoa(secs)}
	}
}
