package interceptor

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing/synctest"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// The scripted server of the differential test (parity_test.go). Unlike
// testserver, it keys its script by the call (metadata parity-call) and the
// attempt's arrival order within it, and records per call what the test
// compares.

// callKey is the metadata key that numbers a scenario's calls.
const callKey = "parity-call"

// attemptKey is the header and trailer key in which each attempt names
// itself ("1" for the first), so the caller's view says whose it is.
const attemptKey = "parity-attempt"

// seenAttempt is what the server saw of one attempt.
type seenAttempt struct {
	// Previous is grpc-previous-rpc-attempts, -1 when absent.
	Previous int
	// Read is the size of the request payload read.
	Read int
}

// parityServer serves one side (grpc-go or ours) of one scenario.
type parityServer struct {
	echov1.UnimplementedEchoServiceServer
	sc *scenario

	mu     sync.Mutex
	calls  map[int][]seenAttempt // guarded by mu: call index → attempts
	active atomic.Int32          // handlers running
}

// begin records an attempt of the call named by ctx with a request of
// read bytes and returns the call and the attempt's script.
func (p *parityServer) begin(ctx context.Context, read int) (call int, n int, a scriptedAttempt) {
	md, _ := metadata.FromIncomingContext(ctx)
	call = -1
	if v := md.Get(callKey); len(v) == 1 {
		call, _ = strconv.Atoi(v[0])
	}
	prev := -1
	if v := md.Get(previousAttemptsKey); len(v) > 0 {
		if x, err := strconv.Atoi(v[0]); err == nil {
			prev = x
		}
	}
	p.mu.Lock()
	p.calls[call] = append(p.calls[call], seenAttempt{Previous: prev, Read: read})
	n = len(p.calls[call])
	p.mu.Unlock()
	if call >= 0 && call < len(p.sc.Calls) && n <= len(p.sc.Calls[call].Attempts) {
		a = p.sc.Calls[call].Attempts[n-1]
	}
	return call, n, a
}

// prepare applies a's trailer and header to attempt n, and waits out a
// hang. It returns the error that ends the attempt, nil to succeed.
func (p *parityServer) prepare(ctx context.Context, n int, a scriptedAttempt) error {
	if a.Hang {
		// No trailer: whether the server's deadline or the caller's ends
		// the attempt first is a race, which decides whether the caller
		// sees the server's trailer.
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	tr := metadata.Pairs(attemptKey, strconv.Itoa(n))
	for _, v := range a.Pushback {
		tr.Append(pushbackKey, v)
	}
	_ = grpc.SetTrailer(ctx, tr)
	hdr := metadata.Pairs(attemptKey, strconv.Itoa(n))
	if a.Code == "" || a.Header || a.Sent > 0 {
		// Staged only when the attempt answers: a staged header is sent
		// even before a failure, which commits the attempt.
		_ = grpc.SetHeader(ctx, hdr)
	}
	if a.Header {
		_ = grpc.SendHeader(ctx, nil)
	}
	if a.Code == "" {
		return nil
	}
	var c codes.Code
	if err := c.UnmarshalJSON([]byte(strconv.Quote(a.Code))); err != nil {
		return status.Errorf(codes.Internal, "bad scripted code %q", a.Code)
	}
	return status.Errorf(c, "attempt %d fails", n)
}

// Echo implements EchoService.
func (p *parityServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	p.active.Add(1)
	defer p.active.Add(-1)
	_, n, a := p.begin(ctx, len(req.GetPayload()))
	if err := p.prepare(ctx, n, a); err != nil {
		return nil, err
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// Lookup implements EchoService.
func (p *parityServer) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	p.active.Add(1)
	defer p.active.Add(-1)
	_, n, a := p.begin(ctx, len(req.GetMessage()))
	if err := p.prepare(ctx, n, a); err != nil {
		return nil, err
	}
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

// ServerStream implements EchoService: it sends the scripted number of
// responses (all req.Count on success) before the scripted failure.
func (p *parityServer) ServerStream(req *echov1.ServerStreamRequest, stream grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	p.active.Add(1)
	defer p.active.Add(-1)
	ctx := stream.Context()
	_, n, a := p.begin(ctx, len(req.GetMessage()))
	err := p.prepare(ctx, n, a)
	k := int(req.GetCount())
	if err != nil {
		k = min(k, a.Sent)
	}
	for i := range k {
		if serr := stream.Send(&echov1.ServerStreamResponse{Index: int32(i)}); serr != nil {
			return serr
		}
	}
	return err
}

// seen returns what the server saw of call i.
func (p *parityServer) seen(i int) []seenAttempt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]seenAttempt(nil), p.calls[i]...)
}

// serve starts p on a bufconn listener and returns a connection dialed
// with opts, and a function that waits for p's handlers to end (at most a
// few seconds). stop closes both.
func (p *parityServer) serve(opts ...grpc.DialOption) (cc *grpc.ClientConn, settle func(), stop func(), err error) {
	p.calls = make(map[int][]seenAttempt)
	dial, stopServer := testserver.Listen(func(gs *grpc.Server) { echov1.RegisterEchoServiceServer(gs, p) })
	opts = append(dial, opts...)
	stop = func() {
		if cc != nil {
			_ = cc.Close()
		}
		stopServer()
	}
	cc, err = grpc.NewClient("passthrough:///parity", opts...)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	// Connect before the first call, so that no call's timeout pays for it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			stop()
			return nil, nil, nil, errors.New("the connection did not become ready")
		}
	}
	// A hung attempt's handler ends a moment after the call it hung: once
	// every goroutine of the scenario's bubble is blocked, it has.
	settle = synctest.Wait
	return cc, settle, stop, nil
}

// throttleTokensOf returns the A6 throttle's token count of one side: our
// client's, or that of grpc-go's ClientConn cc, read from its unexported
// retryThrottler (grpc v1.85: a *retryThrottler in an atomic.Value, its
// tokens guarded by its mu). The test compares the two after every call,
// so that a difference in the throttle's accounting shows at the call that
// made it, not only when it later throttles a retry.
func throttleTokensOf(s side, cc *grpc.ClientConn, c *Client) (float64, error) {
	if s == ours {
		return c.state.Load().storm.throttle.Tokens(), nil
	}
	field := reflect.ValueOf(cc).Elem().FieldByName("retryThrottler")
	if !field.IsValid() || field.Type() != reflect.TypeFor[atomic.Value]() {
		return 0, errors.New("grpc.ClientConn has no retryThrottler atomic.Value: grpc changed; update throttleTokensOf")
	}
	rt := reflect.ValueOf((*atomic.Value)(unsafe.Pointer(field.UnsafeAddr())).Load())
	if rt.Kind() != reflect.Pointer || rt.IsNil() {
		return 0, errors.New("grpc-go's ClientConn has no throttle: the service config did not apply")
	}
	mu, tokens := rt.Elem().FieldByName("mu"), rt.Elem().FieldByName("tokens")
	if mu.Type() != reflect.TypeFor[sync.Mutex]() || tokens.Kind() != reflect.Float64 {
		return 0, errors.New("grpc's retryThrottler changed: update throttleTokensOf")
	}
	m := (*sync.Mutex)(unsafe.Pointer(mu.UnsafeAddr()))
	m.Lock()
	defer m.Unlock()
	return *(*float64)(unsafe.Pointer(tokens.UnsafeAddr())), nil
}
