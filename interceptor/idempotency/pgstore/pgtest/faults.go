package pgtest

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Fault is what a [FaultConn] does to the next exchange of its connection.
type Fault uint8

const (
	// LoseReply sends the next request, lets the server answer all of it
	// (up to its ReadyForQuery), and then breaks the connection before the
	// client reads the answer: as a reply lost to a network failure, the
	// request took effect (a COMMIT committed) and the client only sees
	// its connection broken.
	LoseReply Fault = iota + 1
	// DropRequest breaks the connection instead of sending the next
	// request: it has no effect (an open transaction is rolled back by the
	// server), and the client sees its connection broken.
	DropRequest
)

// ErrInjected is the error of a connection that a Fault broke.
var ErrInjected = errors.New("pgtest: connection broken by an injected fault")

// InjectFaults makes the connections cfg dials [FaultConn]s, whose next
// exchange a test can disturb (see [FaultConnOf], and the returned Faults
// for all of them at once). Call it before the pool is made.
func InjectFaults(cfg *pgxpool.Config) *Faults {
	f := &Faults{}
	dial := cfg.ConnConfig.DialFunc
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		f.mu.Lock()
		severed := f.severed
		f.mu.Unlock()
		if severed {
			return nil, ErrInjected // a dead process dials nothing, cancel requests included
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		fc := &FaultConn{Conn: c}
		f.mu.Lock()
		f.conns = append(f.conns, fc)
		f.mu.Unlock()
		return fc, nil
	}
	return f
}

// Faults are the connections of one pool made with InjectFaults.
type Faults struct {
	mu      sync.Mutex
	conns   []*FaultConn // every connection dialed; guarded by mu
	severed bool         // Sever was called: no dial succeeds; guarded by mu
}

// Next arms fault for the next request of every connection of the pool:
// with a pool of one connection (MaxConns 1), the next request the pool
// sends, from whichever caller.
func (f *Faults) Next(fault Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Next(fault)
	}
}

// Sever closes the sockets of every connection of the pool at once, as the
// death of the process that holds them would: the server sees them closed
// (the statements under way run on until it notices), and the client's
// next read or write fails with ErrInjected. No connection is dialed after
// it: not even the cancel request pgx sends when a read fails, which a
// dead process would not send.
func (f *Faults) Sever() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.severed = true
	for _, c := range f.conns {
		c.mu.Lock()
		c.broken = true
		c.mu.Unlock()
		_ = c.Conn.Close()
	}
}

// FaultConnOf returns the FaultConn under a connection of a pool made with
// InjectFaults, such as the connection of a transaction
// (tx.Conn().PgConn()); nil for another connection.
func FaultConnOf(c *pgconn.PgConn) *FaultConn {
	fc, _ := c.Conn().(*FaultConn)
	return fc
}

// FaultConn is a connection to PostgreSQL whose next exchange a test can
// disturb with a [Fault].
type FaultConn struct {
	net.Conn

	mu      sync.Mutex
	next    Fault  // armed for the next request; guarded by mu
	losing  bool   // a request was sent under LoseReply: read its answer up to ReadyForQuery, then break; guarded by mu
	broken  bool   // guarded by mu
	pending []byte // server bytes read while losing, not yet framed; guarded by mu
}

// Next arms f for the connection's next request: the next write after the
// client has read the previous answer.
func (c *FaultConn) Next(f Fault) {
	c.mu.Lock()
	c.next = f
	c.mu.Unlock()
}

// Write sends p to the server unless a fault is armed: after DropRequest
// it closes the connection without sending and returns ErrInjected, as it
// does for every call once the connection is broken. LoseReply lets p
// through and arms Read to lose its answer.
func (c *FaultConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	f := c.next
	c.next = 0
	broken := c.broken
	if f == DropRequest {
		c.broken = true
	}
	if f == LoseReply {
		c.losing = true
	}
	c.mu.Unlock()
	switch {
	case broken:
		return 0, ErrInjected
	case f == DropRequest:
		_ = c.Conn.Close()
		return 0, ErrInjected
	}
	return c.Conn.Write(p)
}

// Read passes the server's bytes through, except after LoseReply: then it
// reads the whole answer to the request (to ReadyForQuery, so every
// statement, COMMIT included, has run on the server), drops it, breaks the
// connection and returns ErrInjected, as it does for every call once the
// connection is broken.
func (c *FaultConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	losing, broken := c.losing, c.broken
	c.mu.Unlock()
	switch {
	case broken:
		return 0, ErrInjected
	case !losing:
		return c.Conn.Read(p)
	}
	// Read the whole answer, to the server's ReadyForQuery: by then every
	// statement of the request, COMMIT included, has run. Then break.
	buf := make([]byte, 8192)
	for {
		n, err := c.Conn.Read(buf)
		c.mu.Lock()
		c.pending = append(c.pending, buf[:n]...)
		done := readyForQuery(&c.pending)
		if done || err != nil {
			c.broken = true
			c.mu.Unlock()
			_ = c.Conn.Close()
			return 0, ErrInjected
		}
		c.mu.Unlock()
	}
}

// readyForQuery consumes the complete backend messages at the front of
// *b and reports whether one was a ReadyForQuery ('Z').
func readyForQuery(b *[]byte) bool {
	for len(*b) >= 5 {
		typ := (*b)[0]
		n := int(binary.BigEndian.Uint32((*b)[1:5])) + 1
		if len(*b) < n {
			return false
		}
		*b = (*b)[n:]
		if typ == 'Z' {
			return true
		}
	}
	return false
}
