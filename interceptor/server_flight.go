package interceptor

import (
	"crypto/sha256"
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
type srvFlights struct {
	mu sync.Mutex
	m  map[srvFlightKey]*srvFlight // running flights; guarded by mu
}

type srvFlightKey struct {
	rk idempotency.RecordKey
	fp [sha256.Size]byte
}

// srvFlight is one in-process execution.
type srvFlight struct {
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

// join returns the running flight of k and a channel closed when it ends,
// or starts a flight that the caller leads (done nil) and must finish. The
// channel is made only when a second call joins, so a call without
// duplicates allocates only the flight.
func (g *srvFlights) join(k srvFlightKey) (f *srvFlight, done <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if f := g.m[k]; f != nil {
		if f.done == nil {
			f.done = make(chan struct{})
		}
		return f, f.done
	}
	f = &srvFlight{}
	g.m[k] = f
	return f, nil
}

// finish ends the flight f of k and wakes its waiters.
func (g *srvFlights) finish(k srvFlightKey, f *srvFlight) {
	g.mu.Lock()
	delete(g.m, k)
	done := f.done
	g.mu.Unlock()
	if done != nil {
		close(done)
	}
}
