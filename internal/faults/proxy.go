package faults

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy is a TCP proxy the harness owns, between the nodes and a store,
// to fail the store without touching its process: it can refuse
// connections (as a store that is down or partitioned away) and delay
// the store's replies (as a slow store), while the store keeps its data.
type Proxy struct {
	// Addr is where the nodes connect: host:port on loopback.
	Addr string
	// Target is the store's address.
	Target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]struct{}
	delay time.Duration
	down  bool
	wg    sync.WaitGroup
}

// StartProxy listens on a free loopback port and forwards every
// connection to target.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), Target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept(ln)
	return p, nil
}

// accept serves one listener until it is closed.
func (p *Proxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve forwards one client connection to the target.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	s, err := net.DialTimeout("tcp", p.Target, 2*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, s) {
		c.Close()
		s.Close()
		return
	}
	defer p.untrack(c, s)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(s, c); s.Close(); done <- struct{}{} }()
	go func() { p.copyDelayed(c, s); c.Close(); done <- struct{}{} }()
	<-done
	c.Close()
	s.Close()
	<-done
}

// copyDelayed copies the store's replies to the client, each chunk held
// back by the delay in force when it arrived, in order.
func (p *Proxy) copyDelayed(dst, src net.Conn) {
	type chunk struct {
		due  time.Time
		data []byte
	}
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{time.Now().Add(p.Delay()), append([]byte(nil), buf[:n]...)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if _, err := dst.Write(c.data); err != nil {
			src.Close()
			for range ch { // let the reader end
			}
			return
		}
	}
}

func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		delete(p.conns, c)
	}
}

// Delay returns the delay added to the store's replies.
func (p *Proxy) Delay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// SetDelay delays every reply the store sends from now on by d (0: none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Down cuts every connection and refuses new ones (the port is closed),
// as a store that went down.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return
	}
	p.down = true
	p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// Up listens again on the same address after Down.
func (p *Proxy) Up() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.down {
		return nil
	}
	var ln net.Listener
	var err error
	for range 50 { // the port may linger for a moment
		if ln, err = net.Listen("tcp", p.Addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	p.ln, p.down = ln, false
	p.wg.Add(1)
	go p.accept(ln)
	return nil
}

// Close stops the proxy and waits for its connections to end.
func (p *Proxy) Close() error {
	p.Down()
	p.wg.Wait()
	return nil
}

// errNoProxy is returned by faults that need a proxy on a row without one.
var errNoProxy = errors.New("this fault needs the store behind the harness's proxy")
