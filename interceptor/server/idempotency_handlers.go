package server

import (
	"context"
	"sync"
)

// srvHandlers are the contexts of the keyed calls' handlers while they run
// (srvDetached, lease or joined mode), for Server.Shutdown: it waits for
// them to return, and cancels those still running when its context ends.
// A keyed handler runs detached from its caller by default, so neither
// the caller's end nor grpc.Server.Stop reaches it (issue 33, finding 5).
// Registering costs a first execution one lock and no allocation: the
// contexts are linked through their own fields.
type srvHandlers struct {
	mu      sync.Mutex
	head    *srvDetached  // the running handlers' contexts, linked by prev and next; guarded by mu
	n       int           // how many; guarded by mu
	closing bool          // Shutdown has begun: no handler starts; guarded by mu
	idle    chan struct{} // made by shutdown while n > 0, closed when n reaches 0; guarded by mu
}

// add registers d, the context of a handler about to run, and reports
// whether it may run: false once Shutdown has begun.
func (h *srvHandlers) add(d *srvDetached) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false
	}
	d.prev, d.next = nil, h.head
	if h.head != nil {
		h.head.prev = d
	}
	h.head = d
	h.n++
	return true
}

// remove unregisters d, whose handler has returned and whose claim is
// settled.
func (h *srvHandlers) remove(d *srvDetached) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d.prev != nil {
		d.prev.next = d.next
	} else {
		h.head = d.next
	}
	if d.next != nil {
		d.next.prev = d.prev
	}
	d.prev, d.next = nil, nil
	if h.n--; h.n == 0 && h.idle != nil {
		close(h.idle)
		h.idle = nil
	}
}

// shutdown stops handlers from starting and waits for the running ones to
// return and settle, until ctx ends: then it cancels those still running
// (their contexts end with context.Canceled) and returns ctx.Err() without
// waiting for them.
func (h *srvHandlers) shutdown(ctx context.Context) error {
	h.mu.Lock()
	h.closing = true
	if h.n == 0 {
		h.mu.Unlock()
		return nil
	}
	if h.idle == nil {
		h.idle = make(chan struct{})
	}
	idle := h.idle
	h.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
	}
	h.mu.Lock()
	for d := h.head; d != nil; d = d.next {
		d.end(context.Canceled)
	}
	h.mu.Unlock()
	return ctx.Err()
}
