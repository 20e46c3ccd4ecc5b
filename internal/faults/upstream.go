package faults

import (
	"cmp"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Upstream is the backend of the max_concurrent route: it holds each
// request for Hold, and records when each one ran, so that the fleet's
// requests in flight per key can be counted where they run.
type Upstream struct {
	// Addr is its host:port on loopback.
	Addr string
	// Hold is how long it keeps each request.
	Hold time.Duration

	srv *http.Server
	mu  sync.Mutex
	ran []span
}

// span is one request the upstream ran.
type span struct {
	key        string
	start, end time.Time
}

// StartUpstream starts an upstream on a free loopback port.
func StartUpstream(hold time.Duration) (*Upstream, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{Addr: ln.Addr().String(), Hold: hold}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	return u, nil
}

// ServeHTTP holds the request for Hold and answers 200.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	select {
	case <-time.After(u.Hold):
	case <-r.Context().Done():
	}
	u.mu.Lock()
	u.ran = append(u.ran, span{key: r.Header.Get(KeyHeader), start: start, end: time.Now()})
	u.mu.Unlock()
	_, _ = w.Write([]byte("ok"))
}

// Reset forgets what ran so far.
func (u *Upstream) Reset() {
	u.mu.Lock()
	u.ran = nil
	u.mu.Unlock()
}

// Admissions sums up the requests of a key that the upstream started in
// a span of time, each by the number of requests of the key it was
// running at that request's start, that request included: what
// max_concurrent admitted it with. Requests that started before the span
// and still ran count against those in it, but are not judged.
type Admissions struct {
	// N is how many requests started in the span.
	N int
	// Worst is the most requests running at one of those starts.
	Worst int
	// Over is how many of them started with more than the limit running,
	// and LastOver the last of those (zero: none).
	Over     int
	LastOver time.Time
}

// Admissions sums up the requests of key that started in [from, to)
// against limit: for each, how many requests of key were running when it
// started (those with start ≤ t < end, itself included).
func (u *Upstream) Admissions(key string, from, to time.Time, limit int) Admissions {
	u.mu.Lock()
	defer u.mu.Unlock()
	return admissions(u.ran, key, from, to, limit)
}

func admissions(ran []span, key string, from, to time.Time, limit int) Admissions {
	var starts, ends []time.Time
	for _, s := range ran {
		if s.key == key {
			starts, ends = append(starts, s.start), append(ends, s.end)
		}
	}
	slices.SortFunc(starts, time.Time.Compare)
	slices.SortFunc(ends, time.Time.Compare)
	// upTo is how many of ts are at or before t.
	upTo := func(ts []time.Time, t time.Time) int {
		n, _ := slices.BinarySearchFunc(ts, t, func(e, t time.Time) int {
			// Equal counts as before: find the first one after t.
			return cmp.Or(e.Compare(t), -1)
		})
		return n
	}
	var a Admissions
	for _, s := range ran {
		if s.key != key || s.start.Before(from) || !s.start.Before(to) {
			continue
		}
		// Those that ended at s.start no longer run: back-to-back is not
		// overlap.
		running := upTo(starts, s.start) - upTo(ends, s.start)
		if !s.end.After(s.start) {
			running++ // a request that took no time still ran
		}
		a.N++
		a.Worst = max(a.Worst, running)
		if running > limit {
			a.Over++
			if s.start.After(a.LastOver) {
				a.LastOver = s.start
			}
		}
	}
	return a
}

// Close stops the upstream.
func (u *Upstream) Close() error { return u.srv.Close() }
