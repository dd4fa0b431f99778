package interceptor

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
	st := c.state.Load()
	mp := st.policy(method)
	co := scanCallOptions(opts)
	if mp.passthrough && !co.any && ctx.Value(idempotencyKeyCtxKey{}) == nil {
		return streamer(ctx, desc, cc, method, opts...)
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
	}
	s.ready = sync.NewCond(&s.mu)
	if mp.waitForReady != nil {
		s.opts = append(append([]grpc.CallOption(nil), opts...), grpc.WaitForReady(*mp.waitForReady))
	}
	s.ctx, s.cancelCall = ctx, func() {}
	if mp.timeout > 0 {
		s.ctx, s.cancelCall = withTimeout(ctx, mp.timeout)
	}
	s.r = c.newRetrier(s.ctx, st, mp, &co)
	s.ctx = s.r.outgoing(s.ctx)
	var kerr error
	if s.ctx, s.r.keyed, kerr = withIdempotencyKey(s.ctx, mp); kerr != nil {
		s.cancelCall()
		return nil, kerr
	}
	if s.r.rp.maxAttempts <= 1 && s.r.rp.perAttempt == 0 {
		s.committed = true // nothing to retry: a plain stream with guards
	}
	if err := s.start(); err != nil {
		s.cancelCall()
		return nil, err
	}
	if mp.g.breaker != nil || mp.g.bulkhead != nil {
		// A caller that abandons a stream cancels its context (grpc asks it
		// to): the attempt's slot and token are released then.
		s.unwatch = context.AfterFunc(s.ctx, func() {
			s.finish(status.FromContextError(s.ctx.Err()).Err())
		})
	}
	return s, nil
}

// streamAttempt is one attempt of a stream.
type streamAttempt struct {
	cs       grpc.ClientStream
	adm      admission // the breaker token and bulkhead slot it holds
	released bool      // adm was released; guarded by the stream's mu
	cancel   context.CancelFunc
	timer    *time.Timer // the per-attempt timeout until commit; nil if none
	timedOut atomic.Bool // the timer fired while the call was live
}

// stop releases the attempt's timer and, when release is set, its context.
func (a *streamAttempt) stop(release bool) {
	if a.timer != nil {
		a.timer.Stop()
	}
	if release {
		a.cancel()
	}
}

// retryStream is the grpc.ClientStream a caller holds. Sends may run on one
// goroutine while receives run on another, as grpc allows; retries happen on
// the receiving side (RecvMsg or Header), with sends held out of the new
// attempt until the replay is done.
type retryStream struct {
	c          *Client
	mp         *methodPolicy
	ctx        context.Context // the call's: the caller's, bounded by the config timeout
	cancelCall context.CancelFunc
	desc       *grpc.StreamDesc
	cc         *grpc.ClientConn
	method     string
	streamer   grpc.Streamer
	opts       []grpc.CallOption
	limit      int // replay buffer bound, bytes

	// r is used by the receiving goroutine only (and by start).
	r retrier
	// unwatch stops the watch on the call's context; nil when none.
	unwatch func() bool

	mu    sync.Mutex
	ready *sync.Cond // signalled when cur is set again or the stream is done
	// cur is the live attempt; nil while a retry is being set up. last is
	// the latest attempt, never nil after start.
	cur, last  *streamAttempt
	committed  bool  // no more retries: cur is final
	buf        []any // messages sent before commit, for replay
	bufBytes   int
	closeSent  bool
	sendBroken bool // cur's SendMsg returned io.EOF: its status will come from RecvMsg
	done       bool
}

// start creates the first attempt, retrying creation failures.
func (s *retryStream) start() error {
	for {
		a, err := s.newAttempt()
		if err == nil {
			s.mu.Lock()
			s.cur, s.last = a, a
			s.mu.Unlock()
			return nil
		}
		if ferr := s.afterFailure(err, nil, false); ferr != nil {
			return ferr
		}
	}
}

// errStop wraps an error that ends the stream at once, without the retry
// decision: a rejection, or no time left.
type errStop struct{ err error }

func (e errStop) Error() string { return e.err.Error() }

// newAttempt opens attempt number s.r.attempts+1, once the deadline, the
// breaker and the bulkhead allow it. A refusal comes back as an errStop
// holding the call's final error.
func (s *retryStream) newAttempt() (*streamAttempt, error) {
	now := time.Now()
	if timeout, bounded := s.r.attemptTimeout(s.ctx, now); bounded && timeout <= 0 {
		return nil, errStop{s.r.outOfTime(s.r.lastErr)}
	}
	s.r.begin(now)
	adm, rerr := s.mp.g.admit(s.ctx, s.method, now)
	if rerr != nil {
		s.r.settle(false)
		reason, ok := isRejection(rerr)
		if !ok {
			reason = stopOfContext(s.ctx.Err())
		}
		return nil, errStop{s.r.stopped(rerr, s.r.lastErr, reason)}
	}
	s.r.attempts++
	actx, cancel := context.WithCancel(attemptContext(s.ctx, s.r.attempts))
	a := &streamAttempt{adm: adm, cancel: cancel}
	if d := s.r.rp.perAttempt; d > 0 && !s.committed {
		a.timer = time.AfterFunc(d, func() {
			if s.ctx.Err() == nil {
				a.timedOut.Store(true)
			}
			cancel()
		})
	}
	cs, err := s.streamer(actx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		a.stop(true)
		if a.timedOut.Load() {
			err = s.attemptTimeoutError()
		}
		s.mp.g.release(s.ctx, adm, err, false)
		s.c.metrics.attempt(s.ctx, &s.mp.mm, err)
		return nil, err
	}
	a.cs = cs
	return a, nil
}

func (s *retryStream) attemptTimeoutError() error {
	return status.Errorf(codes.DeadlineExceeded, "per-attempt timeout of %v exceeded", s.r.rp.perAttempt)
}

// afterFailure decides on a failed attempt and, when retrying, waits out the
// backoff. It returns nil to retry, or the error to end the stream with.
func (s *retryStream) afterFailure(err error, trailer metadata.MD, timedOut bool) error {
	var stop errStop
	if errors.As(err, &stop) {
		return stop.err
	}
	s.r.lastErr = err
	if s.r.rp.maxAttempts <= 1 {
		if !s.r.wrap {
			return err
		}
		if s.r.noRetry != StopNone {
			return s.r.stopped(err, err, s.r.noRetry)
		}
	}
	d := s.r.decide(s.ctx, err, trailer, timedOut)
	if d.stop != StopNone {
		return s.r.stopped(err, err, d.stop)
	}
	s.r.onRetry(s.ctx, err, d)
	if werr := s.r.wait(s.ctx, d.delay); werr != nil {
		return s.r.cancelled(werr, err)
	}
	return nil
}

// retry replaces the failed attempt a. It returns nil when a new attempt is
// in place, or the error that ends the stream.
func (s *retryStream) retry(a *streamAttempt, err error) error {
	// The attempt is over, so Header does not block: headers that arrived
	// before the failure commit the attempt (gRFC A6).
	if md, _ := a.cs.Header(); md != nil {
		s.commit()
		return s.r.stopped(err, err, StopCommitted)
	}
	s.mu.Lock()
	if s.committed {
		s.mu.Unlock()
		return s.r.stopped(err, err, StopCommitted)
	}
	s.cur = nil
	s.mu.Unlock()

	timedOut := a.timedOut.Load()
	a.stop(true)
	if timedOut {
		err = s.attemptTimeoutError()
	}
	s.releaseAttempt(a, err)
	trailer := a.cs.Trailer()
	for {
		if ferr := s.afterFailure(err, trailer, timedOut); ferr != nil {
			return ferr
		}
		next, nerr := s.newAttempt()
		if nerr != nil {
			err, trailer, timedOut = nerr, nil, false
			continue
		}
		s.install(next)
		return nil
	}
}

// install replays the buffered messages on a and makes it current.
func (s *retryStream) install(a *streamAttempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	broken := false
	for _, m := range s.buf {
		if err := a.cs.SendMsg(m); err != nil {
			broken = true
			break
		}
	}
	if s.closeSent && !broken {
		_ = a.cs.CloseSend()
	}
	s.cur, s.last, s.sendBroken = a, a, broken
	s.ready.Broadcast()
}

// commit makes the current attempt final.
func (s *retryStream) commit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commitLocked()
}

func (s *retryStream) commitLocked() {
	if s.committed {
		return
	}
	s.committed = true
	s.buf, s.bufBytes = nil, 0
	if s.cur != nil {
		s.cur.stop(false)
	}
}

// releaseAttempt returns a's breaker token and bulkhead slot, once.
func (s *retryStream) releaseAttempt(a *streamAttempt, err error) {
	s.mu.Lock()
	done := a.released
	a.released = true
	s.mu.Unlock()
	if !done {
		s.mp.g.release(s.ctx, a.adm, err, false)
		s.c.metrics.attempt(s.ctx, &s.mp.mm, err)
	}
}

// finish ends the stream with err (nil for success): it settles the
// accounts and releases the attempt and the call's context.
func (s *retryStream) finish(err error) {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return
	}
	s.done = true
	s.buf = nil
	a := s.last
	s.ready.Broadcast()
	s.mu.Unlock()
	if s.unwatch != nil {
		s.unwatch()
	}
	if a != nil {
		s.releaseAttempt(a, err)
		a.stop(true)
	}
	if err == nil {
		s.r.succeeded()
	} else {
		s.r.settle(false)
	}
	s.cancelCall()
}

// Header returns the current attempt's header metadata. Headers commit the
// attempt. If the attempt failed without headers, Header returns nil, nil,
// as grpc does; RecvMsg then retries or reports the error.
func (s *retryStream) Header() (metadata.MD, error) {
	s.mu.Lock()
	a := s.last
	s.mu.Unlock()
	md, err := a.cs.Header()
	if md != nil {
		s.commit()
	}
	return md, err
}

// Trailer returns the trailer of the latest attempt.
func (s *retryStream) Trailer() metadata.MD {
	s.mu.Lock()
	a := s.last
	s.mu.Unlock()
	return a.cs.Trailer()
}

// Context returns the context of the latest attempt.
func (s *retryStream) Context() context.Context {
	s.mu.Lock()
	a := s.last
	s.mu.Unlock()
	return a.cs.Context()
}

// CloseSend closes the sending side; new attempts are closed after their
// replay.
func (s *retryStream) CloseSend() error {
	s.mu.Lock()
	s.closeSent = true
	a, broken := s.cur, s.sendBroken
	s.mu.Unlock()
	if a == nil || broken {
		return nil
	}
	return a.cs.CloseSend()
}

// SendMsg sends m on the current attempt and keeps it for replay until the
// stream commits. A message that would outgrow the replay buffer commits the
// stream first.
func (s *retryStream) SendMsg(m any) error {
	s.mu.Lock()
	if !s.committed {
		size := messageSize(m)
		if size < 0 || s.bufBytes+size > s.limit {
			for s.cur == nil && !s.done {
				s.ready.Wait()
			}
			s.commitLocked()
		} else {
			s.buf = append(s.buf, m)
			s.bufBytes += size
		}
	}
	a, broken, committed, done := s.cur, s.sendBroken, s.committed, s.done
	s.mu.Unlock()
	switch {
	case done && a == nil:
		return io.EOF
	case a == nil || broken && !committed:
		return nil // kept; the retry in progress replays it
	}
	err := a.cs.SendMsg(m)
	if err == io.EOF {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.committed && s.cur == a {
			// The attempt ended; RecvMsg learns its status and retries
			// with m among the replayed messages.
			s.sendBroken = true
			return nil
		}
	}
	return err
}

// RecvMsg receives the next message. Before the stream commits, a failed
// attempt is retried under the method's policy and the receive goes on on
// the new attempt.
func (s *retryStream) RecvMsg(m any) error {
	for {
		s.mu.Lock()
		a, committed := s.cur, s.committed
		s.mu.Unlock()
		err := a.cs.RecvMsg(m)
		if committed {
			switch {
			case err == io.EOF:
				s.finish(nil)
			case err != nil:
				s.finish(err)
			}
			return err
		}
		if err == nil {
			s.commit()
			if !s.desc.ServerStreams {
				// A unary response ends the stream.
				s.finish(nil)
			}
			return nil
		}
		if err == io.EOF {
			s.commit()
			s.finish(nil)
			return err
		}
		if rerr := s.retry(a, err); rerr != nil {
			s.finish(rerr)
			return rerr
		}
	}
}

// messageSize returns the encoded size of a proto message, or -1 for a
// message the stream cannot measure (it then commits).
func messageSize(m any) int {
	if pm, ok := m.(proto.Message); ok {
		return proto.Size(pm)
	}
	return -1
}
