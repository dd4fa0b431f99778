// Package trail carries, in the context of every attempt of one logical
// call, the endpoints the call's attempts (its first, retries, hedged
// copies) were sent to, and what the endpoint policy needs to know of the
// client's own timers and of the call's end (a hedged copy cancelled as
// another copy's outcome ended the call). The client interceptor puts a
// Trail in the context of each attempt of a call that may send more than
// one; the endpoint load-balancing policy reads it when it picks, prefers an
// endpoint not on it, and adds the one it picked. Identity is exact: the
// policy records its own endpoint, whatever address the connection reports
// (a host name in the resolver, a proxy).
//
// A call that sends one attempt carries no Trail, and neither does a call
// on a channel whose load-balancing policy is not the endpoint policy
// (Wanted): a Trail is one allocation, which only that policy repays. A
// Trail's context is never reused for another call: grpc may read an
// attempt's context after the call has returned (a late RST_STREAM, a stats
// handler's late event), so pooled contexts would hand it another call's
// values.
package trail

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Size is the number of picks a Trail remembers: more than any call's
// attempts (the client caps MaxAttempts at 5 by default) and grpc's
// transparent retries of them.
const Size = 8

// Trail is the endpoints one call has used. It is safe for concurrent use:
// hedged copies pick at once.
type Trail struct {
	n   atomic.Int32
	ids [Size]atomic.Uint64 // endpoint ids, 1-based: 0 is no endpoint
	// timedOut[i] is set when the client's per-attempt timer ended the
	// attempt of pick i (streams: the timer cancels the attempt).
	timedOut [Size]atomic.Bool
	// ended is set when a hedged call's outcome is known, before the
	// client cancels the copies still running, if any.
	ended atomic.Bool
	// own is the instant (UnixNano) before which an attempt's deadline is
	// the client's per-attempt timeout rather than its caller's; 0: no
	// attempt's deadline is. Written before the Trail is shared.
	own int64
}

// Add records a pick of the endpoint id (≥ 1) and returns its slot, or −1
// when the Trail is full (picks past Size are forgotten).
func (t *Trail) Add(id uint64) int {
	i := t.n.Add(1) - 1
	if i >= Size {
		return -1
	}
	t.ids[i].Store(id)
	return int(i)
}

// Has reports whether the endpoint id was used.
func (t *Trail) Has(id uint64) bool {
	n := min(int(t.n.Load()), Size)
	for i := range n {
		if t.ids[i].Load() == id {
			return true
		}
	}
	return false
}

// Len returns the number of picks recorded (at most Size).
func (t *Trail) Len() int { return min(int(t.n.Load()), Size) }

// OwnDeadline reports whether an attempt whose context has the deadline dl
// is bounded by the client's per-attempt timeout: its DEADLINE_EXCEEDED
// then says the endpoint did not answer in the time the configuration
// gives an attempt, not that the caller ran out of time.
func (t *Trail) OwnDeadline(dl time.Time) bool {
	return t.own != 0 && dl.UnixNano() < t.own
}

// MarkTimedOut records that the client's per-attempt timer ended the
// attempt of the latest pick (a stream's timer, which cancels the attempt:
// grpc reports CANCELLED). The client calls it before it cancels.
func (t *Trail) MarkTimedOut() {
	if i := min(int(t.n.Load()), Size) - 1; i >= 0 {
		t.timedOut[i].Store(true)
	}
}

// TimedOut reports whether the attempt of pick slot was ended by the
// client's per-attempt timer (MarkTimedOut).
func (t *Trail) TimedOut(slot int) bool {
	return slot >= 0 && slot < Size && t.timedOut[slot].Load()
}

// MarkEnded records that the call's outcome is known (a copy's answer or
// fatal status), while its caller is still there: the CANCELLED of an
// attempt still running then says that it had not answered by that time,
// not that the caller gave up. The client calls it before it cancels
// them.
func (t *Trail) MarkEnded() { t.ended.Store(true) }

// Ended reports whether MarkEnded was called.
func (t *Trail) Ended() bool { return t.ended.Load() }

// Context is a context carrying a Trail, in one value: a caller embeds it
// in an allocation it makes for the call anyway (a stream's), and Resets
// it once, before the call's first attempt. A Context must never be Reset
// for another call: grpc may read it after the call has ended.
type Context struct {
	context.Context
	t Trail
}

type key struct{}

// Value returns the Trail for the package's key, else the parent's value.
func (c *Context) Value(k any) any {
	if k == (key{}) {
		return &c.t
	}
	return c.Context.Value(k)
}

// Reset makes c a fresh Trail over parent. own is the instant before which
// an attempt's deadline is the client's per-attempt timeout (see
// OwnDeadline); zero when the call's per-attempt timeout is not the
// configuration's (none, or a caller's call option).
func (c *Context) Reset(parent context.Context, own time.Time) {
	c.Context = parent
	c.t.n.Store(0)
	for i := range Size {
		c.t.ids[i].Store(0)
		c.t.timedOut[i].Store(false)
	}
	c.t.ended.Store(false)
	c.t.own = 0
	if !own.IsZero() {
		c.t.own = own.UnixNano()
	}
}

// Trail returns c's Trail.
func (c *Context) Trail() *Trail { return &c.t }

// NewContext returns parent with a new Trail (one allocation); own is as
// for Context.Reset.
func NewContext(parent context.Context, own time.Time) context.Context {
	c := new(Context)
	c.Reset(parent, own)
	return c
}

// FromContext returns the Trail in c, or nil.
func FromContext(c context.Context) *Trail {
	t, _ := c.Value(key{}).(*Trail)
	return t
}

// OwnBound returns the instant to pass as own for a call whose context has
// the deadline dl (zero: none) and whose client keeps headroom before it:
// an attempt deadline earlier than dl − headroom is the per-attempt
// timeout's. With no deadline, every attempt deadline is (the far future).
func OwnBound(dl time.Time, headroom time.Duration) time.Time {
	if dl.IsZero() {
		return time.Unix(0, 1<<62)
	}
	return dl.Add(-max(headroom, 0))
}

// wanted counts, per channel target (grpc.ClientConn.Target), the endpoint
// policies alive on it; anyWanted counts them all, so that a process using
// none pays one atomic load per call. wantMu orders Want and its release,
// so that an entry is deleted only at zero.
var (
	wantMu    sync.Mutex
	wanted    sync.Map // string → *atomic.Int32
	anyWanted atomic.Int32
)

// Want records that an endpoint policy on target reads trails, until the
// returned function is called (once; later calls do nothing).
func Want(target string) (release func()) {
	wantMu.Lock()
	v, _ := wanted.LoadOrStore(target, new(atomic.Int32))
	n := v.(*atomic.Int32)
	n.Add(1)
	wantMu.Unlock()
	anyWanted.Add(1)
	return sync.OnceFunc(func() {
		wantMu.Lock()
		if n.Add(-1) == 0 {
			wanted.Delete(target)
		}
		wantMu.Unlock()
		anyWanted.Add(-1)
	})
}

// Wanted reports whether an endpoint policy on target reads trails: only
// then is a call's Trail worth its allocation. A channel whose policy is
// not yet built (its very first calls), or closed while idle, has none.
func Wanted(target string) bool {
	if anyWanted.Load() == 0 {
		return false
	}
	v, ok := wanted.Load(target)
	return ok && v.(*atomic.Int32).Load() > 0
}
