package interceptor

import (
	"errors"
	"io"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/emptypb"
)

// The transitions of a retryStream (see streamState), and the steps they
// share: replay, retire (release before a retry), probe (learn how an
// attempt ended).

// start opens the first attempt: idle → attempting, or committed when the
// call has nothing to retry.
func (s *retryStream) start() error {
	s.driving = true
	defer s.stopDriving()
	return s.open(nil, nil, false)
}

// stopDriving ends the driver's turn. When the stream ended meanwhile, the
// driver settles the retrier's accounts, which end left to it.
func (s *retryStream) stopDriving() {
	s.mu.Lock()
	s.driving = false
	done, final := s.state == stateDone, s.final
	s.mu.Unlock()
	if !done {
		return
	}
	s.r.dropSlot()
	if final == io.EOF {
		s.r.succeeded()
	} else {
		s.r.settle(false)
	}
	s.r.callEnded(s.cc)
}

// errStop wraps an error that ends the stream at once, without the retry
// decision: a rejection, or no time left.
type errStop struct{ err error }

func (e errStop) Error() string { return e.err.Error() }

// open is the driver's transition from idle to a live attempt. After the
// failure err of the previous attempt (nil before the first), with its
// trailer and whether its own timeout fired, it decides on a retry and
// waits out the backoff; then it admits, creates and replays the next
// attempt, over again while attempts fail before they are installed. It
// returns nil once an attempt is live, or the stream's final error.
func (s *retryStream) open(err error, trailer metadata.MD, timedOut bool) error {
	for {
		if err != nil {
			if ferr := s.afterFailure(err, trailer, timedOut); ferr != nil {
				return s.end(ferr)
			}
		}
		a, nerr := s.newAttempt()
		if nerr != nil {
			err, trailer, timedOut = nerr, nil, false
			continue
		}
		res, rerr := s.replay(a)
		if res != replayAttemptEnded {
			s.leave(a)
			return rerr
		}
		// a ended during its replay: how it ended decides, as for a failure.
		headers, ended, serr := s.statusOf(a)
		if ended {
			s.leave(a)
			return s.finalErr()
		}
		if headers || serr == nil || serr == io.EOF {
			// Committed by its headers, or it ended well: it answers.
			s.mu.Lock()
			done := s.state == stateDone
			if !done {
				s.installLocked(a, true)
			}
			s.mu.Unlock()
			s.leave(a)
			switch {
			case done:
				return s.finalErr()
			case serr == io.EOF:
				return s.end(nil)
			}
			return nil
		}
		err, trailer, timedOut = s.retire(a, serr)
		s.leave(a)
	}
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
		// One attempt with a timeout of its own (not single): its
		// uncommitted failure is counted as a unary call's is.
		if s.r.st.storm.throttle != nil {
			s.r.noRetryFailed(s.ctx, err, trailer, timedOut)
		}
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

// replayResult is how a replay went.
type replayResult uint8

const (
	replayInstalled    replayResult = iota // the attempt is live
	replayAttemptEnded                     // the attempt ended during the replay
	replayStreamEnded                      // the stream ended; err is its final error
)

// replay is the driver's step that sends buf to the new attempt a, in
// order, then installs a (installLocked) and closes its sending side if the
// caller has. Sends made meanwhile join buf, so a gets every message once,
// in order. A client-side error from SendMsg ends the stream here.
func (s *retryStream) replay(a *streamAttempt) (replayResult, error) {
	for i := 0; ; i++ {
		s.mu.Lock()
		if s.state == stateDone {
			final := s.final
			s.mu.Unlock()
			return replayStreamEnded, final
		}
		if i == len(s.buf) {
			s.installLocked(a, s.single || s.bufBytes > s.limit)
			closing := s.closeSent
			s.mu.Unlock()
			if closing {
				_ = a.cs.CloseSend()
			}
			return replayInstalled, nil
		}
		m := s.buf[i]
		s.mu.Unlock()
		if err := a.cs.SendMsg(m); err == io.EOF {
			return replayAttemptEnded, nil
		} else if err != nil {
			return replayStreamEnded, s.endHere(err)
		}
	}
}

// installLocked makes a the live attempt: idle → attempting, or committed
// when commit is set (nothing to retry, buf past its bound, headers).
func (s *retryStream) installLocked(a *streamAttempt, commit bool) {
	s.cur, s.state = a, stateAttempting
	if commit {
		s.commitLocked()
	}
	s.ready.Broadcast()
}

// commitLocked is the transition attempting → committed: cur is final, the
// replay buffer is dropped and the per-attempt timeout stops.
func (s *retryStream) commitLocked() {
	if s.state != stateAttempting {
		return
	}
	s.state = stateCommitted
	s.dropBuf()
	s.cur.stopTimer()
	s.ready.Broadcast()
}

// dropBuf empties the replay buffer for good (commit or end), letting go of
// the messages it kept.
func (s *retryStream) dropBuf() {
	clear(s.buf)
	s.buf, s.bufBytes = nil, 0
}

// commitAttempt commits a if it is the live attempt.
func (s *retryStream) commitAttempt(a *streamAttempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == a {
		s.commitLocked()
	}
}

// received acts on what a receive on attempt a returned; the caller holds
// a's receive claim, so a is cur unless the stream is done. A message
// commits a (and ends a stream whose server sends one response), io.EOF
// ends the stream well, an error ends it once committed and goes to fail
// before. done is false when the receive is to be made again, on the
// attempt that replaced a; else ret is what the caller returns.
func (s *retryStream) received(a *streamAttempt, err error) (done bool, ret error) {
	s.mu.Lock()
	st := s.state
	if st == stateDone {
		final := s.final
		s.mu.Unlock()
		if err == nil {
			return true, nil // delivered; the next call gets final
		}
		return true, final
	}
	if err == nil || err == io.EOF {
		s.commitLocked()
	}
	s.mu.Unlock()
	switch {
	case err == nil:
		if !s.desc.ServerStreams {
			s.end(nil) // the one response ends the stream
		}
		return true, nil
	case err == io.EOF:
		return true, s.end(nil)
	case st == stateCommitted:
		if s.single {
			s.chargeSingle(a, err)
		}
		return true, s.end(err)
	}
	return s.fail(a, err)
}

// chargeSingle does the A6 throttle accounting of a stream that never
// retries (committed from its start), which failed with err on a: when no
// headers arrived and its messages did not outgrow the replay buffer (either
// commits it in grpc-go), as for a unary call (retrier.noRetryFailed), a
// pushback that says not to retry counts as a failure, as in grpc-go.
// Nothing is read when A6 throttling is off.
func (s *retryStream) chargeSingle(a *streamAttempt, err error) {
	if !s.measured {
		return
	}
	s.mu.Lock()
	outgrown := s.sent > s.limit
	s.mu.Unlock()
	if outgrown {
		return
	}
	if md, herr := a.cs.Header(); herr == nil && md == nil {
		s.r.noRetryFailed(s.ctx, err, a.cs.Trailer(), false)
	}
}

// fail is the transition attempting → idle → attempting: a failed with err
// before the commit. Headers that arrived before the failure commit it
// (gRFC A6), and err ends the stream. Otherwise the caller becomes the
// driver: a is retired and open decides on the retry and opens the next
// attempt. done is false when a new attempt is live.
func (s *retryStream) fail(a *streamAttempt, err error) (done bool, ret error) {
	// a is over, so Header does not block.
	md, herr := a.cs.Header()
	switch {
	case herr != nil: // a non-nil error from Header ends the stream
		return true, s.endHere(herr)
	case md != nil:
		s.commitAttempt(a)
		return true, s.end(s.r.stopped(err, err, StopCommitted))
	}
	s.mu.Lock()
	switch s.state {
	case stateDone:
		final := s.final
		s.mu.Unlock()
		return true, final
	case stateCommitted:
		s.mu.Unlock()
		return true, s.end(err)
	}
	s.state, s.cur, s.driving = stateIdle, nil, true
	s.ready.Broadcast()
	s.mu.Unlock()
	defer s.stopDriving()
	if ferr := s.open(s.retire(a, err)); ferr != nil {
		return true, ferr
	}
	return false, nil
}

// retire is the release step before a retry: it releases the failed
// attempt a and returns what the retry decision needs: the failure (the
// per-attempt timeout's own error when that fired), a's trailer and whether
// its timeout fired.
func (s *retryStream) retire(a *streamAttempt, err error) (error, metadata.MD, bool) {
	timedOut := a.timedOut.Load()
	if timedOut {
		err = s.attemptTimeoutError()
	}
	s.releaseAttempt(a, err)
	a.stop()
	return err, a.cs.Trailer(), timedOut
}

// probe is the step after a call saw the live attempt a end before the
// commit (SendMsg's io.EOF, Header's missing headers). When another call is
// receiving on a, it acts on the end and probe waits for it; otherwise probe
// takes a's receive claim, learns how a ended and acts as RecvMsg would:
// headers commit a, success ends the stream, an error is retried or ends
// it. It returns once a is no longer the live uncommitted attempt.
func (s *retryStream) probe(a *streamAttempt) {
	s.mu.Lock()
	for s.state == stateAttempting && s.cur == a && a.reading {
		s.ready.Wait()
	}
	if s.state != stateAttempting || s.cur != a {
		s.mu.Unlock()
		return
	}
	a.reading = true
	s.mu.Unlock()
	defer s.dropClaim(a)
	headers, ended, err := s.statusOf(a)
	switch {
	case ended:
		return
	case headers:
		s.commitAttempt(a)
		return
	}
	s.received(a, err)
}

// statusOf learns how attempt a ended, once a call on it has shown that it
// has: whether its headers arrived, or else its status (io.EOF for OK),
// which a receive returns at once. Without headers no message can have
// come, so the receive consumes nothing the caller would have read. A Header
// that fails says nothing of the headers: the stream ends with its error,
// as grpc documents for Header, and ended is true.
func (s *retryStream) statusOf(a *streamAttempt) (headers, ended bool, err error) {
	md, herr := a.cs.Header()
	switch {
	case herr != nil:
		s.endHere(herr)
		return false, true, nil
	case md != nil:
		return true, false, nil
	}
	var none emptypb.Empty
	return false, false, a.cs.RecvMsg(&none)
}

// end is the transition to done, with err (nil: success). It returns the
// final error every later call gets: io.EOF after success. Of concurrent
// ends, the first wins.
func (s *retryStream) end(err error) error { return s.finish(err, err) }

// endHere ends the stream with err for an end on this side, a panic below
// or a client-side error: the breaker is told errEndedHere, which is no
// verdict on the method's health.
func (s *retryStream) endHere(err error) error { return s.finish(err, errEndedHere) }

// finish does end's work: it records err as final, releases the latest
// attempt telling the breaker outcome, settles the retrier's accounts (or
// leaves them to a driver at work) and cancels the call's context. A retry
// decided on and never sent gives back its slot of the pace and its budget
// token there: a stream a panic ends (a hook's, OnRetry or the breaker's
// OnStateChange while the retry was admitted) ends here with them held.
func (s *retryStream) finish(err, outcome error) error {
	s.mu.Lock()
	if s.state == stateDone {
		final := s.final
		s.mu.Unlock()
		return final
	}
	s.state, s.cur = stateDone, nil
	s.final = err
	if err == nil {
		s.final = io.EOF
	}
	s.dropBuf()
	a, driving, final := s.last, s.driving, s.final
	s.ready.Broadcast()
	s.mu.Unlock()
	// Deferred: the release runs the user's code (the breaker's
	// state-change hook on its verdict, the meter provider), and a stream
	// whose release aborts is settled all the same, a success as a
	// success; the panic goes on.
	defer s.settleEnd(a, driving, err)
	if a != nil {
		s.releaseAttempt(a, outcome)
	}
	return final
}

// settleEnd is the rest of finish once the latest attempt a (nil: none)
// is released: it stops a, settles the retrier's accounts of a stream
// that ended with err unless a driver at work will (driving), and cancels
// the call's context.
func (s *retryStream) settleEnd(a *streamAttempt, driving bool, err error) {
	if a != nil {
		a.stop()
	}
	if !driving {
		s.r.dropSlot()
		if err == nil {
			s.r.succeeded()
		} else {
			s.r.settle(false)
		}
		s.r.callEnded(s.cc)
	}
	s.cancelCall()
}
