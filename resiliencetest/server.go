package resiliencetest

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Full methods of the echo service.
const (
	EchoMethod         = "/resilience.echo.v1.EchoService/Echo"
	LookupMethod       = "/resilience.echo.v1.EchoService/Lookup"
	ServerStreamMethod = "/resilience.echo.v1.EchoService/ServerStream"
	ClientStreamMethod = "/resilience.echo.v1.EchoService/ClientStream"
	BidiStreamMethod   = "/resilience.echo.v1.EchoService/BidiStream"
)

// Step is what the server does with one attempt, in front of the
// method's handler. The zero Step lets the handler answer at once (the
// echo service echoes).
type Step struct {
	// Delay is waited before anything else (on the bubble's clock inside
	// testing/synctest), or until the attempt's context ends.
	Delay time.Duration
	// Code, when not OK, fails the attempt with this code and Message
	// without running the handler (but see After).
	Code    codes.Code
	Message string
	// Trailer is set on the attempt, e.g. grpc-retry-pushback-ms.
	Trailer metadata.MD
	// After, for a failing step of a method that streams responses, is the
	// number of responses sent before the failure: the handler runs, its
	// sends past After fail with the step's status, and so does the
	// stream. Unary methods ignore it.
	After int
}

// FailTimes returns n steps that fail with code, for Script: the (n+1)th
// attempt succeeds.
func FailTimes(n int, code codes.Code) []Step {
	steps := make([]Step, n)
	for i := range steps {
		steps[i] = Step{Code: code, Message: fmt.Sprintf("resiliencetest: scripted failure %d of %d", i+1, n)}
	}
	return steps
}

// Latencies returns one successful step per delay, for Script: the first
// attempt answers after ds[0], the second after ds[1], and so on.
func Latencies(ds ...time.Duration) []Step {
	steps := make([]Step, len(ds))
	for i, d := range ds {
		steps[i] = Step{Delay: d}
	}
	return steps
}

// Attempt is what the server saw of one incoming attempt.
type Attempt struct {
	// Method is the full method.
	Method string
	// N numbers the attempts of this method from 1, in arrival order.
	N int
	// Previous is the value of grpc-previous-rpc-attempts, -1 when absent.
	Previous int
	// MD is the incoming metadata.
	MD metadata.MD
	// Handled reports whether the attempt reached the Server's step: it
	// passed every server interceptor given as a server option. It is false
	// for an attempt that one of them ended first, such as one faultinject
	// aborted: a Server started by Start, Serve or a cluster records every
	// attempt that arrives, before those interceptors, so that counts are
	// what the client sent.
	Handled bool
}

// Server is one backend of a test: it serves the echo service (NewServer
// without arguments) or the services its registrars install (NewServer
// with them), answers each attempt of every method by its script, and
// records every attempt.
//
// A step (from Script or OnCall) is played in front of the method's
// handler: its Delay, then its Trailer, then its failure, which ends the
// attempt before the handler runs; a step without a Code lets the
// handler answer. So the scripts work for any service: the echo service's
// handlers echo, and a registered service's handlers answer as written.
type Server struct {
	echov1.UnimplementedEchoServiceServer

	register []func(*grpc.Server) // nil: the echo service

	mu       sync.Mutex
	scripts  map[string][]Step    // per method, the steps not yet used; guarded by mu
	onCall   func(a Attempt) Step // when set, decides every attempt; guarded by mu
	attempts []Attempt            // in arrival order; guarded by mu
	counts   map[string]int       // attempts per method; guarded by mu
}

// NewServer returns a Server of the echo service, or, given registrars, of
// the services they register on the grpc.Server that Start, Serve or a
// cluster builds (and not the echo service, unless one registers it). A
// registrar is typically a generated Register function bound to an
// implementation:
//
//	resiliencetest.NewServer(func(s *grpc.Server) { healthgrpc.RegisterHealthServer(s, hs) })
//	resiliencetest.NewServer(func(s *grpc.Server) { s.RegisterService(&desc, impl) })
//
// Every attempt of every method is recorded and scripted alike. Unscripted,
// the Server echoes, or lets the registered handlers answer.
func NewServer(register ...func(*grpc.Server)) *Server {
	return &Server{register: slices.Clone(register), scripts: map[string][]Step{}, counts: map[string]int{}}
}

// Script appends steps to the script of a full method: its next attempts
// that reach the Server's step take them in order (an attempt a server
// interceptor ended takes none); once they are used up, attempts go to
// the handler unchanged.
func (s *Server) Script(fullMethod string, steps ...Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scripts[fullMethod] = append(s.scripts[fullMethod], steps...)
}

// OnCall makes f decide every attempt, of every method, instead of the
// scripts: a per-call script. f runs on the server's goroutine, outside the
// Server's lock.
func (s *Server) OnCall(f func(a Attempt) Step) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onCall = f
}

// Attempts returns the attempts of fullMethod seen so far, in arrival
// order; all attempts when fullMethod is empty.
func (s *Server) Attempts(fullMethod string) []Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fullMethod == "" {
		return slices.Clone(s.attempts)
	}
	var out []Attempt
	for _, a := range s.attempts {
		if a.Method == fullMethod {
			out = append(out, a)
		}
	}
	return out
}

// arrivalKey marks the context of an attempt already recorded as it
// arrived: its value is the attempt's index in Server.attempts.
type arrivalKey struct{}

// playedKey marks the context of an attempt whose step the Server's
// interceptor played: the echo handlers then only echo.
type playedKey struct{}

// arrive records an attempt as it arrives and returns its index.
func (s *Server) arrive(ctx context.Context, method string) int {
	md, _ := metadata.FromIncomingContext(ctx)
	prev := -1
	if v := md.Get("grpc-previous-rpc-attempts"); len(v) > 0 {
		if n, err := strconv.Atoi(v[0]); err == nil {
			prev = n
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts[method]++
	s.attempts = append(s.attempts, Attempt{Method: method, N: s.counts[method], Previous: prev, MD: md.Copy()})
	return len(s.attempts) - 1
}

// recorder is the stats handler by which a Server records every attempt
// as it arrives: grpc tags an RPC before any server interceptor runs,
// whether grpc.UnaryInterceptor or a chain installed it, and the context
// it returns is the one the interceptors and the handler get.
type recorder struct{ s *Server }

func (r recorder) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, arrivalKey{}, r.s.arrive(ctx, info.FullMethodName))
}

func (recorder) HandleRPC(context.Context, stats.RPCStats)                         {}
func (recorder) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (recorder) HandleConn(context.Context, stats.ConnStats)                       {}

// begin marks the attempt of ctx handled (recording it first when no
// recorder did) and returns its step.
func (s *Server) begin(ctx context.Context, method string) Step {
	i, ok := ctx.Value(arrivalKey{}).(int)
	if !ok {
		i = s.arrive(ctx, method)
	}
	s.mu.Lock()
	s.attempts[i].Handled = true
	a := s.attempts[i]
	f := s.onCall
	var step Step
	if f == nil {
		if q := s.scripts[method]; len(q) > 0 {
			step, s.scripts[method] = q[0], q[1:]
		}
	}
	s.mu.Unlock()
	if f != nil {
		step = f(a)
	}
	return step
}

// play waits out the step's delay and sets its trailer; it returns the
// context's status when the context ended first.
func (st Step) play(ctx context.Context, setTrailer func(metadata.MD)) error {
	if st.Delay > 0 {
		t := time.NewTimer(st.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	if st.Trailer != nil {
		setTrailer(st.Trailer)
	}
	return nil
}

func (st Step) fail() error { return status.Error(st.Code, st.Message) }

// unaryStep is the Server's innermost unary interceptor: it plays the
// attempt's step, then fails the attempt or calls the handler.
func (s *Server) unaryStep(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	st := s.begin(ctx, info.FullMethod)
	if err := st.play(ctx, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }); err != nil {
		return nil, err
	}
	if st.Code != codes.OK {
		return nil, st.fail()
	}
	return handler(context.WithValue(ctx, playedKey{}, true), req)
}

// streamStep is the Server's innermost stream interceptor: it plays the
// attempt's step, then fails the attempt, or calls the handler and, for a
// failing step with After, fails the stream after After responses.
func (s *Server) streamStep(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	st := s.begin(ctx, info.FullMethod)
	if err := st.play(ctx, ss.SetTrailer); err != nil {
		return err
	}
	if st.Code == codes.OK {
		return handler(srv, &playedStream{ServerStream: ss, ctx: context.WithValue(ctx, playedKey{}, true)})
	}
	if st.After == 0 {
		return st.fail()
	}
	_ = handler(srv, &playedStream{ServerStream: ss, ctx: context.WithValue(ctx, playedKey{}, true), fail: &st})
	return st.fail()
}

// playedStream is a stream whose step was played: it carries the mark
// and, for a failing step with After, refuses responses past After.
type playedStream struct {
	grpc.ServerStream
	ctx  context.Context
	fail *Step // nil: no failure after responses
	sent int
}

func (p *playedStream) Context() context.Context { return p.ctx }

func (p *playedStream) SendMsg(m any) error {
	if p.fail != nil {
		if p.sent >= p.fail.After {
			return p.fail.fail()
		}
		p.sent++
	}
	return p.ServerStream.SendMsg(m)
}

// played reports whether the Server's interceptor played the step of the
// attempt of ctx: false when the Server is registered on a grpc.Server
// that Start, Serve or a cluster did not build, and its handlers play it.
func played(ctx context.Context) bool { return ctx.Value(playedKey{}) != nil }

// Echo answers by its script.
func (s *Server) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	if !played(ctx) {
		return unaryHere(s, ctx, EchoMethod, req, s.Echo)
	}
	return &echov1.EchoResponse{Message: req.GetMessage(), Payload: req.GetPayload()}, nil
}

// Lookup answers by its script.
func (s *Server) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	if !played(ctx) {
		return unaryHere(s, ctx, LookupMethod, req, s.Lookup)
	}
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

// unaryHere plays the step of a unary echo method whose Server is served
// without its interceptor, then calls h.
func unaryHere[Req, Resp any](s *Server, ctx context.Context, method string, req *Req, h func(context.Context, *Req) (*Resp, error)) (*Resp, error) {
	resp, err := s.unaryStep(ctx, req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
		return h(ctx, req.(*Req))
	})
	r, _ := resp.(*Resp)
	return r, err
}

// streamHere plays the step of a streaming echo method whose Server is
// served without its interceptor, then calls h on the played stream.
func (s *Server) streamHere(ss grpc.ServerStream, method string, h func(grpc.ServerStream) error) error {
	return s.streamStep(nil, ss, &grpc.StreamServerInfo{FullMethod: method}, func(_ any, ss grpc.ServerStream) error { return h(ss) })
}

// ServerStream sends req.Count responses; a failing step with After fails
// the stream after After of them.
func (s *Server) ServerStream(req *echov1.ServerStreamRequest, ss grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	if !played(ss.Context()) {
		return s.streamHere(ss, ServerStreamMethod, func(ss grpc.ServerStream) error {
			return s.ServerStream(req, &grpc.GenericServerStream[echov1.ServerStreamRequest, echov1.ServerStreamResponse]{ServerStream: ss})
		})
	}
	for i := range int(req.GetCount()) {
		if err := ss.Send(&echov1.ServerStreamResponse{Message: req.GetMessage(), Index: int32(i)}); err != nil {
			return err
		}
	}
	return nil
}

// ClientStream collects the requests.
func (s *Server) ClientStream(ss grpc.ClientStreamingServer[echov1.ClientStreamRequest, echov1.ClientStreamResponse]) error {
	if !played(ss.Context()) {
		return s.streamHere(ss, ClientStreamMethod, func(ss grpc.ServerStream) error {
			return s.ClientStream(&grpc.GenericServerStream[echov1.ClientStreamRequest, echov1.ClientStreamResponse]{ServerStream: ss})
		})
	}
	var out echov1.ClientStreamResponse
	for {
		req, err := ss.Recv()
		if err == io.EOF {
			return ss.SendAndClose(&out)
		}
		if err != nil {
			return err
		}
		out.Messages = append(out.Messages, req.GetMessage())
	}
}

// BidiStream answers each request.
func (s *Server) BidiStream(ss grpc.BidiStreamingServer[echov1.BidiStreamRequest, echov1.BidiStreamResponse]) error {
	if !played(ss.Context()) {
		return s.streamHere(ss, BidiStreamMethod, func(ss grpc.ServerStream) error {
			return s.BidiStream(&grpc.GenericServerStream[echov1.BidiStreamRequest, echov1.BidiStreamResponse]{ServerStream: ss})
		})
	}
	for {
		req, err := ss.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ss.Send(&echov1.BidiStreamResponse{Message: req.GetMessage()}); err != nil {
			return err
		}
	}
}

// newGRPCServer builds the grpc.Server that serves srv with serverOpts.
// For a *Server, its recorder comes first (it sees every attempt as it
// arrives, whichever option installs the interceptors) and its step
// interceptors last (innermost: they see the attempts every interceptor
// of serverOpts let through), and its registrars install its services.
func newGRPCServer(srv echov1.EchoServiceServer, serverOpts []grpc.ServerOption) *grpc.Server {
	s, ok := srv.(*Server)
	if !ok {
		gs := grpc.NewServer(serverOpts...)
		echov1.RegisterEchoServiceServer(gs, srv)
		return gs
	}
	opts := make([]grpc.ServerOption, 0, len(serverOpts)+3)
	opts = append(opts, grpc.StatsHandler(recorder{s}))
	opts = append(opts, serverOpts...)
	opts = append(opts, grpc.ChainUnaryInterceptor(s.unaryStep), grpc.ChainStreamInterceptor(s.streamStep))
	gs := grpc.NewServer(opts...)
	if len(s.register) == 0 {
		echov1.RegisterEchoServiceServer(gs, s)
	}
	for _, register := range s.register {
		register(gs)
	}
	return gs
}

// serveOn serves srv on lis with serverOpts and returns the function that
// stops it and waits for Serve to return.
func serveOn(lis net.Listener, srv echov1.EchoServiceServer, serverOpts []grpc.ServerOption) func() {
	gs := newGRPCServer(srv, serverOpts)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	return func() {
		gs.Stop()
		<-served
	}
}

// Serve serves srv over bufconn, with the given server options (such as
// interceptors), and returns a connection dialed with dialOpts (such as a
// Client's DialOptions) and a function that closes the connection and stops
// the server. Tests use Start; Serve is for Examples and programs.
//
// When srv is a *Server, the grpc.Server serves its services (the echo
// service, or those of NewServer's registrars), records every attempt as
// it arrives (in a stats handler), before the interceptors of serverOpts,
// whichever option installs them, and plays its steps after them: an
// attempt that one of them ends (such as faultinject's server
// interceptors aborting it) is in Attempts, with Handled false, counts
// for RequireAttempts and takes no step. Any other srv is served as the
// echo service, unrecorded.
func Serve(srv echov1.EchoServiceServer, dialOpts []grpc.DialOption, serverOpts ...grpc.ServerOption) (*grpc.ClientConn, func(), error) {
	lis := bufconn.Listen(1 << 20)
	stopServer := serveOn(lis, srv, serverOpts)
	dial := func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }
	opts := append([]grpc.DialOption{
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, dialOpts...)
	cc, err := grpc.NewClient("passthrough:///resiliencetest", opts...)
	if err != nil {
		stopServer()
		return nil, nil, err
	}
	return cc, func() {
		_ = cc.Close()
		stopServer()
	}, nil
}

// Start is Serve for tests: it fails the test on error and stops
// everything in t.Cleanup. It works inside a testing/synctest bubble when
// called there.
func Start(t testing.TB, srv echov1.EchoServiceServer, dialOpts []grpc.DialOption, serverOpts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	cc, stop, err := Serve(srv, dialOpts, serverOpts...)
	if err != nil {
		t.Fatalf("resiliencetest.Start: %v", err)
	}
	t.Cleanup(stop)
	return cc
}
