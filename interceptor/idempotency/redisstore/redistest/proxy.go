package redistest

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on a loopback port in front of a server, for tests
// of a network partition: [Proxy.Stall] makes it stop forwarding, in both
// directions, without closing anything, as a cable pulled or a firewall
// that drops packets does: a client's commands go out and no reply comes
// back, so a client waits for as long as its own timeouts let it.
// [Proxy.Resume] forwards again, with what was held meanwhile (TCP would
// retransmit it once the partition heals).
type Proxy struct {
	// Addr is where clients connect: "127.0.0.1:port".
	Addr string

	lis    net.Listener
	target string

	mu      sync.Mutex
	stalled bool
	resume  chan struct{} // closed by Resume; made by Stall
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup // the accept loop and the copiers
}

// StartProxy starts a Proxy to target (host:port), stopped when t ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: lis.Addr().String(), lis: lis, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// Stall stops forwarding: what a side sends from now on is read and held,
// not passed on, until Resume. New connections are accepted, and stall too.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stalled {
		p.stalled, p.resume = true, make(chan struct{})
	}
}

// Resume forwards again, starting with what was held.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
}

// Close stops the proxy: the listener and every connection are closed, and
// Close returns once its goroutines have ended.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.lis.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	if p.stalled {
		p.stalled = false
		close(p.resume)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		in, err := p.lis.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !p.track(in, out) {
			return
		}
		p.wg.Go(func() { p.pipe(out, in) })
		p.wg.Go(func() { p.pipe(in, out) })
	}
}

// track registers both ends of a connection, or closes them and reports
// false when the proxy is closed.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from src to dst, holding what it read while the proxy is
// stalled, until either side fails; then it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF too: the other side sees the close
			return
		}
	}
}

// wait returns at once unless the proxy is stalled, and then when it
// resumes or closes.
func (p *Proxy) wait() {
	p.mu.Lock()
	stalled, resume := p.stalled, p.resume
	p.mu.Unlock()
	if stalled {
		<-resume
	}
}
