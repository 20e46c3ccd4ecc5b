package faults

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Class is a kind of request of the load: which route, with which keys.
type Class int

// The classes of the load.
const (
	Count Class = iota // CountPath, a new key set every second
	Limit              // LimitPath, one key over its limit
	Conc               // ConcPath, one key, more in flight than max_concurrent
	Rate               // RatePath, a new key per request (sync_rate 0 only)
	numClasses
)

// classPath is the route of each class.
var classPath = [numClasses]string{Count: CountPath, Limit: LimitPath, Conc: ConcPath, Rate: RatePath}

// Rates are the load's requests per second per class.
type Rates [numClasses]float64

// Total is all the classes' requests per second.
func (r Rates) Total() float64 {
	var t float64
	for _, v := range r {
		t += v
	}
	return t
}

// For returns the rates of a row's load: a periodic namespace refuses a
// rate at load, so its rows send the Rate class's requests to CountPath.
func (r Rates) For(sync bool) Rates {
	if !sync {
		r[Count] += r[Rate]
		r[Rate] = 0
	}
	return r
}

// CountKeysPerSecond is how many keys of CountPath the load uses per
// second of traffic: a key's hits all fall in one second, so that a key
// can be judged by when it was sent (before a store lost its data, or
// after).
const CountKeysPerSecond = 5

// Result is what happened to one request.
type Result struct {
	Class   Class
	Key     string
	Node    int
	Sent    time.Time
	Latency time.Duration
	// Status is the HTTP status, 0 when no answer came (Err says why).
	Status int
	Err    error
	// ServerMs is the node's clock when it admitted the request.
	ServerMs int64
}

// Load sends the traffic of a row: each class at its rate, round-robin
// over the nodes that are up, as an open loop (a slow answer does not
// hold back the next request), until Stop.
type Load struct {
	Prefix string
	Rates  Rates
	Nodes  []*Node
	// ConcKey and LimitKey are the keys of the Conc and Limit classes.
	LimitKey, ConcKey string

	client  *http.Client
	down    []atomic.Bool // nodes the load must skip: killed or stopped
	start   time.Time
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	results []*Result
	wg      sync.WaitGroup
}

// NewLoad returns the load of a row on nodes, with keys under prefix.
func NewLoad(prefix string, rates Rates, nodes []*Node) *Load {
	return &Load{
		Prefix: prefix, Rates: rates, Nodes: nodes,
		LimitKey: prefix + "limit", ConcKey: prefix + "conc",
		client: &http.Client{
			Timeout: 15 * time.Second,
			Transport: &http.Transport{
				MaxIdleConns:        4096,
				MaxIdleConnsPerHost: 1024,
				IdleConnTimeout:     30 * time.Second,
				DisableCompression:  true,
			},
		},
		down: make([]atomic.Bool, len(nodes)),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

// CountKey returns the key of CountPath for the second sec of the load
// and slot i of it.
func (l *Load) CountKey(sec, i int) string {
	return l.Prefix + "c" + strconv.Itoa(sec) + "-" + strconv.Itoa(i)
}

// RateKey returns the key of the i-th request of RatePath.
func (l *Load) RateKey(i int) string {
	return l.Prefix + "r" + strconv.Itoa(i)
}

// SetDown makes the load skip node i (true) or send to it again.
func (l *Load) SetDown(i int, down bool) { l.down[i].Store(down) }

// Start starts sending.
func (l *Load) Start(ctx context.Context) {
	l.start = time.Now()
	go l.run(ctx)
}

// Started is when the load started.
func (l *Load) Started() time.Time { return l.start }

// run schedules every class's requests at its rate until stopped.
func (l *Load) run(ctx context.Context) {
	defer close(l.done)
	var sent [numClasses]int
	timer := time.NewTimer(0)
	<-timer.C
	rr := 0
	for {
		// The class whose next request is due first.
		next, at := Class(-1), time.Duration(0)
		for c := range numClasses {
			if l.Rates[c] <= 0 {
				continue
			}
			t := time.Duration(float64(sent[c]) / l.Rates[c] * float64(time.Second))
			if next < 0 || t < at {
				next, at = c, t
			}
		}
		if next < 0 {
			return
		}
		if d := time.Until(l.start.Add(at)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-l.stop:
				timer.Stop()
				return
			case <-timer.C:
			}
		} else {
			select {
			case <-ctx.Done():
				return
			case <-l.stop:
				return
			default:
			}
		}
		i := sent[next]
		sent[next]++
		r := &Result{Class: next}
		switch next {
		case Count:
			sec := int(at / time.Second)
			r.Key = l.CountKey(sec, i%CountKeysPerSecond)
		case Limit:
			r.Key = l.LimitKey
		case Conc:
			r.Key = l.ConcKey
		case Rate:
			r.Key = l.RateKey(i)
		}
		r.Node = -1
		for range l.Nodes {
			n := rr % len(l.Nodes)
			rr++
			if !l.down[n].Load() {
				r.Node = n
				break
			}
		}
		if r.Node < 0 {
			continue
		}
		l.mu.Lock()
		l.results = append(l.results, r)
		l.mu.Unlock()
		l.wg.Go(func() { l.do(ctx, r) })
	}
}

// Stop stops sending, waits for the answers in flight and returns every
// result.
func (l *Load) Stop() []*Result {
	close(l.stop)
	<-l.done
	l.wg.Wait()
	l.client.CloseIdleConnections()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.results
}

// do sends one request and fills in its result.
func (l *Load) do(ctx context.Context, r *Result) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.Nodes[r.Node].URL(classPath[r.Class]), nil)
	if err != nil {
		r.Err = err
		return
	}
	req.Header.Set(KeyHeader, r.Key)
	r.Sent = time.Now()
	resp, err := l.client.Do(req)
	if err != nil {
		r.Latency = time.Since(r.Sent)
		r.Err = err
		return
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.Latency = time.Since(r.Sent)
	if err != nil {
		r.Err = err
		return
	}
	r.Status = resp.StatusCode
	if ms := resp.Header.Get(TimeHeader); ms != "" && resp.StatusCode == http.StatusOK {
		r.ServerMs, _ = strconv.ParseInt(ms, 10, 64)
	}
}

// Burst sends n requests of key to node's path at once, waits for them
// and returns their statuses: how the harness sets off a ban.
func (l *Load) Burst(ctx context.Context, node int, path, key string, n int) []int {
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.Nodes[node].URL(path), nil)
			if err != nil {
				return
			}
			req.Header.Set(KeyHeader, key)
			resp, err := l.client.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	return statuses
}
