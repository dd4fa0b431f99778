package interceptor

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/internal/adaptive"
	"github.com/grpc-resilience/resilience/internal/breaker"
	"github.com/grpc-resilience/resilience/internal/bulkhead"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// guards are a method's breaker (or adaptive throttle) and bulkhead, held
// by its row (methods.go), and copied into every policy of the method, so
// shared by all its calls whatever config they started under: an update
// changes them in place (methodTable.configure).
type guards struct {
	breakerCfg  *serviceconfig.CircuitBreaker // as configured, to tell a changed block
	bulkheadCfg *serviceconfig.Bulkhead
	breaker     *breaker.Breaker   // nil: none
	adaptive    *adaptive.Throttle // the breaker in mode "adaptive"; nil: none
	bulkhead    *bulkhead.Bulkhead // nil: none
	rate        *rateGate          // the rateLimit block (ratelimit.go); nil: none
	failures    rescodes.Set       // codes that count against the breaker
	rejections  *rejections        // set with any guard
}

// any reports whether the method has a guard: a breaker of either mode, a
// bulkhead or a rate limit.
func (g *guards) any() bool {
	return g.breaker != nil || g.bulkhead != nil || g.adaptive != nil || g.rate != nil
}

// newBreaker builds the breaker of fullMethod from its block. The hook, when
// set, learns the method's state changes.
func newBreaker(fullMethod string, cb *serviceconfig.CircuitBreaker, hook func(string, BreakerState, BreakerState)) (*breaker.Breaker, error) {
	cfg := engineBreakerConfig(cb)
	if hook != nil {
		cfg.OnStateChange = func(from, to breaker.State) {
			hook(fullMethod, BreakerState(from), BreakerState(to))
		}
	}
	return breaker.New(cfg)
}

// failureCodes returns the codes that count against the breaker of block
// cb.
func failureCodes(cb *serviceconfig.CircuitBreaker) rescodes.Set {
	if len(cb.FailureStatusCodes) == 0 {
		return rescodes.DefaultBreakerFailures
	}
	return rescodes.Of(cb.FailureStatusCodes...)
}

// engineBreakerConfig is the engine's config of a circuitBreaker block, with no
// hook.
func engineBreakerConfig(cb *serviceconfig.CircuitBreaker) breaker.Config {
	cfg := breaker.Config{
		ConsecutiveFailures:   cb.ConsecutiveFailures,
		FailureRateThreshold:  cb.FailureRateThreshold,
		SlowCallDuration:      cb.SlowCallDuration,
		SlowCallRateThreshold: cb.SlowCallRateThreshold,
		MinimumCalls:          cb.MinimumCalls,
		Window:                cb.Window,
		OpenDuration:          cb.OpenDuration,
		MaxOpenDuration:       cb.MaxOpenDuration,
		HalfOpenProbes:        cb.HalfOpenProbes,
	}
	if cfg.ConsecutiveFailures == 0 && cfg.FailureRateThreshold == 0 {
		cfg.ConsecutiveFailures = breaker.DefaultConsecutiveFailures
		cfg.FailureRateThreshold = breaker.DefaultFailureRateThreshold
	}
	return cfg
}

// admission is what one attempt holds while it runs.
type admission struct {
	tok   breaker.Token
	slot  bool      // a bulkhead slot is held
	start time.Time // when the attempt left, for slow-call accounting
	// paced: the attempt waited at the rate limit's gate, and start is
	// when that wait ended.
	paced bool
	// pace names the slot of the method's pace the attempt took at the
	// gate (zero: none), given back if it is refused past the gate.
	pace ratelimit.Ticket
}

// admit asks the method's rate limit, breaker and bulkhead to let an
// attempt through, waiting for its token or slot at the rate limit's gate
// (held: the slot of the pace the call holds already, zero for none; see
// retrier.decide and rateGate.take)
// and in the bulkhead's queue when every slot is taken. A refusal is a
// *RejectedError, or the context's status when the caller gave up while
// waiting. The gate comes first, so that a wait there holds no probe and no
// slot; a refusal by the breaker or the bulkhead gives the gate's token
// back, and so does a panic past the gate (the breaker's state-change
// hook, the user's, runs in Allow and Record), which goes on.
func (g *guards) admit(ctx context.Context, now time.Time, held ratelimit.Ticket) (admission, error) {
	start := now
	var tk ratelimit.Ticket
	passed := true
	if g.rate != nil {
		var err error
		if now, tk, err = g.rate.take(ctx, now, held, g.rejections); err != nil {
			return admission{}, err
		}
		passed = false
		defer func() {
			if !passed {
				g.rate.giveBack(now, tk)
			}
		}()
	}
	a, queue, err := g.admitNow1(now)
	if err == nil && queue {
		err = g.queue(ctx, &a, now)
	}
	passed = err == nil
	a.paced, a.pace = now != start, tk
	return a, err
}

// admitNow is admit without the wait in the bulkhead's queue: when every
// slot is taken and the queue has room, it returns queue true with the
// breaker's token held and no slot, and the attempt must go through queue
// before it starts, on a goroutine whose wait holds up nothing else (a
// hedged call's copy: its wait must not keep the call from taking a
// sibling's answer).
func (g *guards) admitNow(now time.Time) (a admission, queue bool, err error) {
	var tk ratelimit.Ticket
	passed := true
	if g.rate != nil {
		if tk, err = g.rate.tryTake(now, g.rejections); err != nil {
			return a, false, err
		}
		passed = false
		defer func() {
			if !passed { // refused past the gate, or a panic there (see admit)
				g.rate.giveBack(now, tk)
			}
		}()
	}
	a, queue, err = g.admitNow1(now)
	passed = err == nil
	a.pace = tk
	return a, queue, err
}

// admitNow1 is admitNow past the rate limit's gate: the breaker and the
// bulkhead.
func (g *guards) admitNow1(now time.Time) (a admission, queue bool, err error) {
	if !g.any() {
		return a, false, nil
	}
	a.start = now
	if g.adaptive != nil && !g.adaptive.Allow(now) {
		return a, false, g.rejections.throttled
	}
	if g.breaker != nil {
		tok, retryAfter, err := g.breaker.Allow(a.start)
		if err != nil {
			if err == breaker.ErrHalfOpenFull {
				// A probe is out: yield the processor before failing fast,
				// so that callers retrying in a closed loop cannot starve
				// the probe whose answer would close the breaker (on 2
				// cores, 32 such callers delayed a probe's answer by up to
				// half a second).
				runtime.Gosched()
			}
			return a, false, g.rejections.circuitOpen(retryAfter)
		}
		a.tok = tok
	}
	if g.bulkhead != nil {
		if a.slot = g.bulkhead.TryAcquire(); !a.slot {
			if g.bulkhead.Full() {
				g.ignore(a)
				return a, false, g.rejections.full
			}
			return a, true, nil
		}
	}
	return a, false, nil
}

// queue waits in the bulkhead's queue for a slot for a, an admission
// admitNow left to queue; on a refusal it gives a's breaker token back,
// clearing it in a first: the record runs the user's code (the breaker's
// state-change hook reporting a change left unreported), and a caller that
// releases a after a panic there must find no token to record again.
func (g *guards) queue(ctx context.Context, a *admission, now time.Time) error {
	if err := g.bulkhead.Acquire(ctx); err != nil {
		tok := a.tok
		a.tok = breaker.Token{}
		g.ignore(admission{tok: tok, start: a.start})
		if errors.Is(err, bulkhead.ErrContextDone) {
			return status.FromContextError(ctx.Err()).Err()
		}
		return g.rejections.full
	}
	a.slot = true
	if g.breaker != nil {
		a.start = since(now) // time in the queue is not the method's latency
	}
	return nil
}

// unused releases a, an admission that holds its slot but whose attempt
// was never sent: the slot goes back, the breaker token is recorded as
// Ignored, and adaptive throttling counts nothing.
func (g *guards) unused(a admission) {
	if a.slot {
		g.bulkhead.Release()
	}
	g.ignore(a)
}

// ignore gives back the breaker token of a, an attempt refused before it
// started, recording no verdict.
func (g *guards) ignore(a admission) {
	if g.breaker != nil {
		g.breaker.Record(a.tok, a.start, breaker.Ignored, 0)
	}
}

// rejecting returns the rejection that admit would return at once for an
// attempt now, read without a lock and taking nothing (no probe, no slot):
// the breaker open, half-open with every probe out (halfOpenFull) or forced
// open, else the bulkhead full with its queue full. It returns nil when
// admit might let the attempt through or queue it. It reads the clock only
// when the breaker is neither closed nor forced closed, and returns the
// time it read, else the zero time.
//
// A bulkhead rejection behind a closed breaker is the same as admit's,
// which records nothing for it (an Ignored outcome in Closed is a no-op).
func (g *guards) rejecting() (rej *RejectedError, halfOpenFull bool, now time.Time) {
	if g.breaker != nil && !g.breaker.Admitting() {
		now = g.rejections.now()
		retryAfter, err := g.breaker.Rejects(now)
		if err == nil {
			return nil, false, now
		}
		return g.rejections.circuitOpen(retryAfter), err == breaker.ErrHalfOpenFull, now
	}
	if g.bulkhead != nil && g.bulkhead.Full() {
		return g.rejections.full, false, now
	}
	return nil, false, now
}

// release returns the attempt's slot and tells the breaker its outcome:
// success, a failure when its code is in the failure set, and nothing at all
// for the caller's own cancellation or deadline, for other codes and for
// message errors (isMessageError): client errors say nothing of the
// method's health. Streams pass timed=false: a
// stream's lifetime says nothing of slowness. It returns the time it read,
// or the zero time when it read none.
func (g *guards) release(ctx context.Context, a admission, err error, timed bool) time.Time {
	if a.slot {
		g.bulkhead.Release()
	}
	if g.adaptive != nil {
		now := since(a.start)
		if answered, accepted := backendAnswer(ctx, err); answered {
			g.adaptive.Done(now, accepted)
		}
		return now
	}
	if g.breaker == nil {
		return time.Time{}
	}
	now := since(a.start)
	outcome := breaker.Success
	if err != nil {
		outcome = breaker.Ignored
		if callerErr(ctx) == nil && g.failures.Has(rescodes.Classify(err)) && !isMessageError(err) {
			outcome = breaker.Failure
		}
	}
	var d time.Duration
	if timed {
		d = now.Sub(a.start)
	}
	g.breaker.Record(a.tok, now, outcome, d)
	return now
}

// backendAnswer says what an attempt that ended with err tells adaptive
// throttling of the backend: answered false when nothing (the caller's own
// cancellation or deadline, grpc's message errors, which are the client's,
// and any CANCELLED: the call was cut on this side, by its ClientConn's
// Close, a sibling's answer, a panic, with the caller's context live),
// else whether the backend accepted it: every outcome but
// RESOURCE_EXHAUSTED and UNAVAILABLE. Only answers move the rejection
// probability.
func backendAnswer(ctx context.Context, err error) (answered, accepted bool) {
	switch {
	case err == nil:
		return true, true
	case callerErr(ctx) != nil || isMessageError(err):
		return false, false
	}
	switch rescodes.Classify(err) {
	case codes.Canceled:
		return false, false
	case codes.ResourceExhausted, codes.Unavailable:
		return true, false
	}
	return true, true
}

// newAdaptive builds the throttle of a circuitBreaker block in mode
// "adaptive", its draws seeded from seed.
func newAdaptive(cb *serviceconfig.CircuitBreaker, seed uint64) (*adaptive.Throttle, error) {
	return adaptive.New(adaptive.Config{K: cb.K, Window: cb.Window, Seed: seed})
}

// abandon releases an attempt whose outcome is unknown (a panic below the
// interceptor, or a stream attempt that ended on the client: the caller's
// cancellation with no call at work on it, a closed connection): its slot
// is returned and its breaker token recorded as Ignored, which frees a
// half-open probe. Adaptive throttling counts nothing, as for the caller's
// cancellation (backendAnswer): the backend said nothing.
func (g *guards) abandon(a admission) {
	if a.slot {
		g.bulkhead.Release()
	}
	if g.adaptive != nil {
		return
	}
	if g.breaker != nil {
		g.breaker.Record(a.tok, since(a.start), breaker.Ignored, 0)
	}
}

// isRejection reports whether err, an error of admit, is a local
// rejection, which ends a call at once.
func isRejection(err error) (StopReason, bool) {
	re, ok := err.(*RejectedError)
	if !ok {
		return StopNone, false
	}
	return re.stopped.Reason, true
}

func newBulkhead(b *serviceconfig.Bulkhead) (*bulkhead.Bulkhead, error) {
	return bulkhead.New(bulkheadConfig(b), nil)
}

// bulkheadConfig is the engine's config of a bulkhead block.
func bulkheadConfig(b *serviceconfig.Bulkhead) bulkhead.Config {
	return bulkhead.Config{
		MaxConcurrent: b.MaxConcurrent,
		MaxQueue:      b.MaxQueue,
		MaxQueueWait:  b.MaxQueueWait,
	}
}

// validateGuards checks cfg's breaker and bulkhead blocks against the
// engines' own limits, so that building them later cannot fail.
func validateGuards(cfg *serviceconfig.Config) error {
	for i, mc := range cfg.MethodConfig {
		if cb := mc.CircuitBreaker; cb != nil && cb.Mode == serviceconfig.ModeAdaptive {
			if _, err := newAdaptive(cb, 0); err != nil {
				return fmt.Errorf("serviceconfig: methodConfig[%d].circuitBreaker: %w", i, err)
			}
		} else if mc.CircuitBreaker != nil {
			if _, err := newBreaker("", mc.CircuitBreaker, nil); err != nil {
				return fmt.Errorf("serviceconfig: methodConfig[%d].circuitBreaker: %w", i, err)
			}
		}
		if mc.Bulkhead != nil {
			if _, err := newBulkhead(mc.Bulkhead); err != nil {
				return fmt.Errorf("serviceconfig: methodConfig[%d].bulkhead: %w", i, err)
			}
		}
	}
	return nil
}

// messageErrors are the beginnings of the messages of grpc-go's own
// statuses for a message that could not be sent or received as it was: too
// large for a limit, or not (un)marshalled, compressed or decompressed. They
// say nothing of the server's health, and a retry would meet them again.
// grpc-go makes them on either side: a client's for its request or the
// reply it received, a server's for the request it received.
var messageErrors = [...]string{
	"grpc: received message larger than max",
	"grpc: received message after decompression larger than max",
	"grpc: message after decompression larger than max",
	"grpc: message too large",
	"trying to send message larger than max",
	"grpc: error while marshaling",
	"grpc: failed to unmarshal",
	"grpc: error while compressing",
	"grpc: failed to decompress",
	"grpc: failed to read decompressed data",
	"grpc: no decompressor available",
	"grpc: Compressor is not installed",
	"grpc: peer compressed the response",
}

// isMessageError reports whether err is a status of grpc-go's for a
// message it could not send or receive (messageErrors): RESOURCE_EXHAUSTED
// or INTERNAL with one of their messages.
func isMessageError(err error) bool {
	se, ok := err.(interface{ GRPCStatus() *status.Status })
	if !ok {
		return false
	}
	st := se.GRPCStatus()
	if c := st.Code(); c != codes.ResourceExhausted && c != codes.Internal {
		return false
	}
	msg := st.Message()
	for _, p := range messageErrors {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
