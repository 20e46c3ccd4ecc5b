package ratelimit

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/ratesync/caddy-ratelimit/window"
)

// Limit is N hits per window.
type Limit struct {
	// The most hits a key may make per window. Values may be fractional.
	// Or, in JSON a string, placeholders that give the limit per request,
	// such as "{plan_quota}" (tiers, through Caddy's map): the window
	// stays fixed, and names the counter. Required; must be positive (a
	// request whose placeholders give no positive number is rejected with
	// 500, see Handler).
	Limit float64 `json:"limit"`

	// The window size, such as "1s", "1m", "1h" or "30d". Required
	// unless calendar is set; must be positive.
	Window caddy.Duration `json:"window,omitempty"`

	// A calendar window instead of a window size: "day", "week" or
	// "month", a fixed window from the calendar's boundary (local
	// midnight; weeks start on Monday; months on the 1st) in the
	// handler's timezone to the next. Its headers' names are Day, Week
	// and Month; the draft's w is the current period's length, and t and
	// Retry-After of a spent quota count down to the next boundary.
	Calendar string `json:"calendar,omitempty"`

	// The placeholders of limit, when JSON gave a string: they are read
	// per request. (In JSON, limit itself holds them.)
	Placeholders string `json:"-"`
}

// parseLimit reads the arguments of a Caddyfile limit line: <n>
// <window|day|week|month>.
func parseLimit(args []string) (Limit, error) {
	if len(args) != 2 {
		return Limit{}, fmt.Errorf("limit: want <n> <window>, such as 'limit 100 1m' or 'limit 10000 month'")
	}
	n, placeholders, err := parseAmount(args[0], "limit")
	if err != nil || placeholders == "" && !(n > 0) {
		return Limit{}, fmt.Errorf("limit: the limit must be a positive number or placeholders, got %q", args[0])
	}
	l := Limit{Limit: n, Placeholders: placeholders}
	if _, ok := window.ParseUnit(args[1]); ok {
		l.Calendar = args[1]
		return l, nil
	}
	win, err := caddy.ParseDuration(args[1])
	if err != nil || win <= 0 {
		return Limit{}, fmt.Errorf("limit: the window must be a positive duration or day, week or month, got %q", args[1])
	}
	l.Window = caddy.Duration(win)
	return l, nil
}

// limit is a Limit ready for requests, with its header names and values
// computed once.
type limit struct {
	max         float64 // the limit, or a rate's requests per window
	burst       float64 // a rate's burst
	rate        bool    // a rate (GCRA), not a window's limit
	calendar    bool    // a calendar window: size is its code (window.CalendarSize)
	size        time.Duration
	per         string // the window, as errors name it: "1m0s", "month"
	limitValue  string // the limit, as configured
	headerLimit string // the limit as Kong's headers show it: an Integer, rounded down
	limitHeader string // X-RateLimit-Limit-<Window>
	leftHeader  string // X-RateLimit-Remaining-<Window>
	name        string // the window as headers and placeholders name it
	policyName  string // the limit's name in the IETF draft's fields
	policy      string // the limit's item in RateLimit-Policy

	// Placeholder values, boxed once rather than per request.
	nsValue    any // the handler's namespace
	nameValue  any
	limitAsAny any
	// The policy placeholder: the limit's policy name, and the
	// concurrency policy's, as a client parsing the draft's fields reads
	// them.
	policyValue      any
	concurrencyValue any

	// The placeholders that give the limit (or the rate) and a rate's
	// burst per request, if any.
	placeholders, burstFrom string
}

func newLimit(namespace string, l Limit, loc *time.Location) (limit, error) {
	size := time.Duration(l.Window)
	per := size.String()
	if l.Calendar != "" {
		per = l.Calendar
	}
	if l.Placeholders == "" && !(l.Limit > 0) {
		return limit{}, fmt.Errorf("limits: limit must be positive, got %v (window %s)", l.Limit, per)
	}
	var name string
	switch {
	case l.Calendar != "":
		unit, ok := window.ParseUnit(l.Calendar)
		if !ok {
			return limit{}, fmt.Errorf("limits: calendar: unknown calendar window %q: want day, week or month", l.Calendar)
		}
		if size != 0 {
			return limit{}, fmt.Errorf("limits: a limit has both a window (%v) and a calendar window (%s): want one", size, l.Calendar)
		}
		var err error
		if size, err = window.CalendarSize(unit, loc); err != nil {
			return limit{}, fmt.Errorf("limits: calendar %s: %v", l.Calendar, err)
		}
		name = strings.ToUpper(l.Calendar[:1]) + l.Calendar[1:]
	case size <= 0:
		return limit{}, fmt.Errorf("limits: window must be positive, got %v (limit %v)", size, l.Limit)
	default:
		name = windowName(size)
	}
	lim := namedLimit(namespace, size, name, policyName(namespace, name))
	lim.calendar, lim.per = l.Calendar != "", per
	lim.placeholders = l.Placeholders
	return lim.judged(l.Limit, 0), nil
}

// namedLimit returns a limit of a window size, with the names its headers
// and placeholders show: name in Kong's headers and placeholders, pName
// (printable ASCII only) in the draft's fields.
func namedLimit(namespace string, size time.Duration, name, pName string) limit {
	return limit{
		size:             size,
		limitHeader:      "X-Ratelimit-Limit-" + name,
		leftHeader:       "X-Ratelimit-Remaining-" + name,
		name:             name,
		policyName:       sfString(pName),
		nsValue:          namespace,
		nameValue:        name,
		policyValue:      pName,
		concurrencyValue: policyName(namespace, "concurrency"),
	}
}

// draftPolicy returns a limit's item in RateLimit-Policy. The draft
// (draft-ietf-httpapi-ratelimit-headers-11) makes the quota q and the
// window w Integers, w in seconds, and w optional: q is the limit rounded
// down, and a window that is not a whole number of seconds is listed
// without w, rather than with one that states another window. (A
// calendar window's w is its current period's: see Handler.inPeriods.)
func draftPolicy(name string, limit float64, size time.Duration) string {
	q := strconv.FormatFloat(math.Floor(limit), 'f', 0, 64)
	if size%time.Second != 0 || window.IsCalendar(size) {
		return name + ";q=" + q
	}
	return name + ";q=" + q + ";w=" + strconv.FormatInt(int64(size/time.Second), 10)
}

// policyName names a policy of the IETF draft's fields: the namespace and
// the window's name (or "concurrency") joined by "-", with every byte that
// is not printable ASCII, and the three that would need escaping in a
// Structured Field String or a JSON string or that escape here (%, " and
// \), percent-encoded as %xx in lowercase hex, as RFC 9651 Display
// Strings encode bytes. So a namespace "café" gives "caf%c3%a9-Minute":
// a valid SF String that keeps the name's bytes (they can be decoded back),
// and that the policy placeholder gives as it is, safe to put between
// quotes in JSON.
func policyName(namespace, name string) string {
	s := namespace + "-" + name
	const hex = "0123456789abcdef"
	var b []byte
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e || c == '%' || c == '"' || c == '\\':
			if b == nil {
				b = append(make([]byte, 0, len(s)+8), s[:i]...)
			}
			b = append(b, '%', hex[c>>4], hex[c&0xf])
		case b != nil:
			b = append(b, c)
		}
	}
	if b == nil {
		return s
	}
	return string(b)
}

// sfString quotes s as a Structured Field String (RFC 9651), which holds
// printable ASCII only, with quotes and backslashes escaped. Names from
// policyName have neither, nor any other byte to escape.
func sfString(s string) string {
	b := []byte{'"'}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\', c)
		} else {
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}

// windowName names a window the way Kong's headers do: Second, Minute,
// Hour, Day, Month (30 days), Year (365 days), or else its length in
// seconds.
func windowName(size time.Duration) string {
	if name, ok := kongWindows[size]; ok {
		return name
	}
	return strconv.FormatFloat(size.Seconds(), 'f', -1, 64)
}

var kongWindows = map[time.Duration]string{
	time.Second: "Second", time.Minute: "Minute", time.Hour: "Hour", 24 * time.Hour: "Day",
	30 * 24 * time.Hour: "Month", 365 * 24 * time.Hour: "Year",
}

// formatCount writes a limit or a remaining count: whole numbers without a
// fraction, others with as many digits as they need.
func formatCount(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
