package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// sickServer fails Echo while sick is set and always answers Lookup.
type sickServer struct {
	echov1.UnimplementedEchoServiceServer
	sick     atomic.Bool
	attempts atomic.Int64
}

func (s *sickServer) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.attempts.Add(1)
	if s.sick.Load() {
		return nil, status.Error(codes.Unavailable, "down")
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

func (s *sickServer) Lookup(_ context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

// breakerDemo takes a method down, watches its breaker open while another
// method keeps working, heals it and watches the breaker close.
func breakerDemo(out io.Writer) error {
	fmt.Fprintln(out, "== 2. Circuit breaker: Echo goes down, Lookup stays up")
	cfg, err := serviceconfig.Parse([]byte(`{"methodConfig": [{
	  "name": [{"service": "resilience.echo.v1.EchoService"}],
	  "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
	                  "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]},
	  "circuitBreaker": {"consecutiveFailures": 4, "openDuration": "0.3s"}
	}]}`))
	if err != nil {
		return err
	}
	// The hook runs inside the call whose attempt moved the breaker, before
	// that call returns: it records the transition, and the demo prints it
	// after the call's own line, cause before effect.
	var (
		mu          sync.Mutex
		transitions []string
	)
	client, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg),
		interceptor.WithOnStateChange(func(_ string, from, to interceptor.BreakerState) {
			mu.Lock()
			transitions = append(transitions, fmt.Sprintf("%v -> %v", from, to))
			mu.Unlock()
		}))
	if err != nil {
		return err
	}
	// printTransitions prints the transitions the call just made caused.
	printTransitions := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, t := range transitions {
			fmt.Fprintf(out, "           which moved the breaker of Echo: %s\n", t)
		}
		transitions = transitions[:0]
	}
	srv := &sickServer{}
	srv.sick.Store(true)
	conn, stop, err := serve(srv, nil, client.DialOptions()...)
	if err != nil {
		return err
	}
	defer stop()
	stub := echov1.NewEchoServiceClient(conn)
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		before := srv.attempts.Load()
		start := time.Now()
		_, err := stub.Echo(ctx, &echov1.EchoRequest{Message: "x"})
		fmt.Fprintf(out, "Echo   %d: %-62v server attempts=%d  %v\n", i, shortErr(err),
			srv.attempts.Load()-before, time.Since(start).Round(time.Millisecond))
		printTransitions()
	}
	if _, err := stub.Lookup(ctx, &echov1.LookupRequest{Message: "y"}); err != nil {
		return err
	}
	fmt.Fprintln(out, "Lookup  : ok (its own breaker is closed)")
	srv.sick.Store(false)
	time.Sleep(300 * time.Millisecond) // the open duration: the demo shows it passing
	_, err = stub.Echo(ctx, &echov1.EchoRequest{Message: "x"})
	fmt.Fprintf(out, "Echo after the server healed and 300ms passed: %v\n", shortErr(err))
	printTransitions()
	fmt.Fprintln(out)
	return nil
}

// budgetDemo runs concurrent callers against a server that is down, with
// and without the retry budget.
func budgetDemo(out io.Writer) error {
	fmt.Fprintln(out, "== 3. Retry budget: 32 callers, 2016 calls, a server that is down")
	policy := &serviceconfig.RetryPolicy{MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
	for _, mode := range []struct {
		name string
		opts []interceptor.ClientOption
	}{
		{"plain retry (no budget)", []interceptor.ClientOption{interceptor.WithRetryBudget(nil)}},
		{"default retry budget", nil},
	} {
		client, err := interceptor.NewClient(append(mode.opts, interceptor.WithRetryPolicy(policy))...)
		if err != nil {
			return err
		}
		srv := &sickServer{}
		srv.sick.Store(true)
		conn, stop, err := serve(srv, nil, client.DialOptions()...)
		if err != nil {
			return err
		}
		stub := echov1.NewEchoServiceClient(conn)
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for range 63 {
					_, _ = stub.Echo(context.Background(), &echov1.EchoRequest{})
				}
			})
		}
		wg.Wait()
		stop()
		fmt.Fprintf(out, "%-24s %.2f attempts per call on the server\n", mode.name, float64(srv.attempts.Load())/2016)
	}
	fmt.Fprintln(out)
	return nil
}

// orders places an order slowly, whatever its caller does.
type orders struct {
	echov1.UnimplementedEchoServiceServer
	placed atomic.Int64
}

func (o *orders) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	n := o.placed.Add(1)
	time.Sleep(150 * time.Millisecond)
	return &echov1.EchoResponse{Message: fmt.Sprintf("order %s placed (execution #%d)", req.GetMessage(), n)}, nil
}

// idempotencyDemo retries a call with side effects whose first attempt
// times out on the client: with an idempotency key the server runs it once.
func idempotencyDemo(out io.Writer) error {
	fmt.Fprintln(out, "== 4. Idempotency: CreateOrder times out after 100ms; the server takes 150ms")
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		return err
	}
	// The demo's one client is not authenticated: it shares the one scope.
	// A real server scopes keys by the authenticated caller
	// (server.Idempotency's Scope).
	srv, err := server.New(server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope}))
	if err != nil {
		return err
	}
	defer srv.Close()
	policy := &serviceconfig.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond,
		PerAttemptRecvTimeout: 100 * time.Millisecond}
	client, err := interceptor.NewClient(interceptor.WithRetryPolicy(policy),
		interceptor.WithIdempotencyKeys("/resilience.echo.v1.EchoService/Echo"),
		interceptor.WithOnRetry(func(_ context.Context, e interceptor.RetryEvent) {
			fmt.Fprintf(out, "attempt %d: %v; retrying with the same key\n", e.Attempt, status.Code(e.Err))
		}))
	if err != nil {
		return err
	}
	impl := &orders{}
	conn, stop, err := serve(impl, srv, client.DialOptions()...)
	if err != nil {
		return err
	}
	defer stop()
	resp, err := echov1.NewEchoServiceClient(conn).Echo(context.Background(), &echov1.EchoRequest{Message: "#42"})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "reply: %s; the server executed it %d time(s)\n", resp.GetMessage(), impl.placed.Load())
	return nil
}

// shortErr is "ok" or the error's code and why retrying stopped.
func shortErr(err error) string {
	if err == nil {
		return "ok"
	}
	s := status.Code(err).String()
	var re *interceptor.RetryError
	if errors.As(err, &re) {
		s += fmt.Sprintf(" after %d attempts (%v)", re.Attempts, re.Reason)
	}
	if errors.Is(err, interceptor.ErrCircuitOpen) {
		s += ": fails fast"
	}
	return s
}
