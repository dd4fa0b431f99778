package interceptor

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/wire"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Client holds the client side of grpc-resilience: the per-method policies
// and state that its unary and stream interceptors share. Create it with
// NewClient; it is safe for concurrent use, and its interceptors may be
// installed on any number of connections. Close it when it is replaced
// (per tenant, per configuration reload) and its connections are closed.
type Client struct {
	opts     clientOptions
	log      *warnLog // the client's warnings, each logged once
	metrics  instruments
	state    atomic.Pointer[clientState]
	table    methodTable // the per-method state (methods.go)
	updateMu sync.Mutex  // serializes config updates

	closeOnce sync.Once
	closeErr  error // of the first Close; written once, inside closeOnce
}

// NewClient returns a Client configured by opts. It validates the
// configuration and reports the first problem; it never panics on bad
// configuration.
func NewClient(opts ...ClientOption) (*Client, error) {
	o := defaultClientOptions()
	for _, opt := range opts {
		if opt != nil {
			opt.apply(&o)
		}
	}
	if err := o.err(); err != nil {
		return nil, err
	}
	warnings, err := checkOptions(&o)
	if err != nil {
		return nil, err
	}
	c := &Client{opts: o, log: &warnLog{l: o.logger}, table: newMethodTable()}
	m, err := newInstruments(o.meterProvider, c)
	if err != nil {
		return nil, fmt.Errorf("interceptor: metrics: %w", err)
	}
	c.metrics = m
	cfg := o.config
	if err := c.update(&cfg, o.origins); err != nil {
		// A Client not returned holds nothing: the gauges' callback goes
		// with it, or the provider would read (and keep) it for ever.
		if g := m.gauges; g != nil {
			_ = g.Unregister()
		}
		return nil, err
	}
	c.log.warnAll(warnings)
	return c, nil
}

// Close releases what c holds beyond its calls: it unregisters the
// callback of its gauges (WithMeterProvider: breaker state, bulkhead
// occupancy, adaptive throttling, the retry budget), so that the meter
// provider no longer reads c nor keeps it reachable, and a Client built to
// replace c (for another tenant, after a configuration reload) is the only
// one reporting under their labels. c starts no goroutine and owns no
// connection (close those yourself), so there is nothing else to stop.
// Close it once the connections that use it are closed: calls that still
// come run as before (policies, breakers, bulkheads, the counters and
// histograms), with no gauges, and Statuses, UpdateServiceConfig and the
// breaker controls work as before. Close is safe to call more than once
// and concurrently; every call returns the first one's error.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		if g := c.metrics.gauges; g != nil {
			if err := g.Unregister(); err != nil {
				c.closeErr = fmt.Errorf("interceptor: Client.Close: unregistering the gauges: %w", err)
			}
		}
	})
	return c.closeErr
}

// UpdateServiceConfig replaces the client's service config with cfg, as a
// whole: the entries given to NewClient are dropped. Calls that started
// before it finish under the config they started with; calls after it see
// cfg. A config with errors is refused and the old one stays, as NewClient
// refuses one: an entry built in Go without a Name, a method its service
// does not have, a hedging policy on a streaming method (see the package
// documentation, Checked configuration). The warnings of a parsed cfg
// (serviceconfig.Config.Warnings) and names no linked-in code registers
// are logged, once (WithLogger). Under WrapResolver, cfg stays in force
// until the resolver delivers a config other than its last one.
//
// A config from serviceconfig.Parse runs its MaxAttempts as parsed (Parse
// applied its cap); in a config built in Go, a MaxAttempts above the
// client's cap (WithMaxAttemptsCap) is an error.
//
// A nil cfg is refused, as WithServiceConfig refuses it: it is most likely
// the result of a Parse whose error was dropped, and would remove every
// policy. Pass &serviceconfig.Config{} to remove them.
func (c *Client) UpdateServiceConfig(cfg *serviceconfig.Config) error {
	if cfg == nil {
		return errors.New("interceptor: UpdateServiceConfig: nil config (pass &serviceconfig.Config{} to remove every policy)")
	}
	warnings, err := c.updateFrom("UpdateServiceConfig", cfg, true)
	c.log.warnAll(warnings)
	return err
}

// updateFrom checks cfg, given by option, and makes it the client's
// config; it returns the warnings to log, its own and the checks', for the
// caller to log once no lock is held (a logger is the user's code, and may
// call the client; WrapResolver's calls come under its lock). direct is
// false for a resolver's config, which grpc-go applies whatever its names
// say: what checkEntries would refuse in it for the registry's sake is
// returned as warnings instead.
func (c *Client) updateFrom(option string, cfg *serviceconfig.Config, direct bool) ([]string, error) {
	if cfg == nil {
		cfg = &serviceconfig.Config{}
	}
	if err := checkBlocks(option, cfg); err != nil {
		return nil, err
	}
	warnings, err := checkEntries(cfg.MethodConfig, originsOf(option, cfg), c.opts.maxAttemptsCap, direct)
	if err != nil {
		return nil, err
	}
	if err := c.update(cfg, originsOf(option, cfg)); err != nil {
		return nil, err
	}
	return append(parseWarnings(option, cfg), warnings...), nil
}

// update makes cfg, whose entries were checked (checkEntries) and came
// from origins, the client's config.
func (c *Client) update(cfg *serviceconfig.Config, origins []entryOrigin) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := validateGuards(cfg); err != nil {
		return err
	}
	c.table.ensureSeed(cfg, c.opts.rand) // the user's random source: before the locks
	c.updateMu.Lock()
	defer c.updateMu.Unlock()
	st, err := newClientState(cfg, &c.opts, &c.metrics, &c.table, c.state.Load())
	if err != nil {
		return err
	}
	st.origins = origins
	// The table follows the new config and the config is published under
	// one lock, so that a row made meanwhile is made under the config in
	// force (methods.go). No user code runs under it.
	c.table.mu.Lock()
	c.table.rebuild(st)
	c.state.Store(st)
	c.table.mu.Unlock()
	c.table.forgetNames(st)
	return nil
}

// DialOptions returns the options that install the client on a connection:
// its unary and stream interceptors, and grpc.WithDisableRetry, so that
// grpc's built-in retry does not multiply with this one.
func (c *Client) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(c.UnaryClientInterceptor()),
		grpc.WithChainStreamInterceptor(c.StreamClientInterceptor()),
		grpc.WithDisableRetry(),
	}
}

// UnaryClientInterceptor returns the interceptor for unary calls.
func (c *Client) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return c.unary
}

// unaryScratch holds what a unary call needs beyond its stack: the call
// options it passes on, and the header and trailer grpc fills for each
// attempt, with the options that ask for them built once per scratch.
// Pooled, so a call allocates none of it.
type unaryScratch struct {
	opts    []grpc.CallOption
	header  metadata.MD // the attempt's response header; nil: none arrived
	trailer metadata.MD
	// withHeader and withTrailer are grpc.Header(&header) and
	// grpc.Trailer(&trailer), boxed once.
	withHeader, withTrailer grpc.CallOption
}

var unaryScratchPool = sync.Pool{New: func() any {
	s := new(unaryScratch)
	// Room for a few caller options and ours (wait for ready, header,
	// trailer): a scratch the pool makes anew grows no slice.
	s.opts = make([]grpc.CallOption, 0, 8)
	s.withHeader, s.withTrailer = grpc.Header(&s.header), grpc.Trailer(&s.trailer)
	return s
}}

func (s *unaryScratch) put() {
	clear(s.opts)
	s.opts, s.header, s.trailer = s.opts[:0], nil, nil
	unaryScratchPool.Put(s)
}

func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	co := scanCallOptions(opts)
	st, mp := c.resolve(method, co.static)
	if mp.passthrough && !co.any && ctx.Value(idempotencyKeyCtxKey{}) == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	hedge := c.hedgeAttempts(ctx, mp, &co)
	if hedge > 1 && !hedgeable(req, reply) {
		// Copies need a clone of the request and a reply of their own:
		// other messages run one attempt through the guards.
		co.maxAttempts, hedge = 1, 1
	}
	if mp.early && !co.any {
		if ok, err := c.rejectEarly(ctx, st, mp, &co, cc); ok {
			return err
		}
	}
	if mp.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = withTimeout(ctx, mp.timeout)
		defer cancel()
	}

	s := unaryScratchPool.Get().(*unaryScratch)
	defer s.put()
	s.opts = append(s.opts[:0], opts...)
	if mp.waitForReady != nil {
		s.opts = append(s.opts, grpc.WaitForReady(*mp.waitForReady))
	}

	u := unaryCall{r: c.newRetrier(ctx, st, mp, &co), method: method, req: req, reply: reply, cc: cc, invoker: invoker, s: s, sizer: co.sizer}
	ctx = u.r.outgoing(ctx)
	var kerr error
	if ctx, u.r.keyed, kerr = withIdempotencyKey(ctx, mp.keyed); kerr != nil {
		return kerr
	}
	if hedge > 1 {
		return c.hedged(ctx, st, mp, &co, hedge, method, req.(proto.Message), reply.(proto.Message), cc, invoker, s.opts)
	}
	u.ctx = ctx
	if u.r.rp.maxAttempts > 1 || st.storm.throttle != nil || mp.g.rate != nil {
		// A retry, A6 throttling's account of a failure and a rate
		// limit's pace need the server's pushback (trailer), and a retry
		// whether the attempt committed (header).
		s.opts = append(s.opts, s.withHeader, s.withTrailer)
	} else if u.r.keyed && c.metrics.on {
		s.opts = append(s.opts, s.withHeader) // for the replays metric
	}
	if u.r.rp.maxAttempts > 1 && cc != nil && trail.Wanted(cc.Target()) {
		// Every attempt, the first included, carries the call's trail,
		// when the channel's policy reads it (see unaryCall.trailed).
		u.trailed = trail.NewContext(ctx, u.r.trailBound(ctx))
	}
	err := u.run()
	u.r.callEnded(cc)
	return err
}

// rejectEarly ends a call that the method's guards refuse at once (see
// guards.rejecting) before the call builds any state, reading the clock at
// most once: a caller spinning on an open breaker competes for the CPU with
// the probe that would close it. It does what the full path (run, attempt,
// rejected) does for such a call: the retry budget's deposit, the yield
// while half-open, the metrics, span events and hooks, and the same error.
// ok is false when the guards might admit the call, or when the full path
// would end it otherwise: its idempotency key is checked first, and a
// deadline with no time left for an attempt ends it with
// DEADLINE_EXCEEDED. Only methods with mp.early and calls without call
// options of ours come here.
func (c *Client) rejectEarly(ctx context.Context, st *clientState, mp *methodPolicy, co *callOptions, cc *grpc.ClientConn) (ok bool, err error) {
	rej, halfOpenFull, now := mp.g.rejecting()
	if rej == nil {
		return false, nil
	}
	if _, keyed := IdempotencyKeyFromContext(ctx); keyed {
		return false, nil
	}
	r := c.newRetrier(ctx, st, mp, co)
	_, hasDeadline := ctx.Deadline()
	if now.IsZero() && (hasDeadline || r.rp.maxAttempts > 1 && st.storm.budget != nil) {
		now = time.Now()
	}
	if hasDeadline {
		if timeout, bounded := r.attemptTimeout(ctx, now); bounded && timeout <= 0 {
			return false, nil
		}
	}
	r.begin(now)
	if halfOpenFull {
		runtime.Gosched() // as admit does, for the probe's sake
	}
	reason := rej.stopped.Reason
	r.onRejected(ctx, reason)
	err = r.rejected(rej, nil, reason)
	r.callEnded(cc)
	return true, err
}

// unaryCall is one unary call under a retry policy (of one attempt when
// none applies): its retry state and what it passes to each attempt.
type unaryCall struct {
	r       retrier
	ctx     context.Context // the call's: the caller's, bounded by the config timeout
	method  string
	req     any
	reply   any
	cc      *grpc.ClientConn
	invoker grpc.UnaryInvoker
	s       *unaryScratch
	sizer   wireSizer // measures req for the replay buffer
	// trailed is ctx with the call's trail (package trail): one allocation,
	// made only for a call that may retry on a channel whose load-balancing
	// policy reads trails (the endpoint policy; trail.Wanted); nil
	// otherwise. Never pooled: grpc may read an attempt's context after the
	// call has returned.
	trailed context.Context
}

// attemptBase returns the context an attempt derives from: for a call
// that may retry, the call's with its trail of endpoints, which the
// endpoint load-balancing policy reads to send each retry to an endpoint
// the call has not used (it adds every endpoint it picks, the first
// attempt's included); else the call's.
func (u *unaryCall) attemptBase() context.Context {
	if u.trailed != nil {
		return u.trailed
	}
	return u.ctx
}

// run is the retry loop: attempts until one succeeds, or retrying stops.
func (u *unaryCall) run() error {
	r := &u.r
	var lastErr error
	for {
		now := time.Now()
		timeout, bounded := r.attemptTimeout(u.ctx, now)
		if bounded && timeout <= 0 {
			return r.outOfTime(lastErr)
		}
		timedOut, rejected, err := u.attempt(now, timeout)
		switch {
		case rejected:
			return u.rejected(err, lastErr)
		case err == nil:
			r.succeeded()
			return nil
		}
		lastErr = err
		if r.rp.maxAttempts <= 1 {
			if r.st.storm.throttle != nil && !u.committed() {
				r.noRetryFailed(u.ctx, err, u.s.trailer, timedOut)
			}
			if !r.wrap {
				return err
			}
			if r.noRetry != StopNone {
				return r.stopped(err, err, r.noRetry)
			}
		}
		if u.committed() {
			// The attempt is final (gRFC A6), and no failure for the
			// throttle, as in grpc-go.
			r.settle(false)
			return r.stopped(err, err, StopCommitted)
		}
		d := r.decide(u.ctx, err, u.s.trailer, timedOut)
		if d.stop != StopNone {
			return r.stopped(err, err, d.stop)
		}
		r.onRetry(u.ctx, err, d)
		if werr := r.wait(u.ctx, d.delay); werr != nil {
			return r.cancelled(werr, err)
		}
	}
}

// committed reports whether the attempt that just failed had committed:
// the server answered with headers before failing, or the request outgrew
// the replay buffer, which grpc-go counts at the send (gRFC A6; see
// wireSizer). The request is measured only here, once an attempt has
// failed, so the success path pays nothing.
func (u *unaryCall) committed() bool {
	limit := u.r.c.opts.replayBuffer
	return u.s.header != nil || u.sizer.size(u.req, limit) > limit
}

// attempt runs one attempt started at now, bounded by timeout when it is
// positive, and does its accounting. rejected reports that the guards
// refused it (err is then the rejection, or the context's status when the
// caller gave up while queued). The attempt's guards are released on every
// way it ends: an outcome, or a panic below the interceptor, after which
// they are released as if the attempt had been cancelled and the panic goes
// on up. A panic during the admission (the breaker's state-change hook)
// leaves the attempt unsent: the slot of the pace and the budget token it
// held go back, as for a refusal. A panic after the attempt's release (the
// breaker's state-change hook on its verdict, the meter provider) ends a
// call whose attempt succeeded settled as a success: its budget token goes
// back and A6 throttling counts it, as run would have done; a failure is
// settled as run settles it before deciding (failedAborted).
func (u *unaryCall) attempt(now time.Time, timeout time.Duration) (timedOut, rejected bool, err error) {
	r, mp := &u.r, u.r.mp
	r.begin(now)
	var adm admission
	admitted, released, returned := false, false, false
	defer func() {
		switch {
		case returned:
		case !admitted:
			r.dropSlot()
			r.settle(false)
		case !released:
			mp.g.abandon(adm)
		case err == nil:
			r.succeeded()
		default:
			u.failedAborted(err, timedOut)
		}
	}()
	adm, err = mp.g.admit(u.ctx, now, r.paceSlot)
	if err != nil {
		// Never sent: the slot of the pace decide took for it goes back
		// (the deferred call), and its budget token.
		return false, true, err
	}
	admitted = true
	r.paceHeld, r.paceSlot = false, 0
	if adm.paced {
		now = adm.start // the wait at the rate limit is no part of the attempt
	}
	r.attempts++
	actx := attemptContext(u.attemptBase(), r.attempts)
	if timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeout(actx, timeout)
		defer cancel()
	}
	u.s.header, u.s.trailer = nil, nil
	err = u.invoker(actx, u.method, u.req, u.reply, u.cc, u.s.opts...)
	if err != nil && timeout > 0 {
		// The attempt's own timeout fired if its deadline has passed (read
		// on the clock: the error may arrive before the context's timer
		// has run) while the caller's has not.
		end := since(now)
		timedOut = !end.Before(now.Add(timeout)) && callerErrAt(u.ctx, end) == nil
	}
	released = true
	if q := mp.g.rate; q != nil {
		q.answer(u.ctx, err, u.s.trailer, since(now))
	}
	end := mp.g.release(u.ctx, adm, err, true)
	r.c.metrics.attempt(u.ctx, r.mm, err)
	r.c.metrics.replayed(u.ctx, r.mm, u.s.header)
	if mp.latency != nil {
		if end.IsZero() {
			end = since(now)
		}
		if callerErrAt(u.ctx, end) == nil {
			mp.latency.Observe(end.Sub(now))
		}
	}
	returned = true
	return timedOut, false, err
}

// failedAborted does the accounting of an attempt that failed with err
// and was released, when the user's code that runs after its release
// aborts the call: what run and decide do of a failure before deciding
// whether to retry (retrier.failed). A committed attempt's retry token goes back; else gRFC
// A6 throttling counts the failure, and the retry's budget token stays
// spent for a code the policy retries and goes back for any other.
func (u *unaryCall) failedAborted(err error, timedOut bool) {
	r := &u.r
	switch {
	case u.committed():
		r.settle(false)
	case r.rp.maxAttempts <= 1:
		if r.st.storm.throttle != nil {
			r.noRetryFailed(u.ctx, err, u.s.trailer, timedOut)
		}
	default:
		r.failed(u.ctx, err, u.s.trailer, timedOut)
	}
}

// rejected ends a call whose attempt the guards refused with rerr, after
// the attempt that failed with lastErr (nil when none ran): through the
// method's fallback for a rejection, when it has one.
func (u *unaryCall) rejected(rerr, lastErr error) error {
	r, mp := &u.r, u.r.mp
	reason, ok := isRejection(rerr)
	if !ok {
		return r.stopped(rerr, lastErr, stopOfContext(u.ctx.Err()))
	}
	r.onRejected(u.ctx, reason)
	if mp.fallback != nil {
		return mp.fallback(u.ctx, u.method, u.req, u.reply, rerr)
	}
	return r.rejected(rerr.(*RejectedError), lastErr, reason)
}

// withTimeout bounds ctx by d from now, unless ctx already ends sooner: a
// service config's timeout never extends the caller's deadline. A timeout
// of 1ns, a document's "timeout": "0s", has passed as the call starts, as
// in grpc-go: the call fails with DEADLINE_EXCEEDED before any attempt,
// whatever the clock's resolution.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, func() {}
	}
	if d <= time.Nanosecond {
		return context.WithDeadline(ctx, time.Now())
	}
	return context.WithTimeout(ctx, d)
}

// hedgeAttempts returns the number of copies of a hedged call: the
// method's hedging policy with the call options and the one-layer cap
// applied; 1 or less means no hedging.
func (c *Client) hedgeAttempts(ctx context.Context, mp *methodPolicy, co *callOptions) int {
	if mp.hedge == nil || co.noRetry {
		return 1
	}
	n := mp.hedge.maxAttempts
	if co.maxAttempts > 0 {
		n = min(co.maxAttempts, c.opts.maxAttemptsCap)
	}
	if c.opts.oneLayer > 0 && wire.CallerRetries(ctx) {
		n = min(n, c.opts.oneLayer)
	}
	return n
}
