package interceptor

import (
	"context"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/internal/pushback"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// rateGate is a method's rateLimit block at work: its own limit on the
// attempts it sends (a GCRA bucket, when the block sets a rate) and its
// pace after a server's pushback. It belongs to the method's row
// (methods.go) and is shared by every call of the method.
//
// An attempt passes the gate before the breaker and the bulkhead, so that
// an attempt waiting for its token or slot holds no probe and no slot. It
// takes a slot of the pace (when a pushback is in force) and a token of
// the bucket, and waits for the later of the two, when that is within the
// block's maxWait and before the call's deadline; otherwise it takes
// nothing and fails at once with ErrRateLimited. An attempt that gives up
// while it waits (its caller's context ended) gives both back.
type rateGate struct {
	cfg    serviceconfig.ClientRateLimit // as configured, to tell a changed block
	bucket *ratelimit.Bucket             // nil: no rate of the client's own
	// pace is the row's, kept across updates: the server's pushback is no
	// property of the config.
	pace    *ratelimit.Pace
	maxWait time.Duration
	// capHint caps a server's wait (WithMaxServerPushback).
	capHint time.Duration
	// waiting counts the attempts waiting at the gate.
	waiting atomic.Int64
}

// newRateGate returns the gate of block b over pace. The block was
// validated with the config, so the bucket cannot fail to build.
func newRateGate(b *serviceconfig.ClientRateLimit, pace *ratelimit.Pace, capHint time.Duration, now time.Time) *rateGate {
	g := &rateGate{cfg: *b, pace: pace, maxWait: b.MaxWait, capHint: capHint}
	if b.Rate > 0 {
		g.bucket, _ = ratelimit.NewBucket(bucketConfig(b), now)
	}
	return g
}

// bucketConfig is the engine's config of a rateLimit block with a rate.
func bucketConfig(b *serviceconfig.ClientRateLimit) ratelimit.Config {
	return ratelimit.Config{Rate: b.Rate, Per: b.Per, Burst: b.Burst}
}

// limit returns how long an attempt at now may wait: the block's maxWait,
// and strictly less than the time left before the call's deadline, so
// that no wait starts that the deadline cannot cover (negative: no time).
func (q *rateGate) limit(ctx context.Context, now time.Time) time.Duration {
	limit := q.maxWait
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, dl.Sub(now)-1)
	}
	return limit
}

// take lets an attempt at now through the gate, waiting for its slot and
// token when it must. held names the slot of the pace the call holds
// already (a retry that took it when it decided to wait for the server's
// pushback: retrier.decide; zero: none): while it is a slot of the pacing
// in force the attempt takes no other, and when that pacing has ended and
// a new pushback begun, it takes one of the new pacing as any attempt
// does. It returns the time the attempt may go (now,
// unless it waited) and the Ticket of the slot of the pace it took (zero:
// none, held or nothing paced), or a refusal: rej's rate-limited
// rejection, or the context's status when the caller gave up while
// waiting.
func (q *rateGate) take(ctx context.Context, now time.Time, held ratelimit.Ticket, rej *rejections) (time.Time, ratelimit.Ticket, error) {
	limit := q.limit(ctx, now)
	var slotWait, tokenWait time.Duration
	var tk ratelimit.Ticket
	if !q.pace.Holds(held) {
		w, t, ok := q.pace.Take(now, limit)
		if !ok {
			return now, 0, rej.limited(w)
		}
		slotWait, tk = w, t
	}
	paced := tk != 0
	if q.bucket != nil {
		w, ok := q.bucket.Reserve(now, limit)
		if !ok {
			q.pace.Cancel(now, tk)
			return now, 0, rej.limited(w)
		}
		tokenWait = w
	}
	wait := max(slotWait, tokenWait)
	if wait <= 0 {
		return now, tk, nil
	}
	// ended tells a wait for a slot that the pacing ended (admitted
	// attempts brought the spacing under a millisecond): the slot no
	// longer matters, only the token does.
	var ended <-chan struct{}
	if paced && slotWait > tokenWait {
		ended = q.pace.Ended()
	}
	q.waiting.Add(1)
	defer q.waiting.Add(-1)
	t := time.NewTimer(wait)
	for {
		select {
		case <-t.C:
			return time.Now(), tk, nil
		case <-ended:
			ended, tk = nil, 0 // the pacing ended: its slot is nobody's to give back
			end := time.Now()
			rest := tokenWait - end.Sub(now)
			if rest <= 0 {
				t.Stop()
				return end, 0, nil
			}
			t.Reset(rest)
		case <-ctx.Done():
			t.Stop()
			end := time.Now()
			q.pace.Cancel(end, tk)
			if q.bucket != nil {
				q.bucket.Cancel(end)
			}
			return end, 0, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// tryTake is take for an attempt that may not wait (a hedged copy after
// the first: a copy that cannot go at once is not worth a wait).
func (q *rateGate) tryTake(now time.Time, rej *rejections) (ratelimit.Ticket, error) {
	w, tk, ok := q.pace.Take(now, 0)
	if !ok {
		return 0, rej.limited(w)
	}
	if q.bucket != nil {
		if w, ok := q.bucket.Reserve(now, 0); !ok {
			q.pace.Cancel(now, tk)
			return 0, rej.limited(w)
		}
	}
	return tk, nil
}

// giveBack returns, at now, the token and the slot of the pace (tk, from
// take or tryTake; zero: none) of an attempt that passed the gate but
// that the breaker or the bulkhead refused: it was never sent. A retry's
// own slot, which decide took, the retrier gives back (retrier.dropSlot);
// an attempt that passed while nothing was paced gives back no slot, even
// when a pushback began while it queued.
func (q *rateGate) giveBack(now time.Time, tk ratelimit.Ticket) {
	q.pace.Cancel(now, tk)
	if q.bucket != nil {
		q.bucket.Cancel(now)
	}
}

// idle reports whether the gate holds nothing that letting its row go
// would lose: no pushback in force and a full bucket.
func (q *rateGate) idle(now time.Time) bool {
	return !q.pace.Active() && (q.bucket == nil || q.bucket.Full(now))
}

// answer tells the pace how the server answered an attempt that ended at
// now with err and trailer: a RESOURCE_EXHAUSTED with a wait (a RetryInfo
// detail or the grpc-retry-pushback-ms trailer, capped by
// WithMaxServerPushback) paces the method by that wait; an answer that
// shows the server admitted the attempt (success, or a status of the
// handler's) ends the pacing. The caller's own cancellation or deadline,
// UNAVAILABLE and grpc's message errors say nothing of the server's limit.
func (q *rateGate) answer(ctx context.Context, err error, trailer metadata.MD, now time.Time) {
	if err == nil {
		q.pace.Success()
		return
	}
	if callerErrAt(ctx, now) != nil || isMessageError(err) {
		return
	}
	if _, local := err.(*RejectedError); local {
		return // a client below us refused it: the server said nothing
	}
	switch rescodes.Classify(err) {
	case codes.ResourceExhausted:
		if hint, ok, _ := pushback.Hint(err, trailer); ok {
			q.pace.Pushback(now, min(hint, q.capHint))
		}
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
	default:
		q.pace.Success()
	}
}

// retrySlot takes, at now, the slot of the pace for a retry that waits for
// a server's pushback of hint (capped), and returns the retry's wait: the
// hint, or longer when other attempts of the method took the slots before
// it. ok is false when no slot comes within the hint plus the block's
// maxWait, or before the deadline.
func (q *rateGate) retrySlot(ctx context.Context, now time.Time, hint time.Duration) (wait time.Duration, tk ratelimit.Ticket, ok bool) {
	limit := min(hint, q.capHint) + q.maxWait
	if dl, has := ctx.Deadline(); has {
		limit = min(limit, dl.Sub(now)-1)
	}
	return q.pace.Take(now, limit)
}
