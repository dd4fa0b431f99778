package server

import (
	"crypto/sha256"
	"hash/maphash"
	"sync"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// srvFlights coalesces concurrent calls of one process with the same record
// key and request fingerprint, singleflight-style: one leader talks to the
// store and runs the handler; the others wait for it and take its outcome
// when it is one that a later duplicate would get too (a stored record, a
// fingerprint mismatch, ABORTED with waiting off). Otherwise (the outcome was
// not stored, the leader's context ended, the store failed, the handler
// panicked) they compete again, and one of them leads the next flight.
//
// Calls with another fingerprint are in another flight, so they never take
// this one's outcome; the store tells them about the mismatch.
//
// Flights are indexed by a seeded hash of their key and chained on a
// collision, so the map holds no pointers in its keys and hashes each key
// once per call. A flight that no call joined is recycled: nothing but the
// map and its leader ever held it.
type srvFlights struct {
	seed maphash.Seed // immutable
	pool sync.Pool    // of *srvFlight, zeroed

	mu sync.Mutex
	m  map[uint64]*srvFlight // running flights by the hash of their key; guarded by mu
}

func newSrvFlights() srvFlights {
	return srvFlights{seed: maphash.MakeSeed(), m: make(map[uint64]*srvFlight, 64)}
}

type srvFlightKey struct {
	rk idempotency.RecordKey
	fp [sha256.Size]byte
}

// srvFlight is one in-process execution. Before it joins, it is a call's
// scratch: buf holds its marshalled request, to fingerprint it.
type srvFlight struct {
	buf  []byte        // owned by the call that got the flight, until it joins
	key  srvFlightKey  // written by the leader before it joins; immutable until it is recycled
	hash uint64        // of key; immutable until it is recycled
	next *srvFlight    // next running flight with the same hash; guarded by srvFlights.mu
	done chan struct{} // made by the first waiter, closed by the leader when out is final; guarded by srvFlights.mu
	out  srvOutcome    // written by the leader only, before it finishes the flight
}

// srvOutcome is what a flight's waiters get.
type srvOutcome struct {
	ok       bool                // waiters take this outcome; false: compete again
	rec      *idempotency.Record // replay this record, or
	err      error               // return this error,
	pushback bool                // with the grpc-retry-pushback-ms trailer
}

// get returns a flight to fill in (key, then hash) and join.
func (g *srvFlights) get() *srvFlight {
	if f, _ := g.pool.Get().(*srvFlight); f != nil {
		return f
	}
	return new(srvFlight)
}

// setKey sets f's key and hash.
func (g *srvFlights) setKey(f *srvFlight, rk idempotency.RecordKey) {
	f.key.rk = rk
	f.hash = maphash.Comparable(g.seed, f.key)
}

// join starts the flight nf, which the caller then leads and must finish,
// and returns it with done nil; or, when a flight with the same key runs,
// returns that flight and a channel closed when it ends, and nf stays the
// caller's, to join again or to put back. The channel is made only when a
// second call joins, so a call without duplicates allocates nothing here.
func (g *srvFlights) join(nf *srvFlight) (f *srvFlight, done <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	first := g.m[nf.hash]
	for f := first; f != nil; f = f.next {
		if f.key == nf.key {
			if f.done == nil {
				f.done = make(chan struct{})
			}
			return f, f.done
		}
	}
	nf.next = first
	g.m[nf.hash] = nf
	return nf, nil
}

// finish ends the flight f and wakes its waiters; f is recycled when it had
// none. The leader must not touch f afterwards.
func (g *srvFlights) finish(f *srvFlight) {
	g.mu.Lock()
	if first := g.m[f.hash]; first == f {
		if f.next == nil {
			delete(g.m, f.hash)
		} else {
			g.m[f.hash] = f.next
		}
	} else {
		p := first
		for p.next != f {
			p = p.next
		}
		p.next = f.next
	}
	done := f.done
	g.mu.Unlock()
	if done != nil {
		close(done) // waiters read f.out: f is theirs too now
		return
	}
	g.put(f)
}

// srvKeepBuf is the largest request buffer a recycled flight keeps, and a
// waiting call holds.
const srvKeepBuf = 64 << 10

// put recycles f, which no one else holds: never joined, or finished
// without waiters. It keeps f's buffer unless it grew large.
func (g *srvFlights) put(f *srvFlight) {
	buf := f.buf[:0]
	if cap(buf) > srvKeepBuf {
		buf = nil
	}
	*f = srvFlight{buf: buf}
	g.pool.Put(f)
}
