package interceptor

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// streamAttempt is one attempt of a stream: the grpc stream below the
// interceptor and the admission it holds.
type streamAttempt struct {
	cs       grpc.ClientStream  // set once created, before the attempt is shared
	adm      admission          // the breaker token and bulkhead slot it holds
	cancel   context.CancelFunc // ends the attempt's own context; noCancel when it has none
	timer    *time.Timer        // the per-attempt timeout until commit; nil if none
	timedOut atomic.Bool        // the timer fired while the call was live
	unwatch  func() bool        // stops the watch on cs's context; nil if none

	// Guarded by the stream's mu.
	released bool // adm was released: set once, by releaseAttempt
	reading  bool // a call holds the receive claim: it receives on cs and acts on how cs ends
	busy     int  // calls at work on cs that will act on how it ends (watched streams only)
	ctxDone  bool // cs's context has ended (watched streams only)
}

// stopTimer stops the per-attempt timeout, at the commit or the end.
func (a *streamAttempt) stopTimer() {
	if a.timer != nil {
		a.timer.Stop()
	}
}

// stop stops the timer and cancels the attempt's context, which ends its
// grpc stream if it is still running. The first attempt has no context of
// its own unless it has a per-attempt timeout (see streamContext).
func (a *streamAttempt) stop() {
	a.stopTimer()
	a.cancel()
}

// noCancel is the cancel of an attempt without a context of its own.
func noCancel() {}

var (
	// errEndedHere is the outcome of an attempt that ended on this side
	// rather than with a status from the server: a panic below the
	// interceptor, a client-side error from SendMsg or Header, a closed
	// connection. releaseAttempt abandons such an attempt (guards.abandon):
	// the breaker records no verdict, which frees a half-open probe.
	errEndedHere = status.Error(codes.Canceled, "resilience: stream attempt ended on the client")
	// errPanicked is the final error of a stream abandoned by a panic below
	// the interceptor.
	errPanicked = status.Error(codes.Canceled, "resilience: stream ended by a panic below the interceptor")
)

// attemptBase returns the context the attempt being created derives from:
// the call's with its trail of endpoints (package trail) when the stream
// may send more than one attempt or has a per-attempt timeout, else the
// call's; see unaryCall.attemptBase.
func (s *retryStream) attemptBase() context.Context {
	if s.single {
		return s.ctx
	}
	return &s.trail
}

// newAttempt is the driver's step that admits and creates attempt number
// s.r.attempts+1, once the deadline, the breaker and the bulkhead allow it.
// A refusal comes back as an errStop holding the call's final error. The new
// attempt is s.last, and the driver holds it busy until it is installed or
// retired.
func (s *retryStream) newAttempt() (*streamAttempt, error) {
	now := time.Now()
	if timeout, bounded := s.r.attemptTimeout(s.ctx, now); bounded && timeout <= 0 {
		return nil, errStop{s.r.outOfTime(s.r.lastErr)}
	}
	s.r.begin(now)
	adm, rerr := s.mp.g.admit(s.ctx, now, s.r.paceSlot)
	if rerr != nil {
		s.r.dropSlot() // never sent: the slot of the pace decide took for it goes back
		s.r.settle(false)
		if reason, ok := isRejection(rerr); ok {
			s.r.onRejected(s.ctx, reason)
			return nil, errStop{s.r.rejected(rerr.(*RejectedError), s.r.lastErr, reason)}
		}
		return nil, errStop{s.r.stopped(rerr, s.r.lastErr, stopOfContext(s.ctx.Err()))}
	}
	s.r.paceHeld, s.r.paceSlot = false, 0
	s.r.attempts++
	actx, cancel := attemptContext(s.attemptBase(), s.r.attempts), context.CancelFunc(noCancel)
	timed := s.r.rp.perAttempt > 0 && !s.single
	if timed || s.r.attempts > 1 {
		actx, cancel = context.WithCancel(actx)
	}
	a := &s.first
	if s.r.attempts > 1 {
		a = new(streamAttempt)
	}
	a.adm, a.cancel, a.busy = adm, cancel, 1
	if timed {
		a.timer = time.AfterFunc(s.r.rp.perAttempt, func() {
			if s.ctx.Err() == nil {
				a.timedOut.Store(true)
				if !s.r.attemptByCaller && s.halfClosed() {
					// Before the cancel: the endpoint policy reads the
					// mark when grpc reports the attempt CANCELLED. Only
					// once the caller has sent its whole request: before,
					// the endpoint may be waiting on the caller, whose
					// pace must not count against it.
					s.trail.Trail().MarkTimedOut()
				}
			}
			cancel()
		})
	}
	created := false
	defer func() {
		if !created { // the streamer panicked
			s.releaseAttempt(a, errEndedHere)
			a.stop()
		}
	}()
	cs, err := s.streamer(actx, s.desc, s.cc, s.method, s.opts...)
	created = true
	if err != nil {
		a.stop()
		if a.timedOut.Load() {
			err = s.attemptTimeoutError()
		}
		s.releaseAttempt(a, err)
		return nil, err
	}
	a.cs = cs
	if s.watch {
		a.unwatch = context.AfterFunc(cs.Context(), func() { s.attemptEnded(a) })
	}
	s.mu.Lock()
	if s.state == stateDone { // ended meanwhile: a panic, an error from SendMsg
		final := s.final
		s.mu.Unlock()
		s.releaseAttempt(a, errEndedHere)
		a.stop()
		return nil, errStop{final}
	}
	s.last = a
	s.mu.Unlock()
	return a, nil
}

func (s *retryStream) attemptTimeoutError() error {
	return status.Errorf(codes.DeadlineExceeded, "per-attempt timeout of %v exceeded", s.r.rp.perAttempt)
}

// releaseAttempt gives back a's breaker token and bulkhead slot, telling the
// breaker err, and records the attempt in the metrics, once per attempt. It
// is the one release of an attempt, and every way an attempt ends leads to
// it:
//   - the stream ends (end: RecvMsg's final error or io.EOF, a unary
//     response, a non-EOF error from SendMsg or Header, the retry policy
//     giving up, a panic below the interceptor);
//   - a retry replaces it (retire, after RecvMsg's error, Header finding no
//     headers, SendMsg's io.EOF, or a failed replay);
//   - its creation fails or panics (newAttempt);
//   - its grpc stream's context ends with no call at work on it: the
//     caller's context, the per-attempt timeout, grpc ending the stream on
//     its own, as on ClientConn.Close (attemptEnded, or the last call to
//     leave).
func (s *retryStream) releaseAttempt(a *streamAttempt, err error) {
	s.mu.Lock()
	done := a.released
	a.released = true
	s.mu.Unlock()
	if done {
		return
	}
	if a.unwatch != nil {
		a.unwatch()
	}
	if err == errEndedHere {
		s.mp.g.abandon(a.adm)
	} else {
		if q := s.mp.g.rate; q != nil {
			var trailer metadata.MD
			if a.cs != nil && status.Code(err) == codes.ResourceExhausted {
				trailer = a.cs.Trailer() // the stream has ended with err
			}
			q.answer(s.ctx, err, trailer, time.Now())
		}
		s.mp.g.release(s.ctx, a.adm, err, false)
	}
	s.c.metrics.attempt(s.ctx, s.r.mm, err)
}

// attemptEnded runs when a's grpc stream context ends: grpc has finished
// the stream (any end, ClientConn.Close included) or the attempt's context
// ended. A call at work on a acts on the end itself (see leave); with none,
// a is released here, as nobody may call again. It runs on a goroutine of
// its own (context.AfterFunc): a hook's panic in the release goes to the
// caller's next call on the stream (carryPanic).
func (s *retryStream) attemptEnded(a *streamAttempt) {
	s.mu.Lock()
	a.ctxDone = true
	free := a.busy == 0
	s.mu.Unlock()
	if free {
		defer s.carryPanic()
		s.releaseEnded(a)
	}
}

// releaseEnded releases a, whose grpc stream has ended with no call left to
// act on how.
func (s *retryStream) releaseEnded(a *streamAttempt) {
	err := errEndedHere
	if a.timedOut.Load() {
		err = s.attemptTimeoutError()
	}
	s.releaseAttempt(a, err)
	a.stop()
}

// enter marks a call at work on a, so that the end of a's context leaves
// the release to the call, which knows more of the outcome.
func (s *retryStream) enter(a *streamAttempt) {
	if !s.watch {
		return
	}
	s.mu.Lock()
	a.busy++
	s.mu.Unlock()
}

// leave ends the work that enter began. The last call to leave an attempt
// whose context has ended releases it, if nothing did.
func (s *retryStream) leave(a *streamAttempt) {
	if !s.watch {
		return
	}
	s.mu.Lock()
	a.busy--
	last := a.busy == 0 && a.ctxDone && !a.released
	s.mu.Unlock()
	if last {
		s.releaseEnded(a)
	}
}

// claim waits for a live attempt that no other call is receiving on, takes
// its receive claim and enters it. It returns nil when the stream is done.
func (s *retryStream) claim() *streamAttempt {
	s.mu.Lock()
	for s.state == stateIdle || s.state != stateDone && s.cur.reading {
		s.ready.Wait()
	}
	a := s.cur
	if a != nil {
		a.reading = true
		if s.watch {
			a.busy++
		}
	}
	s.mu.Unlock()
	return a
}

// dropClaim gives up the receive claim on a.
func (s *retryStream) dropClaim(a *streamAttempt) {
	s.mu.Lock()
	a.reading = false
	s.ready.Broadcast()
	s.mu.Unlock()
}

// live waits while a retry is under way, and returns the live attempt and
// the state; once the stream is done, the latest attempt.
func (s *retryStream) live() (*streamAttempt, streamState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.state == stateIdle {
		s.ready.Wait()
	}
	if s.state == stateDone {
		return s.last, stateDone
	}
	return s.cur, s.state
}

// finalErr returns the stream's final error, once done.
func (s *retryStream) finalErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final
}
