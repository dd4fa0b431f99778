package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// PacingConfig is the client pacing measurement, in real time over
// loopback TCP: a server admits one call per Period (GCRA, a burst of 1)
// and refuses the others with RESOURCE_EXHAUSTED and a RetryInfo carrying
// the exact time until a call would be admitted; Callers goroutines each
// call it in a closed loop (Think between calls, a 1 s deadline per call)
// for Duration, through a client that retries RESOURCE_EXHAUSTED (3
// attempts, honouring RetryInfo), with and without a rateLimit block.
type PacingConfig struct {
	Period   time.Duration
	Callers  int
	Think    time.Duration
	Duration time.Duration
}

// DefaultPacing: a server admitting 10 calls per second, 8 callers
// calling every 5ms for 5 s.
func DefaultPacing() PacingConfig {
	return PacingConfig{Period: 100 * time.Millisecond, Callers: 8, Think: 5 * time.Millisecond, Duration: 5 * time.Second}
}

// PacingResult is one run of one client.
type PacingResult struct {
	Client   string
	Calls    int64 // calls made
	OK       int64 // calls that succeeded
	Local    int64 // calls refused locally (ErrRateLimited)
	Admitted int64 // attempts the server admitted
	Refused  int64 // attempts the server refused: the doomed attempts
	Periods  float64
}

// DoomedPerPeriod is the attempts the server refused per pushback period.
func (r PacingResult) DoomedPerPeriod() float64 { return float64(r.Refused) / r.Periods }

func (r PacingResult) String() string {
	return fmt.Sprintf("%-22s calls %6d  ok %4d  refused locally %6d  server admitted %4d  refused %6d  (%.2f per pushback period)",
		r.Client, r.Calls, r.OK, r.Local, r.Admitted, r.Refused, r.DoomedPerPeriod())
}

// quotaServer admits one call per every.
type quotaServer struct {
	echov1.UnimplementedEchoServiceServer
	every             time.Duration
	mu                sync.Mutex
	next              time.Time
	admitted, refused atomic.Int64
}

func (s *quotaServer) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.mu.Lock()
	now := time.Now()
	if now.Before(s.next) {
		wait := s.next.Sub(now)
		s.mu.Unlock()
		s.refused.Add(1)
		st, _ := status.New(codes.ResourceExhausted, "over quota").WithDetails(
			&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
		return nil, st.Err()
	}
	s.next = now.Add(s.every)
	s.mu.Unlock()
	s.admitted.Add(1)
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// PacingClients are the clients measured: name and rateLimit block (nil:
// none).
var PacingClients = []struct {
	Name  string
	Block *serviceconfig.ClientRateLimit
}{
	{"retry (no rateLimit)", nil},
	{"rateLimit pacing", &serviceconfig.ClientRateLimit{}},
	{"rateLimit maxWait 0.5s", &serviceconfig.ClientRateLimit{MaxWait: 500 * time.Millisecond}},
}

// RunPacing runs one client of PacingClients (by index) against a fresh
// server.
func RunPacing(ctx context.Context, cfg PacingConfig, client int) (PacingResult, error) {
	pc := PacingClients[client]
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return PacingResult{}, err
	}
	srv := &quotaServer{every: cfg.Period}
	gs := grpc.NewServer()
	echov1.RegisterEchoServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()

	c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
		RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 3, InitialBackoff: 10 * time.Millisecond,
			MaxBackoff: 100 * time.Millisecond, BackoffMultiplier: 2, RetryableStatusCodes: []codes.Code{codes.ResourceExhausted}},
		RateLimit: pc.Block,
	}), interceptor.WithRetryBudget(nil))
	if err != nil {
		return PacingResult{}, err
	}
	conn, err := grpc.NewClient(lis.Addr().String(), append(c.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return PacingResult{}, err
	}
	defer conn.Close()
	stub := echov1.NewEchoServiceClient(conn)
	// Warm the connection outside the measurement, then start afresh.
	_, _ = stub.Lookup(ctx, &echov1.LookupRequest{})

	res := PacingResult{Client: pc.Name, Periods: float64(cfg.Duration) / float64(cfg.Period)}
	var calls, ok, local atomic.Int64
	end := time.Now().Add(cfg.Duration)
	var wg sync.WaitGroup
	for range cfg.Callers {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := stub.Echo(cctx, &echov1.EchoRequest{})
				cancel()
				calls.Add(1)
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, interceptor.ErrRateLimited):
					local.Add(1)
				}
				time.Sleep(cfg.Think)
			}
		})
	}
	wg.Wait()
	res.Calls, res.OK, res.Local = calls.Load(), ok.Load(), local.Load()
	res.Admitted, res.Refused = srv.admitted.Load(), srv.refused.Load()
	return res, nil
}
