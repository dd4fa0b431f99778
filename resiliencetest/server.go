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

// Step is what the server does with one attempt. The zero Step echoes at
// once.
type Step struct {
	// Delay is waited before answering (on the bubble's clock inside
	// testing/synctest), or until the attempt's context ends.
	Delay time.Duration
	// Code, when not OK, fails the attempt with this code and Message.
	Code    codes.Code
	Message string
	// Trailer is set on the attempt, e.g. grpc-retry-pushback-ms.
	Trailer metadata.MD
	// After, for ServerStream, is the number of responses sent before the
	// failure.
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
	// Handled reports whether the attempt reached the Server's handler.
	// It is false for an attempt that a server interceptor ended first,
	// such as one faultinject aborted: a Server started by Start or Serve
	// records every attempt that arrives, before the interceptors given
	// as server options, so that counts are what the client sent.
	Handled bool
}

// Server is the scripted fake echo service. The zero value is not usable:
// call NewServer.
type Server struct {
	echov1.UnimplementedEchoServiceServer

	mu       sync.Mutex
	scripts  map[string][]Step    // per method, the steps not yet used; guarded by mu
	onCall   func(a Attempt) Step // when set, decides every attempt; guarded by mu
	attempts []Attempt            // in arrival order; guarded by mu
	counts   map[string]int       // attempts per method; guarded by mu
}

// NewServer returns a Server that echoes every call until scripted.
func NewServer() *Server {
	return &Server{scripts: map[string][]Step{}, counts: map[string]int{}}
}

// Script appends steps to the script of a full method: its next attempts
// that reach the handler take them in order (an attempt a server
// interceptor ended takes none); once they are used up, attempts echo.
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
// recording interceptor did) and returns its step.
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
// step's failure, or the context's status when it ended first.
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
	if st.Code != codes.OK && st.After == 0 {
		return status.Error(st.Code, st.Message)
	}
	return nil
}

func (st Step) fail() error { return status.Error(st.Code, st.Message) }

func unaryTrailer(ctx context.Context) func(metadata.MD) {
	return func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }
}

// Echo answers by its script.
func (s *Server) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	if err := s.begin(ctx, EchoMethod).play(ctx, unaryTrailer(ctx)); err != nil {
		return nil, err
	}
	return &echov1.EchoResponse{Message: req.GetMessage(), Payload: req.GetPayload()}, nil
}

// Lookup answers by its script.
func (s *Server) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	if err := s.begin(ctx, LookupMethod).play(ctx, unaryTrailer(ctx)); err != nil {
		return nil, err
	}
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

// ServerStream sends req.Count responses, or Step.After and then the
// step's failure.
func (s *Server) ServerStream(req *echov1.ServerStreamRequest, ss grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	ctx := ss.Context()
	st := s.begin(ctx, ServerStreamMethod)
	if err := st.play(ctx, ss.SetTrailer); err != nil {
		return err
	}
	n := int(req.GetCount())
	if st.Code != codes.OK {
		n = min(n, st.After)
	}
	for i := range n {
		if err := ss.Send(&echov1.ServerStreamResponse{Message: req.GetMessage(), Index: int32(i)}); err != nil {
			return err
		}
	}
	if st.Code != codes.OK {
		return st.fail()
	}
	return nil
}

// ClientStream collects the requests after its step.
func (s *Server) ClientStream(ss grpc.ClientStreamingServer[echov1.ClientStreamRequest, echov1.ClientStreamResponse]) error {
	ctx := ss.Context()
	if err := s.begin(ctx, ClientStreamMethod).play(ctx, ss.SetTrailer); err != nil {
		return err
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

// BidiStream answers each request after its step.
func (s *Server) BidiStream(ss grpc.BidiStreamingServer[echov1.BidiStreamRequest, echov1.BidiStreamResponse]) error {
	ctx := ss.Context()
	if err := s.begin(ctx, BidiStreamMethod).play(ctx, ss.SetTrailer); err != nil {
		return err
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

// Serve serves srv over bufconn, with the given server options (such as
// interceptors), and returns a connection dialed with dialOpts (such as a
// Client's DialOptions) and a function that closes the connection and stops
// the server. Tests use Start; Serve is for Examples and programs.
//
// When srv is a *Server, it records every attempt as it arrives (in a
// stats handler), before the interceptors of serverOpts, whichever option
// installs them: an attempt that one of them ends (such
// as faultinject's server interceptors aborting it) is in Attempts, with
// Handled false, and counts for RequireAttempts.
func Serve(srv echov1.EchoServiceServer, dialOpts []grpc.DialOption, serverOpts ...grpc.ServerOption) (*grpc.ClientConn, func(), error) {
	lis := bufconn.Listen(1 << 20)
	if s, ok := srv.(*Server); ok {
		serverOpts = append([]grpc.ServerOption{grpc.StatsHandler(recorder{s})}, serverOpts...)
	}
	gs := grpc.NewServer(serverOpts...)
	echov1.RegisterEchoServiceServer(gs, srv)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	stopServer := func() {
		gs.Stop()
		<-served
	}
	dial := func(context.Context, string) (net.Conn, error) { return lis.Dial() }
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
