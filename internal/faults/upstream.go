package faults

import (
	"cmp"
	"math"
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

// MaxInFlight returns the most requests of key that ran at once among
// those that started in [from, to).
func (u *Upstream) MaxInFlight(key string, from, to time.Time) int {
	most, _ := u.InFlight(key, from, to, math.MaxInt)
	return most
}

// InFlight returns the most requests of key that ran at once among those
// that started in [from, to), and the last time a request started with
// more than limit of them running (zero: never).
func (u *Upstream) InFlight(key string, from, to time.Time, limit int) (most int, lastOver time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	type ev struct {
		at    time.Time
		delta int
	}
	var evs []ev
	for _, s := range u.ran {
		if s.key == key && !s.start.Before(from) && s.start.Before(to) {
			evs = append(evs, ev{s.start, 1}, ev{s.end, -1})
		}
	}
	// Ends before starts at the same instant: back-to-back is not overlap.
	slices.SortFunc(evs, func(a, b ev) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.delta, b.delta))
	})
	n := 0
	for _, e := range evs {
		n += e.delta
		most = max(most, n)
		if n > limit && e.delta > 0 {
			lastOver = e.at
		}
	}
	return most, lastOver
}

// Close stops the upstream.
func (u *Upstream) Close() error { return u.srv.Close() }
