package accuracy

import (
	"cmp"
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Request is one scheduled request of a run.
type Request struct {
	// At is when it is sent, after the run's start.
	At time.Duration
	// Node is the index of the node it goes to.
	Node int
	// Key is the index of its client key; Bare requests have none.
	Key int
	// Bare requests go to BarePath, the latency baseline.
	Bare bool
	// Units is what its response reports it cost (UnitsHeader), for a
	// budget pattern; 0 for others.
	Units int
}

// BareEvery is how many limited requests there are per bare one: a bare
// request is sent between every BareEvery-th limited request and the next,
// round-robin over the nodes too, as the same-run latency baseline. One
// per two leaves the baseline's 99th percentile hundreds of samples in
// the shortest rows, at half again the load.
const BareEvery = 2

// Schedule returns a run's requests in the order of their send times: the
// pattern's limited requests at Rate × limit per window, round-robin over
// the nodes, and bare ones in between. The run lasts length unless the
// pattern sets its own. The keys of a many-keys pattern are drawn from a
// Zipf law with a fixed seed, so that rows of one pattern send the same
// traffic.
func Schedule(p Pattern, nodes int, limit float64, length time.Duration, seed uint64) []Request {
	if p.Length > 0 {
		length = p.Length
	}
	rate := p.Rate * limit / Window.Seconds() / p.MeanUnits() // requests per second
	n := int(math.Round(rate * length.Seconds()))
	var zipf *rand.Zipf
	if p.Keys > 1 && !p.Flood {
		zipf = rand.NewZipf(rand.New(rand.NewPCG(seed, 0x5eed)), p.ZipfS, 1, uint64(p.Keys-1))
	}
	units := rand.New(rand.NewPCG(seed, 0x0c05))
	at := func(i float64) time.Duration {
		return p.Start + time.Duration(i/rate*float64(time.Second))
	}
	reqs := make([]Request, 0, n+n/BareEvery+1)
	bare := 0
	for i := range n {
		r := Request{At: at(float64(i)), Node: i % nodes}
		if p.Units > 0 {
			r.Units = 1 + units.IntN(p.Units)
		}
		if zipf != nil {
			r.Key = int(zipf.Uint64())
		} else if p.Flood {
			r.Key = i % p.Keys
		}
		reqs = append(reqs, r)
		if i%BareEvery == 0 {
			reqs = append(reqs, Request{At: at(float64(i) + 0.5), Node: bare % nodes, Bare: true})
			bare++
		}
	}
	slices.SortStableFunc(reqs, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	return reqs
}

// KeyShare returns the expected share of a pattern's requests that key
// gets: 1 for a one-key pattern, one of Keys in a flood, else the Zipf
// law's probability.
func KeyShare(p Pattern, key int) float64 {
	if p.Keys <= 1 {
		return 1
	}
	if p.Flood {
		return 1 / float64(p.Keys)
	}
	var sum float64
	for k := range p.Keys {
		sum += math.Pow(float64(k+1), -p.ZipfS)
	}
	return math.Pow(float64(key+1), -p.ZipfS) / sum
}

// Result is what happened to one request.
type Result struct {
	Request
	// Sent is when it was sent; Latency, until its answer was read.
	Sent    time.Time
	Latency time.Duration
	// Status is the HTTP status, or 0 when no answer came (Err says why).
	Status int
	Err    error
	// ServerMs is the node's clock when it answered an admitted request
	// (Unix milliseconds, from TimeHeader), 0 otherwise.
	ServerMs int64
}

// Target is where a run's requests go.
type Target struct {
	// Nodes are the nodes' base URLs, such as "http://127.0.0.1:8080".
	Nodes []string
	// Path is the limited route's path.
	Path string
	// Keys are the client keys, indexed by Request.Key.
	Keys []string
}

// NewClient returns an HTTP client for a run: keep-alive connections, as
// many as the open loop needs at once, and a timeout so that a stuck node
// fails the row instead of hanging it.
func NewClient() *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        4096,
			MaxIdleConnsPerHost: 1024,
			IdleConnTimeout:     30 * time.Second,
			DisableCompression:  true,
		},
	}
}

// Send sends the requests at start + At each, whatever the answers to the
// earlier ones (an open loop: a slow node does not slow the load down, as
// it would not in production), and returns their results in the same
// order.
func Send(ctx context.Context, client *http.Client, t Target, start time.Time, reqs []Request) []Result {
	results := make([]Result, len(reqs))
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	<-timer.C
	for i, r := range reqs {
		if d := time.Until(start.Add(r.At)); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				wg.Wait()
				return results[:i]
			case <-timer.C:
			}
		}
		results[i].Request = r
		wg.Go(func() { do(ctx, client, t, &results[i]) })
	}
	wg.Wait()
	return results
}

// do sends one request and fills in its result.
func do(ctx context.Context, client *http.Client, t Target, res *Result) {
	url := t.Nodes[res.Node] + t.Path
	if res.Bare {
		url = t.Nodes[res.Node] + BarePath
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		res.Err = err
		return
	}
	if !res.Bare {
		req.Header.Set(KeyHeader, t.Keys[res.Key])
	}
	if res.Units > 0 {
		req.Header.Set(UnitsHeader, strconv.Itoa(res.Units))
	}
	res.Sent = time.Now()
	resp, err := client.Do(req)
	if err != nil {
		res.Err = err
		return
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	res.Latency = time.Since(res.Sent)
	if err != nil {
		res.Err = err
		return
	}
	res.Status = resp.StatusCode
	if ms := resp.Header.Get(TimeHeader); ms != "" && resp.StatusCode == http.StatusOK {
		res.ServerMs, _ = strconv.ParseInt(ms, 10, 64)
	}
}
