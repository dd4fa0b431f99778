package interceptor

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// StreamClientInterceptor returns the interceptor for streaming calls
// (client, server and bidirectional streaming). A stream is retried until it
// commits: once a response header or message arrives, or once the messages
// it sent outgrow the replay buffer, its attempt is final and later errors
// reach the caller unchanged, so the caller never sees a message twice.
// Messages sent before the commit are kept and replayed, in order, on each
// new attempt.
func (c *Client) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return c.stream
}

func (c *Client) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	co := scanCallOptions(opts)
	st, mp := c.resolve(method, co.static)
	if mp.passthrough && !co.any && ctx.Value(idempotencyKeyCtxKey{}) == nil {
		return streamer(ctx, desc, cc, method, opts...)
	}
	if mp.hedge != nil && !mp.streamNoted.Load() {
		c.noteHedgedStream(mp)
	}
	s := &retryStream{
		c:        c,
		mp:       mp,
		desc:     desc,
		cc:       cc,
		method:   method,
		streamer: streamer,
		opts:     opts,
		limit:    c.opts.replayBuffer,
		sizer:    co.sizer,
		watch:    mp.g.any(),
	}
	s.ready.L = &s.mu
	s.buf = s.bufOne[:0]
	if mp.waitForReady != nil {
		s.opts = append(append([]grpc.CallOption(nil), opts...), grpc.WaitForReady(*mp.waitForReady))
	}
	s.ctx, s.cancelCall = streamContext(ctx, mp.timeout)
	s.r = c.newRetrier(s.ctx, st, mp, &co)
	s.ctx = s.r.outgoing(s.ctx)
	// A key makes a unary call safe to retry on more codes; a stream is not
	// enforced as one execution by the server's idempotency layer, so it
	// gets no key of the client's making (WithIdempotencyKeys naming its
	// service, WithAutomaticIdempotencyKeys), and its retrier is never
	// marked keyed: a stream that carries the caller's own key retries the
	// codes an unkeyed one does.
	var kerr error
	if s.ctx, _, kerr = withIdempotencyKey(s.ctx, false); kerr != nil {
		s.cancelCall()
		return nil, kerr
	}
	s.single = s.r.rp.maxAttempts <= 1 && s.r.rp.perAttempt == 0
	if !s.single {
		// A stream's per-attempt timeout is a timer, not a deadline: it
		// marks the trail itself when it fires (newAttempt).
		s.trail.Reset(s.ctx, time.Time{})
	}
	s.measured = s.single && st.storm.throttle != nil
	panicking := true
	defer s.endOnPanic(&panicking)
	err := s.start()
	panicking = false
	if err != nil {
		return nil, err
	}
	return s, nil
}

// noteHedgedStream logs, once per method and config, that a stream of
// mp's method runs under a hedging policy, which never hedges a stream:
// it runs one attempt, without retries. A stream the registry describes
// was named when the config was checked (checkRegistered, hedgedStreams);
// this is for the others (a service without generated code, or not linked
// in), which a config check cannot tell from a unary method.
func (c *Client) noteHedgedStream(mp *methodPolicy) {
	if mp.streamNoted.Swap(true) {
		return
	}
	svc, m := serviceconfig.SplitMethod(mp.fullMethod)
	if streamKind(serviceconfig.Name{Service: svc, Method: m}) != "" {
		return
	}
	c.log.warn("interceptor: " + mp.fullMethod + ": a stream under a hedgingPolicy, which never hedges a stream: " +
		"it runs one attempt, without retries (its method is not in protoregistry.GlobalFiles, so the config's check could not tell)")
}

// streamContext returns the context of a stream, which the stream cancels
// when it ends: the caller's, bounded by the config timeout as withTimeout
// bounds it, or the caller's itself (cancel is then noCancel). The first
// attempt runs under it: it is opened before the stream is shared, so no
// other call can end the stream while it opens, and an attempt that fails
// has ended its grpc stream before it is retired. Every later attempt, and
// an attempt with a per-attempt timeout, has a context of its own, which
// the stream's end cancels (an attempt opened as the stream ended by
// another call). A grpc stream below a call that panics is the caller's to
// end, by its context, as grpc documents for any stream.
func streamContext(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > timeout {
			if timeout <= time.Nanosecond {
				return context.WithDeadline(ctx, time.Now())
			}
			return context.WithTimeout(ctx, timeout)
		}
	}
	return ctx, noCancel
}

// streamState is where a retryStream is in its life:
//
//	idle ──open──► attempting ──commit──► committed
//	 ▲                 │                      │
//	 └──────fail───────┘                      │
//	                                          ▼
//	     (every state) ───────end─────────► done
//
// open admits, creates and replays the next attempt; fail retires a failed
// attempt before commit and, as the driver, decides on the retry. end
// releases what the stream holds and records the final error.
type streamState uint8

const (
	// stateIdle: no attempt is live. The stream is opening its first
	// attempt, or one goroutine, the driver, is replacing a failed one:
	// retry decision, backoff, admission, creation, replay.
	stateIdle streamState = iota
	// stateAttempting: cur is live and may still fail and be retried.
	stateAttempting
	// stateCommitted: cur is final; its messages and errors reach the
	// caller as they come.
	stateCommitted
	// stateDone: the stream has ended; every later call returns final.
	stateDone
)

// retryStream is the grpc.ClientStream a caller holds. As grpc allows, one
// goroutine may send (SendMsg, CloseSend) while another receives (RecvMsg,
// Header). Whichever call first finds the live attempt ended before the
// commit drives the retry: RecvMsg by its error, Header by missing headers,
// SendMsg by io.EOF; the others wait for the next attempt, or, for sends,
// leave their message in the replay buffer.
//
// Invariants:
//   - A message is delivered to the caller at most once: only the live
//     attempt's messages are delivered, and the first one commits it, so no
//     later attempt runs.
//   - No sent message is lost before the commit: every message the caller
//     sent is in buf, in order, and a new attempt is sent all of buf before
//     it becomes cur (replay). A SendMsg that returns nil before the commit
//     put its message on cur or left it in buf for the replay.
//   - Every attempt's admission is released exactly once, by
//     releaseAttempt, which every way an attempt ends leads to.
//   - At most one goroutine drives, while the state is idle; it alone uses
//     r then, and it never waits on ready.
//   - No call into the grpc stream below is made with mu held.
type retryStream struct {
	c          *Client
	mp         *methodPolicy
	ctx        context.Context    // the call's: the caller's, bounded by the config timeout
	cancelCall context.CancelFunc // ends ctx: called once the stream is done (finish)
	desc       *grpc.StreamDesc
	cc         *grpc.ClientConn
	method     string
	streamer   grpc.Streamer
	opts       []grpc.CallOption
	limit      int       // replay buffer bound, bytes
	sizer      wireSizer // measures messages toward limit
	single     bool      // nothing to retry: the first attempt is committed at once
	// measured is set on a single stream under A6 throttling: its sends
	// are counted in sent, so that its failure is charged to the throttle
	// only when grpc-go would not have committed it by its retry buffer.
	measured bool
	watch    bool // attempts hold guards or owe adaptive throttling an outcome, so they watch their grpc stream's context

	// trail is ctx with the call's trail of endpoints, the context every
	// attempt derives from when the stream is not single (attemptBase).
	trail trail.Context

	// r is used by the driver while the state is idle, and otherwise by
	// the call that ends the stream (see stopDriving).
	r retrier

	mu    sync.Mutex
	ready sync.Cond // on mu; broadcast when state, cur or an attempt's reading changes
	state streamState
	// cur is the live attempt while attempting or committed, else nil.
	cur *streamAttempt
	// last is the latest attempt created; never nil once start succeeded.
	last     *streamAttempt
	buf      []any // messages sent before the commit, for replay
	bufBytes int   // their size as sizer counts it
	sent     int   // the size of the messages sent, when measured
	// bufOne backs buf until a second message is kept, so that a stream
	// with one request (server streaming) keeps it without allocating.
	bufOne [1]any
	// first is the first attempt, in the stream's own allocation: the
	// success path allocates no attempt of its own.
	first     streamAttempt
	closeSent bool
	driving   bool  // a driver is at work (state idle)
	final     error // set when done: io.EOF after success, else the error

	// carried is a panic of a hook's on the watch's goroutine (see
	// attemptEnded), for the caller's next call on the stream to panic
	// with; nil: none.
	carried atomic.Pointer[carriedPanic]
}

// endOnPanic, deferred by each call that calls below the interceptor, ends
// the stream when that call panics (*panicking is still true): the panic
// goes on up to the caller, and the stream's attempt is released on its
// way.
func (s *retryStream) endOnPanic(panicking *bool) {
	if *panicking {
		s.endHere(errPanicked)
	}
}

// carriedPanic is the value a hook panicked with on the watch's goroutine.
type carriedPanic struct{ v any }

// carryPanic, deferred on the watch's goroutine where it releases an
// attempt (attemptEnded), keeps a panic there for the caller: a hook runs
// in that release (WithOnStateChange on the breaker's verdict, the meter
// provider's instruments), and a panic on a goroutine of ours would end the
// process.
func (s *retryStream) carryPanic() {
	if v := recover(); v != nil {
		s.carried.CompareAndSwap(nil, &carriedPanic{v: v})
	}
}

// rethrow panics with the panic carryPanic kept, once: called first by
// each call of the caller's on the stream, whose endOnPanic then ends the
// stream, as a panic below the interceptor does.
func (s *retryStream) rethrow() {
	if p := s.carried.Load(); p != nil && s.carried.CompareAndSwap(p, nil) {
		panic(p.v)
	}
}

// SendMsg sends m on the live attempt and keeps it for replay until the
// stream commits; while a retry is under way, m only joins the replay. A
// message that takes the buffer past its bound commits the attempt once it
// is sent there; past the bound, sends wait for the next attempt. io.EOF
// means the stream has ended and RecvMsg gives its status, as in grpc; any
// other error ends the stream.
func (s *retryStream) SendMsg(m any) error {
	panicking := true
	defer s.endOnPanic(&panicking)
	s.rethrow()
	err := s.send(m)
	panicking = false
	return err
}

func (s *retryStream) send(m any) error {
	a, kept, err := s.enqueue(m)
	if a == nil {
		return err
	}
	s.enter(a)
	defer s.leave(a)
	err = a.cs.SendMsg(m)
	switch {
	case err == nil:
		if kept {
			s.commitIfPastBound(a)
		}
		return nil
	case err != io.EOF:
		// A client-side error (size, marshalling): grpc has ended its stream.
		s.endHere(err)
		return err
	case !kept:
		return io.EOF
	}
	// a ended before the commit, and m is in buf.
	s.probe(a)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != stateDone && s.cur != a {
		return nil // replaced: the replay sent m, or will
	}
	return io.EOF
}

// enqueue decides where m goes: the attempt to send it on (nil when there
// is none: a retry is under way and m joins the replay, or the stream is
// done and err is io.EOF), and whether m is kept in buf for replay.
func (s *retryStream) enqueue(m any) (a *streamAttempt, kept bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.state == stateIdle && s.bufBytes > s.limit {
		s.ready.Wait() // past the bound: the next attempt commits at its replay
	}
	switch s.state {
	case stateDone:
		return nil, false, io.EOF
	case stateCommitted:
		if s.measured {
			s.sent += s.sizer.size(m, s.limit)
		}
		return s.cur, false, nil
	}
	s.buf = append(s.buf, m)
	s.bufBytes += s.sizer.size(m, s.limit)
	return s.cur, true, nil
}

// commitIfPastBound commits a, on which a kept message was just sent, when
// buf has outgrown its bound and a is still the live attempt.
func (s *retryStream) commitIfPastBound(a *streamAttempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == a && s.bufBytes > s.limit {
		s.commitLocked()
	}
}

// RecvMsg receives the next message. Before the commit, a failed attempt is
// retried under the method's policy and the receive goes on on the new
// attempt. Once the stream has ended, it returns the final error: io.EOF
// after success, else the same error every time.
func (s *retryStream) RecvMsg(m any) error {
	panicking := true
	defer s.endOnPanic(&panicking)
	s.rethrow()
	err := s.recv(m)
	panicking = false
	return err
}

func (s *retryStream) recv(m any) error {
	for {
		a := s.claim()
		if a == nil {
			return s.finalErr()
		}
		err := a.cs.RecvMsg(m)
		done, ret := s.received(a, err)
		s.dropClaim(a)
		s.leave(a)
		if done {
			return ret
		}
	}
}

// Header returns the header metadata of the attempt that answers. Before the
// commit, it waits for the live attempt's headers, which commit it; an
// attempt that ends without headers is retried as RecvMsg would retry it
// (gRFC A6), and Header waits for the next. When the stream ends without
// headers, Header returns nil, nil, as grpc does, and RecvMsg gives the
// error. A non-nil error from the stream below ends the stream.
func (s *retryStream) Header() (metadata.MD, error) {
	panicking := true
	defer s.endOnPanic(&panicking)
	s.rethrow()
	md, err := s.header()
	panicking = false
	return md, err
}

func (s *retryStream) header() (metadata.MD, error) {
	for {
		a, st := s.live()
		if st == stateDone {
			return a.cs.Header()
		}
		s.enter(a)
		md, err := a.cs.Header()
		switch {
		case err != nil:
			s.endHere(err)
		case md != nil:
			s.commitAttempt(a)
		case st == stateAttempting:
			s.probe(a) // a ended before the commit: retry, then try again
			s.leave(a)
			continue
		}
		s.leave(a)
		return md, err
	}
}

// CloseSend closes the sending side of the live attempt; an attempt opened
// later is closed after its replay.
func (s *retryStream) CloseSend() error {
	panicking := true
	defer s.endOnPanic(&panicking)
	s.rethrow()
	s.mu.Lock()
	s.closeSent = true
	a := s.cur
	s.mu.Unlock()
	var err error
	if a != nil {
		err = a.cs.CloseSend()
	}
	panicking = false
	return err
}

// halfClosed reports whether the caller has closed its sending side.
func (s *retryStream) halfClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closeSent
}

// Trailer returns the trailer of the live attempt, or of the latest.
func (s *retryStream) Trailer() metadata.MD {
	return s.latest().cs.Trailer()
}

// Context returns the context of the live attempt, or of the latest. Unlike
// grpc-go's, it does not commit the stream (gRFC A6 commits on headers, a
// message or the replay bound only), so before the commit the context
// returned may end with its attempt while the stream retries.
func (s *retryStream) Context() context.Context {
	return s.latest().cs.Context()
}

func (s *retryStream) latest() *streamAttempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		return s.cur
	}
	return s.last
}
