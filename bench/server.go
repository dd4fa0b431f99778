package bench

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Full method names of the echo service, as a [Behavior] receives them.
const (
	MethodEcho         = "/" + echoService + "/Echo"
	MethodLookup       = "/" + echoService + "/Lookup"
	MethodServerStream = "/" + echoService + "/ServerStream"
)

const (
	echoService   = "resilience.echo.v1.EchoService" // as the peers' service configs name it
	streamReplies = 10                               // responses per server stream in every scenario
)

// Transport is how a client reaches the server.
type Transport int

// The transports a scenario can run over.
const (
	// Bufconn is grpc's in-memory listener: HTTP/2 without the kernel.
	Bufconn Transport = iota
	// TCP is a loopback TCP listener on 127.0.0.1.
	TCP
)

// String names the transport as the report does.
func (t Transport) String() string {
	if t == TCP {
		return "loopback TCP"
	}
	return "bufconn"
}

// Behavior decides what the server does with one attempt: wait delay (or
// until the attempt's context ends), then fail with err when it is not nil.
// msg is the request's message, which names the logical call; attempt
// numbers the attempts of one logical call (same method and message) from 1.
// It is called concurrently and must be safe for that.
type Behavior func(method, msg string, attempt int) (delay time.Duration, err error)

// server is the one echo implementation every scenario and peer shares.
// Attempts are counted on the server, so "attempts per call" is what the
// server saw, not what a client library reports.
type server struct {
	echov1.UnimplementedEchoServiceServer

	behavior atomic.Pointer[Behavior] // nil: echo at once, no per-call bookkeeping
	attempts atomic.Int64             // attempts of every method since the last reset
	failed   atomic.Int64             // attempts that ended in an error since the last reset
	inFlight atomic.Int64             // attempts in the handler now (never reset)

	mu      sync.Mutex
	perCall map[string]int // attempts per method and request message; guarded by mu
}

// SetBehavior replaces the behaviour (nil: answer at once) and resets the
// attempt counters.
func (ts *Server) SetBehavior(b Behavior) { ts.setBehavior(b) }

// setBehavior replaces the behaviour and resets the counters.
func (s *server) setBehavior(b Behavior) {
	s.mu.Lock()
	s.perCall = make(map[string]int)
	s.mu.Unlock()
	s.attempts.Store(0)
	s.failed.Store(0)
	if b == nil {
		s.behavior.Store(nil)
		return
	}
	s.behavior.Store(&b)
}

// act runs the behaviour for one attempt of method carrying msg.
func (s *server) act(ctx context.Context, method, msg string) error {
	s.attempts.Add(1)
	s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	b := s.behavior.Load()
	if b == nil {
		return nil
	}
	s.mu.Lock()
	key := method + "\x00" + msg
	s.perCall[key]++
	n := s.perCall[key]
	s.mu.Unlock()
	delay, err := (*b)(method, msg, n)
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			s.failed.Add(1)
			return ctx.Err()
		}
	}
	if err != nil {
		s.failed.Add(1)
	}
	return err
}

func (s *server) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	if err := s.act(ctx, MethodEcho, req.GetMessage()); err != nil {
		return nil, err
	}
	return &echov1.EchoResponse{Message: req.GetMessage(), Payload: req.GetPayload()}, nil
}

func (s *server) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	if err := s.act(ctx, MethodLookup, req.GetMessage()); err != nil {
		return nil, err
	}
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

func (s *server) ServerStream(req *echov1.ServerStreamRequest, st grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	if err := s.act(st.Context(), MethodServerStream, req.GetMessage()); err != nil {
		return err
	}
	for i := range req.GetCount() {
		if err := st.Send(&echov1.ServerStreamResponse{Message: req.GetMessage(), Index: i}); err != nil {
			return err
		}
	}
	return nil
}

// Server is the running echo server every scenario shares (a scenario of
// another package, such as bench/overload, too): Echo and Lookup answer
// with the request's message and ServerStream sends count responses, all
// after the [Behavior] set with SetBehavior has run once for the attempt.
// Attempts are counted on the server.
type Server struct {
	*server
	gs     *grpc.Server
	target string
	dialer grpc.DialOption // nil for TCP
}

// startServer starts the shared echo server over tr with opts (server
// interceptors, MaxConcurrentStreams). Stop it with stop.
func StartServer(tr Transport, opts ...grpc.ServerOption) (*Server, error) {
	s := &server{perCall: make(map[string]int)}
	gs := grpc.NewServer(opts...)
	echov1.RegisterEchoServiceServer(gs, s)
	ts := &Server{server: s, gs: gs}
	var lis net.Listener
	switch tr {
	case TCP:
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("bench: listen on loopback TCP: %w", err)
		}
		lis, ts.target = l, l.Addr().String()
	default:
		bl := bufconn.Listen(1 << 20)
		lis, ts.target = bl, "passthrough:///bufnet"
		ts.dialer = grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return bl.DialContext(ctx)
		})
	}
	go func() { _ = gs.Serve(lis) }()
	return ts, nil
}

// Dial connects to the server, insecure, with opts appended (a peer's
// interceptors and service config).
func (ts *Server) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	all := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if ts.dialer != nil {
		all = append(all, ts.dialer)
	}
	all = append(all, opts...)
	cc, err := grpc.NewClient(ts.target, all...)
	if err != nil {
		return nil, fmt.Errorf("bench: dial %s: %w", ts.target, err)
	}
	cc.Connect()
	return cc, nil
}

// Stop stops the server and closes its connections.
func (ts *Server) Stop() { ts.gs.Stop() }

// Attempts returns the attempts of every method since the last SetBehavior.
func (ts *Server) Attempts() int64 { return ts.attempts.Load() }

// InFlight returns the attempts in a handler now, of every method.
func (ts *Server) InFlight() int64 { return ts.inFlight.Load() }

// Failed returns the attempts that ended in an error since the last SetBehavior.
func (ts *Server) Failed() int64 { return ts.failed.Load() }
