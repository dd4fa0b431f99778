package ratelimit

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/ratelimit/redisquota"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The rate a Server enforces over real gRPC: Replicas server processes,
// each a grpc.Server on loopback TCP behind server.New with a per-tenant
// rate limit (Rate per second, Burst; local with one replica, shared
// through one redis-server with several), and this process as the client,
// offering tenant "a" Load × Rate, spread over the replicas by Shares,
// from goroutines that each keep their own schedule. The admitted calls
// are counted by the second in which they were sent; a call the server
// refused must be RESOURCE_EXHAUSTED, anything else is an error.
type GRPCConfig struct {
	Replicas int
	Shares   []float64
	Rate     float64
	Burst    int
	Load     float64
	Duration time.Duration
}

// DefaultGRPCLocal is one server process with a local limit of 1,000/s,
// offered 3× for 10 s.
func DefaultGRPCLocal() GRPCConfig {
	return GRPCConfig{Replicas: 1, Shares: []float64{1}, Rate: 1000, Burst: 100, Load: 3, Duration: 10 * time.Second}
}

// DefaultGRPCShared is 4 server processes sharing a per-tenant 1,000/s
// through Redis, offered 4×, 70/10/10/10, for 10 s.
func DefaultGRPCShared() GRPCConfig {
	return GRPCConfig{Replicas: 4, Shares: []float64{0.7, 0.1, 0.1, 0.1}, Rate: 1000, Burst: 100, Load: 4, Duration: 10 * time.Second}
}

// GRPCResult is one run's numbers.
type GRPCResult struct {
	// PerSec is the admitted calls by the second they were sent in.
	PerSec []int
	// Offered, Admitted and Refused count the calls sent, answered OK and
	// answered RESOURCE_EXHAUSTED; Errors any other answer.
	Offered, Admitted, Refused, Errors int
	// Ratio is Admitted over what the limit allows in the run: the burst
	// and the rate over the time the calls were sent in.
	Ratio float64
	// WorstSecond is the largest |admitted − rate| / rate over the seconds
	// after the first (which holds the burst).
	WorstSecond float64
	// OfferedRate is the offered calls per second, as sent.
	OfferedRate float64
}

// GRPCServerEnv names the environment variable that makes the benchmark
// command a server process of the gRPC measurement: its value is the JSON
// of a GRPCServerArgs.
const GRPCServerEnv = "RATELIMIT_BENCH_GRPC_SERVER"

// GRPCServerArgs is a server process's configuration.
type GRPCServerArgs struct {
	Rate   float64
	Burst  int
	Redis  string // "": a local limit
	Prefix string
}

type benchEcho struct {
	echov1.UnimplementedEchoServiceServer
}

func (benchEcho) Echo(context.Context, *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	return &echov1.EchoResponse{}, nil
}

// RunGRPCServer serves the echo service behind a Server with the limit of
// args on a loopback port, prints "addr HOST:PORT" on w, and serves until
// stdin ends.
func RunGRPCServer(args GRPCServerArgs, w io.Writer) error {
	limit := serviceconfig.RateLimit{Name: "per-tenant", Rate: args.Rate, Burst: args.Burst, Key: serviceconfig.KeyTenant}
	l := server.Limits{Config: serviceconfig.ServerConfig{RateLimits: []serviceconfig.RateLimit{limit}},
		Tenant: server.TenantFromMetadata("x-tenant")}
	if args.Redis != "" {
		rc := redis.NewClient(&redis.Options{Addr: args.Redis, MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
			ContextTimeoutEnabled: true, PoolSize: 16})
		defer rc.Close()
		q, err := redisquota.New(rc, redisquota.WithKeyPrefix(args.Prefix))
		if err != nil {
			return err
		}
		defer q.Close()
		l.Config.RateLimits[0].Distributed = true
		l.Quota = q
	}
	srv, err := server.New(server.WithLimits(l))
	if err != nil {
		return err
	}
	defer srv.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, benchEcho{})
	go func() { _ = gs.Serve(lis) }()
	fmt.Fprintf(w, "addr %s\n", lis.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	gs.Stop()
	return nil
}

// GRPC runs the measurement once, with self as the command to start for
// each server process (the benchmark command, which runs RunGRPCServer
// when GRPCServerEnv is set).
func GRPC(ctx context.Context, cfg GRPCConfig, self string) (GRPCResult, error) {
	args := GRPCServerArgs{Rate: cfg.Rate, Burst: cfg.Burst}
	if cfg.Replicas > 1 {
		rs, err := startRedis(0)
		if err != nil {
			return GRPCResult{}, err
		}
		defer rs.stop()
		args.Redis, args.Prefix = rs.addr, fmt.Sprintf("bench:%d:", time.Now().UnixNano())
	}
	js, err := json.Marshal(args)
	if err != nil {
		return GRPCResult{}, err
	}
	var clients []echov1.EchoServiceClient
	for range cfg.Replicas {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), GRPCServerEnv+"="+string(js))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return GRPCResult{}, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return GRPCResult{}, err
		}
		if err := cmd.Start(); err != nil {
			return GRPCResult{}, err
		}
		defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
		sc := bufio.NewScanner(out)
		if !sc.Scan() || !strings.HasPrefix(sc.Text(), "addr ") {
			return GRPCResult{}, fmt.Errorf("server process: no address (%v)", sc.Err())
		}
		cc, err := grpc.NewClient(strings.TrimPrefix(sc.Text(), "addr "), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return GRPCResult{}, err
		}
		defer cc.Close()
		cc.Connect()
		clients = append(clients, echov1.NewEchoServiceClient(cc))
	}
	// Warm the connections (a call of another tenant each: not counted).
	for _, c := range clients {
		wctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, "x-tenant", "warm"), 5*time.Second)
		_, err := c.Echo(wctx, &echov1.EchoRequest{})
		cancel()
		if err != nil {
			return GRPCResult{}, fmt.Errorf("warming up: %w", err)
		}
	}
	secs := int((cfg.Duration + time.Second - 1) / time.Second)
	perSec := make([]atomic.Int64, secs)
	var offered, admitted, refused, errs atomic.Int64
	start := time.Now().Add(100 * time.Millisecond)
	end := start.Add(cfg.Duration)
	tctx := metadata.AppendToOutgoingContext(ctx, "x-tenant", "a")
	const workers = 16 // per replica: each keeps its own schedule
	var wg sync.WaitGroup
	for i, c := range clients {
		rate := cfg.Load * cfg.Rate * cfg.Shares[i]
		interval := time.Duration(float64(time.Second) * workers / rate)
		for w := range workers {
			wg.Go(func() {
				next := start.Add(interval * time.Duration(w) / workers)
				for next.Before(end) {
					time.Sleep(time.Until(next))
					sent := time.Now()
					cctx, cancel := context.WithTimeout(tctx, time.Second)
					_, err := c.Echo(cctx, &echov1.EchoRequest{})
					cancel()
					offered.Add(1)
					switch status.Code(err) {
					case codes.OK:
						admitted.Add(1)
						if s := int(sent.Sub(start) / time.Second); s >= 0 && s < secs {
							perSec[s].Add(1)
						}
					case codes.ResourceExhausted:
						refused.Add(1)
					default:
						errs.Add(1)
					}
					next = next.Add(interval)
					if now := time.Now(); next.Before(now.Add(-interval)) { // fell behind: do not burst to catch up
						next = now
					}
				}
			})
		}
	}
	wg.Wait()
	r := GRPCResult{Offered: int(offered.Load()), Admitted: int(admitted.Load()), Refused: int(refused.Load()), Errors: int(errs.Load())}
	for s := range perSec {
		r.PerSec = append(r.PerSec, int(perSec[s].Load()))
	}
	r.Ratio = float64(r.Admitted) / (float64(cfg.Burst) + cfg.Rate*cfg.Duration.Seconds())
	r.OfferedRate = float64(r.Offered) / cfg.Duration.Seconds()
	var worst []float64
	for _, n := range r.PerSec[1:] {
		d := (float64(n) - cfg.Rate) / cfg.Rate
		worst = append(worst, max(d, -d))
	}
	r.WorstSecond = slices.Max(worst)
	return r, nil
}
