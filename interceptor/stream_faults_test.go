package interceptor

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// faultKey is outgoing metadata naming the fault faultBelow injects into a
// stream. It travels to the server too, which ignores it.
const faultKey = "x-test-fault"

// The faults faultBelow injects below the client's stream interceptor, as a
// later interceptor, a codec or a stats handler could.
const (
	faultPanicStreamer      = "panic-streamer"       // creating any attempt panics
	faultPanicStreamerRetry = "panic-streamer-retry" // creating attempt 2 or later panics
	faultPanicSend          = "panic-send"           // SendMsg panics
	faultPanicRecv          = "panic-recv"           // RecvMsg panics
	faultPanicHeader        = "panic-header"         // Header panics
	faultErrHeader          = "err-header"           // Header returns an error
)

// errInjected is the value faultBelow panics with.
var errInjected = errors.New("injected panic below the interceptor")

// withFault returns ctx asking faultBelow for fault on the streams it starts.
func withFault(ctx context.Context, fault string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, faultKey, fault)
}

// faultBelow is a stream interceptor meant to run after (below) the
// client's: it injects the fault named by the call's faultKey metadata.
func faultBelow(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	f := md.Get(faultKey)
	if len(f) == 0 {
		return streamer(ctx, desc, cc, method, opts...)
	}
	fault := f[len(f)-1]
	retry := len(md.Get(previousAttemptsKey)) > 0
	if fault == faultPanicStreamer || fault == faultPanicStreamerRetry && retry {
		panic(errInjected)
	}
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &faultyStream{ClientStream: cs, fault: fault}, nil
}

// faultyStream is a grpc stream with one fault.
type faultyStream struct {
	grpc.ClientStream
	fault string
}

func (f *faultyStream) SendMsg(m any) error {
	if f.fault == faultPanicSend {
		panic(errInjected)
	}
	return f.ClientStream.SendMsg(m)
}

func (f *faultyStream) RecvMsg(m any) error {
	if f.fault == faultPanicRecv {
		panic(errInjected)
	}
	return f.ClientStream.RecvMsg(m)
}

func (f *faultyStream) Header() (metadata.MD, error) {
	switch f.fault {
	case faultPanicHeader:
		panic(errInjected)
	case faultErrHeader:
		return nil, status.Error(codes.Internal, "injected header error")
	}
	return f.ClientStream.Header()
}

// recovered runs f and returns what it panicked with, or nil: the caller
// above the interceptor that recovers.
func recovered(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

// guardedConfig guards every method with a bulkhead of one slot and a
// breaker that opens at the first failure for a second, and retries with
// retry (nil: no retry policy).
func guardedConfig(retry *serviceconfig.RetryPolicy, consecutiveFailures int) serviceconfig.MethodConfig {
	return serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{}},
		RetryPolicy:    retry,
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: consecutiveFailures, OpenDuration: time.Second},
	}
}

// startWithFaults serves srv and returns a stub and its connection whose
// streams run through c and then faultBelow.
func startWithFaults(t *testing.T, srv *testserver.Server, c *Client) (echov1.EchoServiceClient, *grpc.ClientConn) {
	t.Helper()
	opts := append(c.DialOptions(), grpc.WithChainStreamInterceptor(faultBelow))
	cc := testserver.Start(t, srv, opts...)
	return echov1.NewEchoServiceClient(cc), cc
}

// assertNothingHeld fails t if fullMethod's bulkhead or breaker holds
// anything now, once every goroutine of the bubble has settled.
func assertNothingHeld(t *testing.T, c *Client, fullMethod, when string) {
	t.Helper()
	st := c.Status(fullMethod)
	if b := st.Bulkhead; b != nil && (b.InFlight != 0 || b.Queued != 0) {
		t.Errorf("%s: bulkhead in flight %d, queued %d; want 0, 0", when, b.InFlight, b.Queued)
	}
	if b := st.Breaker; b != nil && b.Probes != 0 {
		t.Errorf("%s: breaker %v with %d probes out; want none", when, b.State, b.Probes)
	}
}
