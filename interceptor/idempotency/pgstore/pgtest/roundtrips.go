package pgtest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
)

// RoundTrips counts the round trips of the connections of one pool: each
// time a connection writes after it has read (or writes first), the client
// has had its answer and asks again. A pipeline (a pgx Batch) is one round
// trip however many statements it carries; so is a statement pgx prepares
// and runs in one exchange. It counts at the socket, whatever pgx does above
// it, so it sees every exchange: statements, batches, pings, the start-up of
// a connection.
type RoundTrips struct{ n atomic.Int64 }

// CountRoundTrips makes the connections cfg dials count their round trips
// in the returned counter. Call it before the pool is made.
func CountRoundTrips(cfg *pgxpool.Config) *RoundTrips {
	rt := &RoundTrips{}
	dial := cfg.ConnConfig.DialFunc
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, rt: rt, read: true}, nil
	}
	return rt
}

// N returns the round trips counted so far.
func (rt *RoundTrips) N() int64 { return rt.n.Load() }

type countingConn struct {
	net.Conn
	rt *RoundTrips

	mu   sync.Mutex
	read bool // the last operation was a read (or none yet); guarded by mu
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.read {
		c.rt.n.Add(1)
		c.read = false
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.read = true
		c.mu.Unlock()
	}
	return n, err
}
