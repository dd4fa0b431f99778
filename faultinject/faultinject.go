package faultinject

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Option configures [New].
type Option interface{ apply(*options) }

type options struct {
	metadataFaults bool
	now            func() time.Time
	logger         *slog.Logger // nil: slog.Default()
}

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

// WithMetadataFaults lets callers ask for faults per call with metadata
// (see [MetadataAbort]). Metadata comes from callers and is untrusted:
// enable it only where every caller may make the server fail or wait, such
// as in tests or in staging.
func WithMetadataFaults() Option {
	return optionFunc(func(o *options) { o.metadataFaults = true })
}

// WithNow sets the clock of outage windows; by default time.Now (which is
// the bubble's fake clock inside testing/synctest).
func WithNow(now func() time.Time) Option {
	return optionFunc(func(o *options) { o.now = now })
}

// WithLogger sets the logger of New's warnings: a fault's method whose
// service no code linked into the program registers (see [New]). By
// default they go to slog.Default(); not to grpclog, whose default logger
// discards warnings.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) { o.logger = l })
}

// Injector injects the faults of a Config. Its interceptors share its
// random generator and its counts.
type Injector struct {
	faults         []compiled // immutable
	metadataFaults bool
	now            func() time.Time
	start          time.Time // outage windows count from here

	byMethod sync.Map // full method -> *compiled, nil when no fault matches

	mu  sync.Mutex // guards rnd
	rnd *rand.Rand

	delays, aborts, streamAborts atomic.Int64
}

// compiled is a Fault with its method names split once.
type compiled struct {
	Fault
	all         bool
	services    map[string]struct{} // "pkg.Service"
	methods     map[string]struct{} // "/pkg.Service/Method"
	outageAbort *Abort              // the abort of Outage; nil without one
}

func (c *compiled) matches(fullMethod string) bool {
	if c.all {
		return !exempt(fullMethod)
	}
	if _, ok := c.methods[fullMethod]; ok {
		return true
	}
	svc, _, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	_, ok := c.services[svc]
	return ok
}

// exemptServices are the services no fault reaches unless a fault names
// them: health checks and reflection, which tools such as grpcurl call
// with the same metadata as the call under test, and which load balancers
// must see answer. The same list as interceptor.DefaultExemptServices.
var exemptServices = []string{
	"grpc.health.v1.Health",
	"grpc.reflection.v1.ServerReflection",
	"grpc.reflection.v1alpha.ServerReflection",
}

// exempt reports whether fullMethod is a method of an exempt service.
func exempt(fullMethod string) bool {
	svc, _, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	for _, e := range exemptServices {
		if svc == e {
			return true
		}
	}
	return false
}

// New returns an Injector of cfg, or the error of cfg.Validate. It also
// checks the faults' methods against the services the program's generated
// code registers (protoregistry.GlobalFiles): a method its service does
// not have ("resilience.echo.v1.EchoService/Ecko"), a method's name given
// as a service ("Echo"), and a fault with only streamAbort that names only
// unary methods are errors, as an *Error at the name's path; a service
// nothing registers (called or served without generated code, or
// misspelt) is logged, once (WithLogger).
func New(cfg Config, opts ...Option) (*Injector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	warnings, err := checkRegistered(&cfg)
	if err != nil {
		return nil, err
	}
	o := options{now: time.Now}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("faultinject: New: nil Option")
		}
		opt.apply(&o)
	}
	if o.now == nil {
		return nil, errors.New("faultinject: WithNow(nil)")
	}
	for _, w := range warnings {
		if o.logger != nil {
			o.logger.Warn(w)
		} else {
			slog.Warn(w) // not grpclog, whose default logger discards warnings
		}
	}
	inj := &Injector{
		metadataFaults: o.metadataFaults,
		now:            o.now,
		start:          o.now(),
		rnd:            rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
	}
	for _, f := range cfg.Faults {
		c := compiled{Fault: f, all: len(f.Methods) == 0,
			services: map[string]struct{}{}, methods: map[string]struct{}{}}
		if f.Outage != nil {
			c.outageAbort = &Abort{Code: f.Outage.Code}
		}
		for _, m := range f.Methods {
			svc, meth, _ := splitName(m) // validated
			if meth == "" {
				c.services[svc] = struct{}{}
			} else {
				c.methods["/"+svc+"/"+meth] = struct{}{}
			}
		}
		inj.faults = append(inj.faults, c)
	}
	return inj, nil
}

// Counts are the faults an Injector has injected so far.
type Counts struct {
	Delays, Aborts, StreamAborts int64
}

// Counts returns the faults injected so far.
func (inj *Injector) Counts() Counts {
	return Counts{Delays: inj.delays.Load(), Aborts: inj.aborts.Load(), StreamAborts: inj.streamAborts.Load()}
}

// fault returns the configured fault of a method, nil for none.
func (inj *Injector) fault(fullMethod string) *compiled {
	if v, ok := inj.byMethod.Load(fullMethod); ok {
		return v.(*compiled)
	}
	var found *compiled
	for i := range inj.faults {
		if inj.faults[i].matches(fullMethod) {
			found = &inj.faults[i]
			break
		}
	}
	inj.byMethod.Store(fullMethod, found)
	return found
}

// hit draws whether a fault of the given rate (0 meaning 1) applies.
func (inj *Injector) hit(rate float64) bool {
	if rate == 0 || rate >= 1 {
		return true
	}
	inj.mu.Lock()
	x := inj.rnd.Float64()
	inj.mu.Unlock()
	return x < rate
}

// plan is what happens to one call.
type plan struct {
	delay       time.Duration // 0: none
	abort       *Abort        // nil: none
	streamAbort *StreamAbort  // nil: none
}

// planFor decides the faults of one call from the metadata (when enabled
// and present) or the configuration. A bad fault in metadata is an
// INVALID_ARGUMENT error. The metadata is read only when enabled, so a call
// without a fault allocates nothing.
func (inj *Injector) planFor(ctx context.Context, fullMethod string, outgoing bool) (plan, error) {
	if inj.metadataFaults && !exempt(fullMethod) {
		var md metadata.MD
		if outgoing {
			md, _ = metadata.FromOutgoingContext(ctx)
		} else {
			md, _ = metadata.FromIncomingContext(ctx)
		}
		if p, ok, err := planFromMetadata(md); ok || err != nil {
			if p.abort != nil && !inj.hit(p.abort.Rate) {
				p.abort = nil
			}
			return p, err
		}
	}
	f := inj.fault(fullMethod)
	if f == nil {
		return plan{}, nil
	}
	var p plan
	if f.Delay != nil && inj.hit(f.Delay.Rate) {
		p.delay = f.Delay.Fixed
	}
	if f.Outage != nil && inj.now().Sub(inj.start)%f.Outage.Every < f.Outage.Duration {
		p.abort = f.outageAbort
	} else if f.Abort != nil && inj.hit(f.Abort.Rate) {
		p.abort = f.Abort
	}
	if f.StreamAbort != nil && inj.hit(f.StreamAbort.Rate) {
		p.streamAbort = f.StreamAbort
	}
	return p, nil
}

// wait waits out the plan's delay, or until ctx ends (returning its status).
func (inj *Injector) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	inj.delays.Add(1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// abort counts an injected abort and returns its status and its trailer
// (the pushback, nil when none).
func (inj *Injector) abort(a *Abort) (metadata.MD, error) {
	inj.aborts.Add(1)
	st := status.New(a.Code, "faultinject: injected abort")
	if a.RetryDelay > 0 {
		if withRI, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(a.RetryDelay)}); err == nil {
			st = withRI
		}
	}
	var md metadata.MD
	switch {
	case a.Pushback < 0: // any negative pushback says "do not retry"
		md = metadata.Pairs("grpc-retry-pushback-ms", "-1")
	case a.Pushback > 0:
		md = metadata.Pairs("grpc-retry-pushback-ms", strconv.FormatInt(a.Pushback.Milliseconds(), 10))
	}
	return md, st.Err()
}

// UnaryServerInterceptor returns a server interceptor that injects the
// faults of the called method: delay, then abort, before the handler runs.
func (inj *Injector) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := inj.planFor(ctx, info.FullMethod, false)
		if err != nil {
			return nil, err
		}
		if err := inj.wait(ctx, p.delay); err != nil {
			return nil, err
		}
		if p.abort != nil {
			trailer, err := inj.abort(p.abort)
			if trailer != nil {
				_ = grpc.SetTrailer(ctx, trailer) // fails only when the call ended
			}
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns a server interceptor that injects the
// faults of the called method: delay, then abort before the handler runs,
// or an abort once the stream has passed the configured messages.
func (inj *Injector) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		p, err := inj.planFor(ctx, info.FullMethod, false)
		if err != nil {
			return err
		}
		if err := inj.wait(ctx, p.delay); err != nil {
			return err
		}
		if p.abort != nil {
			trailer, err := inj.abort(p.abort)
			if trailer != nil {
				ss.SetTrailer(trailer)
			}
			return err
		}
		if p.streamAbort == nil {
			return handler(srv, ss)
		}
		w := &srvStream{ServerStream: ss}
		w.arm(p.streamAbort)
		herr := handler(srv, w)
		if w.aborted.Load() {
			inj.streamAborts.Add(1)
			return w.err
		}
		return herr
	}
}

// gate counts the messages of a stream under a StreamAbort: the first
// AfterMessages pass, every later one is refused with err. Shared by
// srvStream and cliStream, which differ in what a refusal does.
type gate struct {
	left atomic.Int64 // messages that may still pass
	err  error        // the abort status; immutable after arm
}

// arm sets the gate for a before the stream is handed out.
func (g *gate) arm(a *StreamAbort) {
	g.err = status.Error(a.Code, "faultinject: injected stream abort")
	g.left.Store(int64(a.AfterMessages))
}

// open takes one message's passage and reports whether it was granted.
func (g *gate) open() bool { return g.left.Add(-1) >= 0 }

// srvStream fails its messages once its gate closes.
type srvStream struct {
	grpc.ServerStream
	gate
	aborted atomic.Bool // a message was refused
}

func (s *srvStream) pass() error {
	if !s.open() {
		s.aborted.Store(true)
		return s.err
	}
	return nil
}

func (s *srvStream) SendMsg(m any) error {
	if err := s.pass(); err != nil {
		return err
	}
	return s.ServerStream.SendMsg(m)
}

func (s *srvStream) RecvMsg(m any) error {
	if err := s.pass(); err != nil {
		return err
	}
	return s.ServerStream.RecvMsg(m)
}

// UnaryClientInterceptor returns a client interceptor that injects the
// faults of the called method before the call leaves: delay, then abort
// (the call is not sent). An abort's pushback is written where a
// grpc.Trailer call option asks for the trailer, as a server's would be, so
// install it inside (after) the interceptors under test.
func (inj *Injector) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		p, err := inj.planFor(ctx, method, true)
		if err != nil {
			return err
		}
		if err := inj.wait(ctx, p.delay); err != nil {
			return err
		}
		if p.abort != nil {
			trailer, err := inj.abort(p.abort)
			setTrailer(opts, trailer)
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// setTrailer stores md where the call's grpc.Trailer options point.
func setTrailer(opts []grpc.CallOption, md metadata.MD) {
	for _, o := range opts {
		if t, ok := o.(grpc.TrailerCallOption); ok && t.TrailerAddr != nil {
			*t.TrailerAddr = md.Copy()
		}
	}
}

// StreamClientInterceptor returns a client interceptor that injects the
// faults of the called method: delay, then abort before the stream opens,
// or an abort once the stream has passed the configured messages (the
// stream is then cancelled).
func (inj *Injector) StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		p, err := inj.planFor(ctx, method, true)
		if err != nil {
			return nil, err
		}
		if err := inj.wait(ctx, p.delay); err != nil {
			return nil, err
		}
		if p.abort != nil {
			trailer, err := inj.abort(p.abort)
			setTrailer(opts, trailer)
			return nil, err
		}
		if p.streamAbort == nil {
			return streamer(ctx, desc, cc, method, opts...)
		}
		ctx, cancel := context.WithCancel(ctx)
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			cancel()
			return nil, err
		}
		w := &cliStream{ClientStream: cs, cancel: cancel, inj: inj}
		w.arm(p.streamAbort)
		return w, nil
	}
}

// cliStream fails its messages once its gate closes, and cancels the
// stream then, or when RecvMsg reports the stream's end.
type cliStream struct {
	grpc.ClientStream
	gate
	cancel context.CancelFunc // releases the stream's context; idempotent
	inj    *Injector
	once   sync.Once // counts the abort once
}

func (s *cliStream) pass() error {
	if !s.open() {
		s.once.Do(func() { s.inj.streamAborts.Add(1) })
		s.cancel()
		return s.err
	}
	return nil
}

func (s *cliStream) SendMsg(m any) error {
	if err := s.pass(); err != nil {
		return err
	}
	return s.ClientStream.SendMsg(m)
}

func (s *cliStream) RecvMsg(m any) error {
	if err := s.pass(); err != nil {
		return err
	}
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.cancel() // the stream ended: nothing more will pass
	}
	return err
}

// A compile-time check that the wrappers stay streams.
var (
	_ grpc.ServerStream = (*srvStream)(nil)
	_ grpc.ClientStream = (*cliStream)(nil)
)
