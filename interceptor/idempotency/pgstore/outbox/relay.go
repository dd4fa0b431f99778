package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// RelayConfig is the configuration of a [Relay]. Zero fields take the
// defaults.
type RelayConfig struct {
	// Batch is how many messages a pass takes and delivers at once
	// (default 16).
	Batch int
	// Lease is how long the messages a pass took are the relay's: another
	// relay (another replica, or this one after a crash) takes them again
	// once it has passed, so it must exceed a delivery's Timeout (default
	// 30 s).
	Lease time.Duration
	// Timeout bounds one delivery, its attempts and backoffs included
	// (default 10 s).
	Timeout time.Duration
	// PollInterval is the wait of Run after a pass that found the outbox
	// drained, before the next (default 500 ms). A pass that took a full
	// batch is followed at once by the next.
	PollInterval time.Duration
	// InitialBackoff and MaxBackoff space the passes that deliver a message
	// again after a delivery failed for a reason worth retrying: the n-th
	// failure waits InitialBackoff·2^(n-1), at most MaxBackoff (defaults
	// 1 s and 5 minutes). Such a message is retried until it is delivered.
	InitialBackoff, MaxBackoff time.Duration
	// RetryableCodes are the delivery failures worth retrying (default:
	// UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED,
	// CANCELLED, INTERNAL and UNKNOWN). A failure with another code that an
	// attempt returned is the receiver's answer for good: the message is
	// marked dead (dead_at and last_error set; it stays in the table, for
	// an operator) and OnDead is called. An error the relay's client gave
	// itself never marks a message dead, nor does an attempt's
	// DEADLINE_EXCEEDED or CANCELLED raised when its own context ended
	// (Timeout, the client's per-attempt timeout, Run stopping): no answer
	// came (see Relay.Once).
	RetryableCodes rescodes.Set
	// OnDead, when set, is called synchronously with a message marked dead
	// and the receiver's error.
	OnDead func(m Message, err error)
	// Logger gets the relay's warnings (default slog.Default()).
	Logger *slog.Logger
}

// DefaultRetryableCodes are RelayConfig.RetryableCodes's default.
var DefaultRetryableCodes = rescodes.Of(codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted,
	codes.Canceled, codes.Internal, codes.Unknown)

// Validate reports a field out of range, naming it.
func (c *RelayConfig) Validate() error {
	switch {
	case c.Batch < 0:
		return fmt.Errorf("outbox: RelayConfig.Batch %d: must not be negative", c.Batch)
	case c.Lease < 0 || c.Timeout < 0 || c.PollInterval < 0 || c.InitialBackoff < 0 || c.MaxBackoff < 0:
		return errors.New("outbox: RelayConfig: durations must not be negative")
	case c.Lease > 0 && c.Timeout > 0 && c.Lease <= c.Timeout:
		return fmt.Errorf("outbox: RelayConfig.Lease %v: must exceed Timeout %v, or another relay takes a message "+
			"while it is being delivered", c.Lease, c.Timeout)
	case c.InitialBackoff > 0 && c.MaxBackoff > 0 && c.MaxBackoff < c.InitialBackoff:
		return fmt.Errorf("outbox: RelayConfig.MaxBackoff %v: below InitialBackoff %v", c.MaxBackoff, c.InitialBackoff)
	}
	return nil
}

// Relay delivers the messages of an outbox to a gRPC service, at least
// once: a message leaves the outbox only once the receiver has answered
// it. Every delivery of a message carries the message's ID as its
// idempotency key (interceptor.ContextWithIdempotencyKey), and passes
// through a client of this module (interceptor.Client: retries with
// backoff, a circuit breaker), so that a receiver with server-side
// idempotency (package server, with pgstore's joined mode for exactly-once
// writes) runs each message once, however often the relay delivers it.
//
// Messages survive crashes on both sides: the relay's (a message taken and
// not yet answered is taken again once its Lease has passed) and the
// receiver's (the delivery fails, and is retried). Relays on many replicas
// share an outbox: each pass takes messages no other relay holds (FOR
// UPDATE SKIP LOCKED), oldest first. Order is not kept across retries.
type Relay struct {
	ob     *Outbox
	pool   *pgxpool.Pool
	conn   *grpc.ClientConn
	unary  grpc.UnaryClientInterceptor
	owned  *interceptor.Client // the default client, closed by Close; nil when the caller gave one
	cfg    RelayConfig
	closed sync.Once
	// fallbackSeen logs, once, that the client answered a delivery itself,
	// nothing sent, other than for want of time: its fallback (see send).
	fallbackSeen sync.Once

	mu sync.Mutex
	// held maps a method whose delivery the client refused (see Once) to
	// when the client may admit a call of it again: passes take none of its
	// messages until then. An entry is dropped by the first pass after it;
	// the keys are methods of the outbox's rows. Guarded by mu.
	held map[string]time.Time
}

// NewRelay returns a Relay of ob's messages, read through pool and
// delivered on conn. Dial conn without this module's client interceptor:
// the relay calls through client's (retries, breaker, idempotency key),
// or, when client is nil, through its own, whose policy retries each
// delivery up to 4 attempts (100 ms backoff, doubling to 1 s) and opens a
// breaker after 5 failures in a row for 5 s; Close closes it. A client's
// fallback (interceptor.WithFallback) gains the relay nothing: a delivery
// counts as the receiver's answer only when an attempt returned it, so one
// the fallback answered, with a reply or an error, keeps its message, given
// back as for a refusal or retried (see Once), and the relay logs it once.
// It does not start: call Run (in a goroutine of its own) or Once.
func NewRelay(ob *Outbox, pool *pgxpool.Pool, conn *grpc.ClientConn, client *interceptor.Client, cfg RelayConfig) (*Relay, error) {
	switch {
	case ob == nil:
		return nil, errors.New("outbox: NewRelay: outbox must not be nil")
	case pool == nil:
		return nil, errors.New("outbox: NewRelay: pool must not be nil")
	case conn == nil:
		return nil, errors.New("outbox: NewRelay: conn must not be nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Batch = cmp.Or(cfg.Batch, 16)
	cfg.Timeout = cmp.Or(cfg.Timeout, 10*time.Second)
	cfg.Lease = cmp.Or(cfg.Lease, max(30*time.Second, 2*cfg.Timeout))
	if cfg.Lease <= cfg.Timeout {
		return nil, fmt.Errorf("outbox: RelayConfig.Lease %v: must exceed Timeout %v", cfg.Lease, cfg.Timeout)
	}
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 500*time.Millisecond)
	cfg.InitialBackoff = cmp.Or(cfg.InitialBackoff, time.Second)
	cfg.MaxBackoff = cmp.Or(cfg.MaxBackoff, max(5*time.Minute, cfg.InitialBackoff))
	if cfg.RetryableCodes == 0 {
		cfg.RetryableCodes = DefaultRetryableCodes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Relay{ob: ob, pool: pool, conn: conn, cfg: cfg}
	if client == nil {
		c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{}},
			RetryPolicy:    &serviceconfig.RetryPolicy{MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: 5 * time.Second},
		}))
		if err != nil {
			return nil, fmt.Errorf("outbox: NewRelay: the default client: %w", err)
		}
		client, r.owned = c, c
	}
	r.unary = client.UnaryClientInterceptor()
	return r, nil
}

// Close closes the relay's own client, if NewRelay made one. Stop Run
// first (its context).
func (r *Relay) Close() error {
	var err error
	r.closed.Do(func() {
		if r.owned != nil {
			err = r.owned.Close()
		}
	})
	return err
}

// Run runs passes until ctx ends, and returns ctx's error: a pass right
// after a pass that took a full batch, else after PollInterval. A pass that
// fails (PostgreSQL unreachable) is logged and tried again after
// PollInterval. While the client refuses a method's calls (see Once), the
// passes skip its messages, so a receiver that is down costs a relay one
// statement per PollInterval, as an empty outbox does, and not a take and
// a give-back of every message, batch after batch.
func (r *Relay) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		took, _, err := r.pass(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.cfg.Logger.Warn("outbox: a relay pass failed; trying again", "error", err)
			t.Reset(r.cfg.PollInterval)
		case took == r.cfg.Batch:
			t.Reset(0)
		default:
			t.Reset(r.cfg.PollInterval)
		}
	}
}

// Once runs one pass: it takes up to Batch due messages and delivers them,
// concurrently, and returns how many the receiver answered (delivered or
// refused for good), and the first error of the outbox's statements.
//
// A delivery that the client refused without sending it (the method's
// breaker open or half-open with its probes out, its bulkhead full: an
// interceptor.RejectedError, also after attempts that failed) is not the
// receiver's answer: its message is given back, its attempt not counted,
// due again when the breaker lets a probe through (the refusal's
// RetryAfter; at once when the refusal does not say). Its method is then
// held: this relay's passes take none of its messages until that time
// (InitialBackoff when the refusal does not say: a bulkhead's, a breaker
// forced open or throttling adaptively), unless a delivery of it that
// ended later in the same pass was admitted (the half-open probe that
// closed the breaker). Messages of other methods go on meanwhile. A
// delivery the client answered itself, no attempt of it having been sent
// (its fallback's reply or error for a refusal, or an error of its own,
// such as DEADLINE_EXCEEDED when Timeout ended while it waited in the
// bulkhead's queue), is such a refusal too, held InitialBackoff; the first
// of them, unless its time ran out, is logged, once (a fallback gains the
// relay nothing: see NewRelay). An error that the client
// returned after attempts, and that none of them returned (a fallback's
// answer to a refusal after failed attempts, or the client's own, such as
// no time left for another attempt), or that an attempt returned when the
// deadline it was given passed (Timeout, a per-attempt timeout: the
// receiver did not answer in time), is retried after the backoff, its
// attempt counted: only the receiver's answer marks a message dead.
func (r *Relay) Once(ctx context.Context) (int, error) {
	_, answered, err := r.pass(ctx)
	return answered, err
}

// pass is a pass: it returns how many messages it took, and how many of
// them the receiver answered.
func (r *Relay) pass(ctx context.Context) (took, answered int, err error) {
	rows, err := r.pool.Query(ctx, r.ob.sql.take, int32(r.cfg.Batch), r.cfg.Lease.Milliseconds(), r.heldMethods(time.Now()))
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: taking messages: %w", err)
	}
	var msgs []Message
	for rows.Next() {
		var m Message
		var attempts int32
		if err := rows.Scan(&m.seq, &m.ID, &m.FullMethod, &m.Payload, &attempts, &m.CreatedAt); err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("outbox: taking messages: %w", err)
		}
		m.Attempts = int(attempts)
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return 0, 0, fmt.Errorf("outbox: taking messages: %w", err)
	}
	outs := make([]outcome, len(msgs))
	var wg sync.WaitGroup
	for i := range msgs {
		wg.Go(func() { outs[i] = r.deliver(ctx, &msgs[i]) })
	}
	wg.Wait()
	for _, o := range outs {
		if o.answered {
			answered++
		}
		if o.err != nil && err == nil {
			err = o.err
		}
	}
	r.hold(msgs, outs)
	return len(msgs), answered, err
}

// outcome is how a delivery ended.
type outcome struct {
	answered bool      // the receiver answered: delivered, or refused for good
	refused  bool      // the client refused it, unsent (see Once)
	until    time.Time // when refused: when the client may admit a call of its method again
	end      time.Time // when it ended, read after the client returned
	err      error     // a failed statement of the outbox's
}

// heldMethods returns the methods held at now (never nil: the take's
// parameter is an array), and forgets those whose hold has passed.
func (r *Relay) heldMethods(now time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := make([]string, 0, len(r.held))
	for m, until := range r.held {
		if !now.Before(until) {
			delete(r.held, m)
			continue
		}
		held = append(held, m)
	}
	return held
}

// hold holds the methods of a pass whose last delivery to end was refused
// by the client (see Once), until the latest time the refusals gave.
func (r *Relay) hold(msgs []Message, outs []outcome) {
	type last struct{ admitted, refused, until time.Time }
	var seen map[string]*last // made on the first refusal: most passes have none
	for i, o := range outs {
		if !o.refused {
			continue
		}
		if seen == nil {
			seen = make(map[string]*last)
		}
		l := seen[msgs[i].FullMethod]
		if l == nil {
			l = &last{}
			seen[msgs[i].FullMethod] = l
		}
		if o.end.After(l.refused) {
			l.refused = o.end
		}
		if o.until.After(l.until) {
			l.until = o.until
		}
	}
	if seen == nil {
		return
	}
	for i, o := range outs {
		if l := seen[msgs[i].FullMethod]; l != nil && !o.refused && o.end.After(l.admitted) {
			l.admitted = o.end
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for m, l := range seen {
		if l.admitted.After(l.refused) {
			continue // a later delivery was admitted: the breaker let it through
		}
		if r.held == nil {
			r.held = make(map[string]time.Time)
		}
		if l.until.After(r.held[m]) {
			r.held[m] = l.until
		}
	}
}

// deliver delivers m and settles its row: deleted once the receiver
// answered, dead for an answer that is not worth retrying, else due again
// after its backoff, or, the client having refused it unsent, when the
// refusal says, without counting the attempt (see Once).
func (r *Relay) deliver(ctx context.Context, m *Message) (o outcome) {
	derr := r.send(ctx, m)
	o.end = time.Now()
	// The row's update must happen even when ctx ended (Run stopping): on a
	// context of its own, bounded.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	code := status.Code(derr)
	rej, rejected := errors.AsType[*interceptor.RejectedError](derr)
	local, byClient := errors.AsType[*clientAnswer](derr)
	// The client answered itself, nothing sent: its fallback, or an error
	// of its own.
	fallback := errors.Is(derr, errFallbackAnswered) || byClient && !local.attempted
	var err error
	switch {
	case derr == nil:
		_, err = r.pool.Exec(sctx, r.ob.sql.ack, m.seq)
		o.answered, o.err = true, wrap("acknowledging", err)
	case rejected || fallback:
		// Not the message's fault: give it back, due when the breaker lets
		// a probe through, and hold its method until then (at least
		// InitialBackoff when the refusal does not say when, as a
		// fallback's answer never does).
		var retryAfter time.Duration
		switch {
		case rejected:
			retryAfter = rej.RetryAfter
		case !byClient:
			r.fallbackSeen.Do(func() {
				r.cfg.Logger.Warn("outbox: the relay's client answered a delivery with its fallback (interceptor.WithFallback), "+
					"nothing sent; the message stays in the outbox until the receiver answers it: give the relay a client "+
					"without a fallback", "method", m.FullMethod)
			})
		case !local.outOfTime:
			// An error with time left: its fallback's, or one of its own.
			// One whose time ran out unsent (in a bulkhead's queue, at a
			// rate limit) is a refusal, which is not logged.
			r.fallbackSeen.Do(func() {
				r.cfg.Logger.Warn("outbox: the relay's client failed a delivery itself, nothing sent: its fallback's error "+
					"(interceptor.WithFallback: give the relay a client without a fallback) or one of its own; the message "+
					"stays in the outbox until the receiver answers it", "method", m.FullMethod, "answer", local.err)
			})
		}
		o.refused = true
		o.until = o.end.Add(cmp.Or(retryAfter, r.cfg.InitialBackoff))
		_, err = r.pool.Exec(sctx, r.ob.sql.release, m.seq, int32(m.Attempts), retryAfter.Milliseconds())
		o.err = wrap("giving back", err)
	case ctx.Err() != nil:
		// Run stopping: give it back, for a later pass.
		_, err = r.pool.Exec(sctx, r.ob.sql.release, m.seq, int32(m.Attempts), r.cfg.InitialBackoff.Milliseconds())
		o.err = wrap("giving back", err)
	case !byClient && !r.cfg.RetryableCodes.Has(code):
		_, err = r.pool.Exec(sctx, r.ob.sql.dead, m.seq, int32(m.Attempts), derr.Error())
		r.cfg.Logger.Error("outbox: the receiver refused a message for good; it stays in the outbox, marked dead",
			"id", m.ID, "method", m.FullMethod, "error", derr)
		if r.cfg.OnDead != nil {
			r.cfg.OnDead(*m, derr)
		}
		o.answered, o.err = true, wrap("marking dead", err)
	default:
		_, err = r.pool.Exec(sctx, r.ob.sql.retry, m.seq, int32(m.Attempts), r.backoff(m.Attempts).Milliseconds(), derr.Error())
		o.err = wrap("scheduling a retry", err)
	}
	return o
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("outbox: %s a message: %w", what, err)
}

// backoff is the wait after the attempts-th failed delivery.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.InitialBackoff
	for i := 1; i < attempts && d < r.cfg.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.cfg.MaxBackoff)
}

// send makes one delivery of m: the request decoded as its method's input
// type, through the client's interceptor, with m's ID as the idempotency
// key, bounded by Timeout.
func (r *Relay) send(ctx context.Context, m *Message) error {
	md, err := lookupMethod(m.FullMethod)
	if err != nil {
		return status.Error(codes.Unimplemented, err.Error()) // this binary cannot deliver it: not retried here
	}
	req, err := newMessage(md.Input())
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := proto.Unmarshal(m.Payload, req); err != nil {
		return status.Errorf(codes.InvalidArgument, "outbox: the payload of %s is not a %s: %v", m.ID, md.Input().FullName(), err)
	}
	reply, err := newMessage(md.Output())
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	ctx, cancel := context.WithTimeout(interceptor.ContextWithIdempotencyKey(ctx, m.ID), r.cfg.Timeout)
	defer cancel()
	// The receiver answered only if an attempt the client invoked (grpc's
	// own invoker, under the client's interceptor) returned its reply: the
	// client's fallback (interceptor.WithFallback) answers a call its
	// guards refused with a nil error too, having sent nothing. Attempts
	// may run concurrently (hedging), and a copy may still run after the
	// call returned.
	// An error is the receiver's only if an invoked attempt returned it;
	// else the client gave it itself (its fallback's error for a refusal,
	// or one of its own, such as no time left for an attempt). Nor is an
	// attempt's error raised on this side when the deadline it was given
	// passed, or its context was cancelled (ended): the relay's Timeout's,
	// the client's per-attempt timeout's, Run stopping.
	var (
		invoked, reached atomic.Bool
		mu               sync.Mutex
		answers          []error // the invoked attempts' errors, but those of their contexts
	)
	err = r.unary(ctx, m.FullMethod, req, reply, r.conn,
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			invoked.Store(true)
			err := cc.Invoke(ctx, method, req, reply, opts...)
			switch {
			case err == nil:
				reached.Store(true)
			case !ended(ctx, err):
				mu.Lock()
				answers = append(answers, err)
				mu.Unlock()
			}
			return err
		})
	mu.Lock()
	defer mu.Unlock()
	switch {
	case err == nil && !reached.Load():
		return errFallbackAnswered
	case err == nil || errors.As(err, new(*interceptor.RejectedError)):
		return err
	case slices.ContainsFunc(answers, func(a error) bool { return isAnswer(err, a) }):
		return err // the receiver's answer (or grpc's, for an attempt that could not be sent)
	}
	return &clientAnswer{err: err, attempted: invoked.Load(), outOfTime: ended(ctx, nil)}
}

// ended reports whether ctx has ended, its deadline passed (on the clock:
// grpc may fail an attempt a moment before the context's timer has run)
// or it was cancelled, and err, when not nil, is the error of that end
// (DEADLINE_EXCEEDED or CANCELLED), raised on this side.
func ended(ctx context.Context, err error) bool {
	if err != nil {
		if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.Canceled {
			return false
		}
	}
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// isAnswer reports whether err is, or wraps, a: an attempt's error that the
// client returned, as it was or in its RetryError. It never compares with
// ==, which panics on two errors of a type that cannot be compared (a
// slice of field errors, from an interceptor of the conn): errors.Is, which
// compares only what can be, and, for an a of a type that cannot (errors.Is
// passes over it), a link of err's chain of a's type deeply equal to it.
func isAnswer(err, a error) bool {
	if errors.Is(err, a) {
		return true
	}
	t := reflect.TypeOf(a)
	if t.Comparable() {
		return false
	}
	return anyLink(err, func(l error) bool { return reflect.TypeOf(l) == t && reflect.DeepEqual(l, a) })
}

// anyLink reports whether f holds for err or an error it wraps, in the
// order errors.Is walks them.
func anyLink(err error, f func(error) bool) bool {
	for err != nil {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			return slices.ContainsFunc(u.Unwrap(), func(e error) bool { return anyLink(e, f) })
		default:
			return false
		}
	}
	return false
}

// errFallbackAnswered is send's error when the client returned nil with no
// attempt answered by the receiver: its fallback answered a refusal.
var errFallbackAnswered = errors.New("outbox: the client's fallback answered the delivery; the receiver got nothing")

// clientAnswer is send's error when the client failed a delivery with an
// error that no attempt it invoked returned: its fallback's error for a
// refusal, or one of its own. It is never the receiver's refusal for good.
type clientAnswer struct {
	err       error
	attempted bool // an attempt was invoked before it
	// outOfTime: the delivery's context had ended when the client returned
	// (its Timeout, or Run stopping): the client gave up for want of time,
	// as when a delivery waits in its bulkhead's queue until then.
	outOfTime bool
}

func (e *clientAnswer) Error() string {
	return "outbox: the relay's client failed the delivery itself: " + e.err.Error()
}

func (e *clientAnswer) Unwrap() error { return e.err }

// newMessage returns a new message of d's type: the generated type when it
// is linked in, else a dynamic one.
func newMessage(d protoreflect.MessageDescriptor) (proto.Message, error) {
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName()); err == nil {
		return mt.New().Interface(), nil
	}
	return dynamicpb.NewMessage(d), nil
}
