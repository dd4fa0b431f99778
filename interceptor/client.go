package interceptor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Client holds the client side of grpc-resilience: the per-method policies
// and state that its unary and stream interceptors share. Create it with
// NewClient; it is safe for concurrent use, and its interceptors may be
// installed on any number of connections.
type Client struct {
	opts     clientOptions
	metrics  instruments
	state    atomic.Pointer[clientState]
	updateMu sync.Mutex // serializes UpdateServiceConfig
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
	c := &Client{opts: o}
	m, err := newInstruments(o.meterProvider, c)
	if err != nil {
		return nil, fmt.Errorf("interceptor: metrics: %w", err)
	}
	c.metrics = m
	cfg := o.config
	if err := c.UpdateServiceConfig(&cfg); err != nil {
		return nil, err
	}
	return c, nil
}

// UpdateServiceConfig replaces the client's service config with cfg, as a
// whole: the entries given to NewClient are dropped. Calls that started
// before it finish under the config they started with; calls after it see
// cfg. A config with errors is refused and the old one stays.
func (c *Client) UpdateServiceConfig(cfg *serviceconfig.Config) error {
	if cfg == nil {
		cfg = &serviceconfig.Config{}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := validateGuards(cfg); err != nil {
		return err
	}
	c.updateMu.Lock()
	defer c.updateMu.Unlock()
	st, err := newClientState(cfg, &c.opts, &c.metrics, c.state.Load())
	if err != nil {
		return err
	}
	c.state.Store(st)
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
// options it passes on and the trailer grpc fills. Pooled, so a call
// allocates neither.
type unaryScratch struct {
	opts    []grpc.CallOption
	trailer metadata.MD
}

var unaryScratchPool = sync.Pool{New: func() any { return new(unaryScratch) }}

func (c *Client) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	st := c.state.Load()
	mp := st.policy(method)
	co := scanCallOptions(opts)
	if mp.passthrough && !co.any && ctx.Value(idempotencyKeyCtxKey{}) == nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if mp.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = withTimeout(ctx, mp.timeout)
		defer cancel()
	}

	s := unaryScratchPool.Get().(*unaryScratch)
	defer func() {
		clear(s.opts)
		s.opts, s.trailer = s.opts[:0], nil
		unaryScratchPool.Put(s)
	}()
	s.opts = append(s.opts[:0], opts...)
	if mp.waitForReady != nil {
		s.opts = append(s.opts, grpc.WaitForReady(*mp.waitForReady))
	}

	r := c.newRetrier(ctx, st, mp, &co)
	ctx = r.outgoing(ctx)
	var kerr error
	if ctx, r.keyed, kerr = withIdempotencyKey(ctx, mp); kerr != nil {
		return kerr
	}
	if n := c.hedgeAttempts(ctx, mp, &co); n > 1 {
		return c.hedged(ctx, st, mp, n, method, req, reply, cc, invoker, s.opts)
	}
	retrying := r.rp.maxAttempts > 1
	if retrying {
		s.opts = append(s.opts, grpc.Trailer(&s.trailer))
	}
	var lastErr error
	for {
		now := time.Now()
		timeout, bounded := r.attemptTimeout(ctx, now)
		if bounded && timeout <= 0 {
			return r.outOfTime(lastErr)
		}
		r.begin(now)
		adm, rerr := mp.g.admit(ctx, method, now)
		if rerr != nil {
			r.settle(false)
			if reason, ok := isRejection(rerr); ok {
				if mp.fallback != nil {
					return mp.fallback(ctx, method, req, reply, rerr)
				}
				return r.stopped(rerr, lastErr, reason)
			}
			return r.stopped(rerr, lastErr, stopOfContext(ctx.Err()))
		}
		r.attempts++
		actx := attemptContext(ctx, r.attempts)
		var acancel context.CancelFunc
		if timeout > 0 {
			actx, acancel = context.WithTimeout(actx, timeout)
		}
		s.trailer = nil
		err := invoker(actx, method, req, reply, cc, s.opts...)
		timedOut := false
		if acancel != nil {
			// The attempt's own timeout fired if its deadline has passed
			// (read on the clock: the error may arrive before the context's
			// timer has run) while the caller's has not.
			if err != nil {
				end := since(now)
				timedOut = !end.Before(now.Add(timeout)) && callerErrAt(ctx, end) == nil
			}
			acancel()
		}
		end := mp.g.release(ctx, adm, err, true)
		c.metrics.attempt(ctx, &mp.mm, err)
		if mp.latency != nil {
			if end.IsZero() {
				end = since(now)
			}
			if callerErrAt(ctx, end) == nil {
				mp.latency.Observe(end.Sub(now))
			}
		}
		if err == nil {
			r.succeeded()
			return nil
		}
		lastErr = err
		if !retrying {
			if !r.wrap {
				return err
			}
			if r.noRetry != StopNone {
				return r.stopped(err, err, r.noRetry)
			}
		}
		d := r.decide(ctx, err, s.trailer, timedOut)
		if d.stop != StopNone {
			return r.stopped(err, err, d.stop)
		}
		r.onRetry(ctx, err, d)
		if werr := r.wait(ctx, d.delay); werr != nil {
			return r.cancelled(werr, err)
		}
	}
}

// withTimeout bounds ctx by d from now, unless ctx already ends sooner: a
// service config's timeout never extends the caller's deadline.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, func() {}
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
	if c.opts.oneLayer > 0 && CallerRetries(ctx) {
		n = min(n, c.opts.oneLayer)
	}
	return n
}
