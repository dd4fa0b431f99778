package interceptor

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
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
	// faultPanicRandom makes SendMsg, RecvMsg and Header panic once in
	// faultRandomOdds calls, drawn from a source seeded by the call's
	// faultSeedKey metadata and the attempt number.
	faultPanicRandom = "panic-random"
)

// faultSeedKey is the outgoing metadata that seeds faultPanicRandom.
const faultSeedKey = "x-test-fault-seed"

// faultRandomOdds is the one-in-n chance of a faultPanicRandom panic per call.
const faultRandomOdds = 16

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
	fs := &faultyStream{fault: fault}
	if fault == faultPanicRandom {
		seed, _ := strconv.ParseUint(strings.Join(md.Get(faultSeedKey), ""), 10, 64)
		fs.rng = rand.New(rand.NewPCG(seed, uint64(len(md.Get(previousAttemptsKey)))))
	}
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	fs.ClientStream = cs
	return fs, nil
}

// faultyStream is a grpc stream with one fault.
type faultyStream struct {
	grpc.ClientStream
	fault string

	mu  sync.Mutex
	rng *rand.Rand // faultPanicRandom's draws; nil for the other faults
}

// hit reports whether the call with fault on its own should fail now.
func (f *faultyStream) hit(fault string) bool {
	if f.fault == fault {
		return true
	}
	if f.rng == nil {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.IntN(faultRandomOdds) == 0
}

// SendMsg panics for faultPanicSend (and at random for faultPanicRandom).
func (f *faultyStream) SendMsg(m any) error {
	if f.hit(faultPanicSend) {
		panic(errInjected)
	}
	return f.ClientStream.SendMsg(m)
}

// RecvMsg panics for faultPanicRecv (and at random for faultPanicRandom).
func (f *faultyStream) RecvMsg(m any) error {
	if f.hit(faultPanicRecv) {
		panic(errInjected)
	}
	return f.ClientStream.RecvMsg(m)
}

// Header fails for faultErrHeader and panics for faultPanicHeader (and at
// random for faultPanicRandom).
func (f *faultyStream) Header() (metadata.MD, error) {
	if f.fault == faultErrHeader {
		return nil, status.Error(codes.Internal, "injected header error")
	}
	if f.hit(faultPanicHeader) {
		panic(errInjected)
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
	if held := heldBy(c.Status(fullMethod)); held != "" {
		t.Errorf("%s: %swant nothing held", when, held)
	}
}
