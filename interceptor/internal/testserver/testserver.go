package testserver

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Attempt is what the server saw of one incoming call.
type Attempt struct {
	// Method is the full method, "/resilience.echo.v1.EchoService/Echo".
	Method string
	// Previous is the value of grpc-previous-rpc-attempts, -1 when absent.
	Previous int
	// N numbers the attempts of this method from 1, in arrival order.
	N int
	// MD is the incoming metadata.
	MD metadata.MD
	// Messages are the request messages received so far.
	Messages []string
}

// Outcome is what the server does with one attempt.
type Outcome struct {
	// Err, when set, ends the attempt with this error (a status error).
	Err error
	// After, for streaming responses, is the number of responses sent before
	// Err; for client and bidi streams, the number of requests read before
	// the script is asked (0 means all, for client streams).
	After int
	// Trailer is set on the attempt before it ends.
	Trailer metadata.MD
	// Header is sent before anything else when set.
	Header metadata.MD
	// Delay is waited before answering (on the bubble's clock in synctest),
	// or until the attempt's context ends.
	Delay time.Duration
}

// Script decides an attempt's outcome. It is called once per attempt, with a
// copy of what the server saw so far; it may be called more than once for
// one attempt, so it must be a function of its argument. A nil Script echoes.
type Script func(a Attempt) Outcome

// Server is the echo server. Set Script before calls start.
type Server struct {
	echov1.UnimplementedEchoServiceServer

	mu       sync.Mutex
	script   Script
	attempts []Attempt // guarded by mu
	counts   map[string]int
}

// SetScript replaces the server's script.
func (s *Server) SetScript(f Script) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.script = f
}

// Attempts returns a copy of every attempt seen, in arrival order.
func (s *Server) Attempts() []Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Attempt(nil), s.attempts...)
}

// Count returns the number of attempts seen of the method named by its last
// path element, such as "Echo"; "" counts all.
func (s *Server) Count(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if method == "" {
		return len(s.attempts)
	}
	// From the per-method counts begin keeps: tests that ask after every
	// call (2,000 calls a run) made the scan of every attempt, with a
	// string built per attempt, a third of their CPU, more under -race.
	return s.counts[prefix+method]
}

// begin records a new attempt and returns its index.
func (s *Server) begin(ctx context.Context, method string) int {
	md, _ := metadata.FromIncomingContext(ctx)
	prev := -1
	if v := md.Get("grpc-previous-rpc-attempts"); len(v) > 0 {
		if n, err := strconv.Atoi(v[0]); err == nil {
			prev = n
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = make(map[string]int)
	}
	s.counts[method]++
	s.attempts = append(s.attempts, Attempt{Method: method, Previous: prev, N: s.counts[method], MD: md.Copy()})
	return len(s.attempts) - 1
}

func (s *Server) addMessage(i int, m string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts[i].Messages = append(s.attempts[i].Messages, m)
}

// decide asks the script about attempt i and applies its header, trailer
// and delay.
func (s *Server) decide(ctx context.Context, i int) Outcome {
	o := s.peek(i)
	if o.Header != nil {
		_ = grpc.SetHeader(ctx, o.Header)
	}
	if o.Trailer != nil {
		grpc.SetTrailer(ctx, o.Trailer)
	}
	if o.Delay > 0 {
		t := time.NewTimer(o.Delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return Outcome{Err: ctx.Err()}
		}
	}
	return o
}

const prefix = "/resilience.echo.v1.EchoService/"

// Echo implements EchoService.
func (s *Server) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	i := s.begin(ctx, prefix+"Echo")
	s.addMessage(i, req.GetMessage())
	if o := s.decide(ctx, i); o.Err != nil {
		return nil, o.Err
	}
	return &echov1.EchoResponse{Message: req.GetMessage(), Payload: req.GetPayload()}, nil
}

// Lookup implements EchoService.
func (s *Server) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	i := s.begin(ctx, prefix+"Lookup")
	s.addMessage(i, req.GetMessage())
	if o := s.decide(ctx, i); o.Err != nil {
		return nil, o.Err
	}
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

// ServerStream implements EchoService: it sends Outcome.After responses
// before failing with Outcome.Err, or all req.Count responses.
func (s *Server) ServerStream(req *echov1.ServerStreamRequest, stream grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	i := s.begin(stream.Context(), prefix+"ServerStream")
	s.addMessage(i, req.GetMessage())
	o := s.decide(stream.Context(), i)
	n := int(req.GetCount())
	if o.Err != nil {
		n = min(n, o.After)
	}
	for k := range n {
		if err := stream.Send(&echov1.ServerStreamResponse{Message: req.GetMessage(), Index: int32(k)}); err != nil {
			return err
		}
	}
	return o.Err
}

// ClientStream implements EchoService: it reads every request (or
// Outcome.After of them when failing), then answers with their messages.
func (s *Server) ClientStream(stream grpc.ClientStreamingServer[echov1.ClientStreamRequest, echov1.ClientStreamResponse]) error {
	ctx := stream.Context()
	i := s.begin(ctx, prefix+"ClientStream")
	var got []string
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		got = append(got, req.GetMessage())
		s.addMessage(i, req.GetMessage())
		if o := s.peek(i); o.Err != nil && o.After > 0 && len(got) >= o.After {
			return s.decide(ctx, i).Err
		}
	}
	if o := s.decide(ctx, i); o.Err != nil {
		return o.Err
	}
	return stream.SendAndClose(&echov1.ClientStreamResponse{Messages: got})
}

// peek asks the script without applying the outcome.
func (s *Server) peek(i int) Outcome {
	s.mu.Lock()
	f := s.script
	a := s.attempts[i]
	a.Messages = append([]string(nil), a.Messages...)
	s.mu.Unlock()
	if f == nil {
		return Outcome{}
	}
	return f(a)
}

// BidiStream implements EchoService: it answers each request, asking the
// script after each one.
func (s *Server) BidiStream(stream grpc.BidiStreamingServer[echov1.BidiStreamRequest, echov1.BidiStreamResponse]) error {
	ctx := stream.Context()
	i := s.begin(ctx, prefix+"BidiStream")
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		s.addMessage(i, req.GetMessage())
		if o := s.decide(ctx, i); o.Err != nil {
			return o.Err
		}
		if err := stream.Send(&echov1.BidiStreamResponse{Message: req.GetMessage()}); err != nil {
			return err
		}
	}
}

// Listen serves, over bufconn, the services register installs on a new
// grpc.Server. It returns the dial options that reach it (a context dialer
// and insecure credentials) and a function that stops the server and waits
// for it to end.
func Listen(register func(*grpc.Server)) (dial []grpc.DialOption, stop func()) {
	return listen(nil, register)
}

// listen is Listen with the grpc.Server's options.
func listen(sopts []grpc.ServerOption, register func(*grpc.Server)) (dial []grpc.DialOption, stop func()) {
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(sopts...)
	register(gs)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	dialer := func(context.Context, string) (net.Conn, error) { return lis.Dial() }
	dial = []grpc.DialOption{
		grpc.WithContextDialer(dialer),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
	return dial, func() {
		gs.Stop()
		<-served
	}
}

// Start serves srv over bufconn until the test ends and returns a client
// connection dialed with opts. Everything is closed by t.Cleanup.
func Start(t testing.TB, srv echov1.EchoServiceServer, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return StartWith(t, srv, nil, opts...)
}

// StartWith is Start with the grpc.Server's options, such as the
// interceptors under test.
func StartWith(t testing.TB, srv echov1.EchoServiceServer, sopts []grpc.ServerOption, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	return ServeWith(t, sopts, func(gs *grpc.Server) { echov1.RegisterEchoServiceServer(gs, srv) }, opts...)
}

// ServeWith serves, over bufconn until the test ends, the services register
// installs on a grpc.Server built with sopts, and returns a client
// connection dialed with opts. Everything is closed by t.Cleanup.
func ServeWith(t testing.TB, sopts []grpc.ServerOption, register func(*grpc.Server), opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	dial, stop := listen(sopts, register)
	cc, err := grpc.NewClient("passthrough:///bufnet", append(dial, opts...)...)
	if err != nil {
		stop()
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		stop()
	})
	return cc
}

// PairedCalls runs bare and ours alternately, b.N times each, the order
// swapped every iteration so that neither gains from running second, and
// reports each side's time per call and ours/bare: a ratio that holds on a
// busy machine, where absolute times do not.
func PairedCalls(b *testing.B, bare, ours func(i int)) {
	var tb, to time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			t0 := time.Now()
			bare(i)
			t1 := time.Now()
			ours(i)
			tb, to = tb+t1.Sub(t0), to+time.Since(t1)
		} else {
			t0 := time.Now()
			ours(i)
			t1 := time.Now()
			bare(i)
			to, tb = to+t1.Sub(t0), tb+time.Since(t1)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(tb.Nanoseconds())/float64(b.N), "bare-ns/call")
	b.ReportMetric(float64(to.Nanoseconds())/float64(b.N), "ours-ns/call")
	b.ReportMetric(float64(to)/float64(tb), "ratio")
}

// ServeLoopback serves gs on a loopback TCP port and returns its address;
// stop stops gs and waits for Serve to return.
func ServeLoopback(t *testing.T, gs *grpc.Server) (addr string, stop func()) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis)
	}()
	return lis.Addr().String(), func() {
		gs.Stop()
		<-served
	}
}
