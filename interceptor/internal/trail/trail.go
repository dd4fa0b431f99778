// Package trail carries, in the context of each attempt of one logical
// call, the endpoints the call's earlier attempts (retries, hedged copies)
// were sent to. The client interceptor puts a Trail in the context; the
// endpoint load-balancing policy reads it when it picks, prefers an
// endpoint not on it, and adds the one it picked.
package trail

import (
	"context"
	"sync/atomic"
)

// Size is the number of picks a Trail remembers: more than any call's
// attempts (the client caps MaxAttempts at 5 by default).
const Size = 8

// Trail is the endpoints one call has used. It is safe for concurrent use:
// hedged copies pick at once.
type Trail struct {
	n   atomic.Int32
	ids [Size]atomic.Uint64 // endpoint ids, 1-based: 0 is no endpoint
	// addr is the address of an endpoint used before the Trail existed (the
	// peer of a call's first attempt), "" if none. Written before the
	// Trail is shared, read-only after.
	addr string
}

// Add records a pick of the endpoint id (≥ 1). Picks past Size are
// forgotten.
func (t *Trail) Add(id uint64) {
	if i := t.n.Add(1) - 1; i < Size {
		t.ids[i].Store(id)
	}
}

// Has reports whether the endpoint id, with the addresses addrs, was used.
func (t *Trail) Has(id uint64, addrs []string) bool {
	n := min(int(t.n.Load()), Size)
	for i := range n {
		if t.ids[i].Load() == id {
			return true
		}
	}
	if t.addr != "" {
		for _, a := range addrs {
			if a == t.addr {
				return true
			}
		}
	}
	return false
}

// ctx is a context carrying a Trail, in one allocation.
type ctx struct {
	context.Context
	t Trail
}

type key struct{}

func (c *ctx) Value(k any) any {
	if k == (key{}) {
		return &c.t
	}
	return c.Context.Value(k)
}

// NewContext returns parent with a new Trail, which already holds addr ("":
// none), the address of an endpoint the call used before.
func NewContext(parent context.Context, addr string) context.Context {
	c := &ctx{Context: parent}
	c.t.addr = addr
	return c
}

// FromContext returns the Trail in c, or nil.
func FromContext(c context.Context) *Trail {
	t, _ := c.Value(key{}).(*Trail)
	return t
}
