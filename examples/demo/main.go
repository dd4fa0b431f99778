package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func main() {
	calls := flag.Int("calls", 12, "number of calls to make in the retry part")
	failRate := flag.Float64("fail", 0.4, "share of attempts the flaky server fails with UNAVAILABLE")
	seed := flag.Uint64("seed", 5, "seed of the server's and the client's randomness")
	flag.Parse()
	out := os.Stdout
	steps := []func() error{
		func() error { return run(out, *calls, *failRate, *seed) },
		func() error { return breakerDemo(out) },
		func() error { return budgetDemo(out) },
		func() error { return idempotencyDemo(out) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
	}
}

// serve starts impl on an in-memory listener, behind the server's
// interceptors when srv is not nil, and returns a connection to it dialed
// with opts and a function that stops both.
func serve(impl echov1.EchoServiceServer, srv *server.Server, opts ...grpc.DialOption) (*grpc.ClientConn, func(), error) {
	lis := bufconn.Listen(1 << 20)
	var sopts []grpc.ServerOption
	if srv != nil {
		sopts = append(sopts, grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	}
	gs := grpc.NewServer(sopts...)
	echov1.RegisterEchoServiceServer(gs, impl)
	go func() { _ = gs.Serve(lis) }()
	dialer := grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() })
	conn, err := grpc.NewClient("passthrough:///demo",
		append(opts, dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		gs.Stop()
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close(); gs.Stop() }, nil
}

// flakyServer fails a share of attempts: most with UNAVAILABLE, some with a
// pushback trailer asking for a pause, and rejects empty messages as a bug
// of the caller that no retry can fix.
type flakyServer struct {
	echov1.UnimplementedEchoServiceServer
	mu       sync.Mutex
	rng      *rand.Rand
	failRate float64
	attempts int
}

func (s *flakyServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.mu.Lock()
	s.attempts++
	roll := s.rng.Float64()
	s.mu.Unlock()
	switch {
	case req.GetMessage() == "":
		return nil, status.Error(codes.InvalidArgument, "message is required")
	case roll < s.failRate/4:
		grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "120"))
		return nil, status.Error(codes.Unavailable, "overloaded, come back in 120ms")
	case roll < s.failRate:
		return nil, status.Error(codes.Unavailable, "connection reset")
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// run shows retries against a flaky server.
func run(out io.Writer, calls int, failRate float64, seed uint64) error {
	srv := &flakyServer{rng: rand.New(rand.NewPCG(seed, 1)), failRate: failRate}

	// What each call went through, filled by the retry hook.
	var trace []string
	client, err := interceptor.NewClient(
		interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
			MaxAttempts:       4,
			InitialBackoff:    20 * time.Millisecond,
			MaxBackoff:        200 * time.Millisecond,
			BackoffMultiplier: 2,
			Jitter:            serviceconfig.JitterFull,
		}),
		interceptor.WithRandSource(rand.NewPCG(seed, 2)),
		interceptor.WithOnRetry(func(_ context.Context, e interceptor.RetryEvent) {
			why := "backoff"
			if e.Pushback {
				why = "server pushback"
			}
			trace = append(trace, fmt.Sprintf("%v, wait %v (%s)", status.Code(e.Err), e.Delay.Round(time.Millisecond), why))
		}),
	)
	if err != nil {
		return err
	}
	conn, stop, err := serve(srv, nil, client.DialOptions()...)
	if err != nil {
		return err
	}
	defer stop()
	stub := echov1.NewEchoServiceClient(conn)

	fmt.Fprintf(out, "== 1. Retries: %d calls to a server that fails %.0f%% of attempts\n\n", calls, failRate*100)
	ok := 0
	for i := 1; i <= calls; i++ {
		msg := fmt.Sprintf("hello %d", i)
		if i%5 == 0 {
			msg = "" // the server rejects it: a caller's bug is never retried
		}
		trace = trace[:0]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		start := time.Now()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{Message: msg})
		elapsed := time.Since(start).Round(time.Millisecond)
		cancel()

		attempts, verdict := len(trace)+1, "ok"
		if err != nil {
			verdict = status.Code(err).String()
			var re *interceptor.RetryError
			if errors.As(err, &re) {
				attempts = re.Attempts
				verdict += " (" + re.Reason.String() + ")"
			}
		} else {
			ok++
		}
		fmt.Fprintf(out, "call %2d  %-36s attempts=%d  %v\n", i, verdict, attempts, elapsed)
		for _, line := range trace {
			fmt.Fprintf(out, "           retry after %s\n", line)
		}
	}
	srv.mu.Lock()
	seen := srv.attempts
	srv.mu.Unlock()
	fmt.Fprintf(out, "\n%d of %d calls succeeded; the server saw %d attempts.\n", ok, calls, seen)
	fmt.Fprintln(out, strings.TrimSpace(`
Retried: UNAVAILABLE, with full jitter, or after exactly the server's pushback.
Not retried: INVALID_ARGUMENT, which no retry can fix.`))
	fmt.Fprintln(out)
	return nil
}
