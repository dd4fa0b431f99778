package overload

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// tenantKey names a call's tenant in the fairness scenario.
const tenantKey = "x-tenant-id"

// FairnessResult is one fairness run: tenant B at half its fair share
// beside tenant A at 10 times its share, the server's capacity shared by
// the two.
type FairnessResult struct {
	// Fair reports whether the server's limit had tenantFairness.
	Fair bool
	// BSuccess is the share of B's calls that succeeded under A's flood;
	// BIdleP99 and BP99 the p99 latency of B's successful calls alone and
	// under the flood.
	BSuccess       float64
	BIdleP99, BP99 time.Duration
	// AGoodput is A's successful calls as a share of the capacity.
	AGoodput float64
}

// fairFor and fairIdle are the fairness run's phases: B alone, then A and
// B (B measured after the first second of it).
const (
	fairIdle = 2 * time.Second
	fairFor  = 4 * time.Second
)

// RunFairness runs B alone at a quarter of the capacity (half its fair
// share of two), then A at five times the capacity (10 times its share)
// beside it, against grpc-resilience's limit with tenantFairness (fair)
// or without.
func RunFairness(cfg Config, fair bool) (FairnessResult, error) {
	cfg = cfg.withDefaults()
	limits := ourLimits()
	if fair {
		limits.Config.TenantFairness = &serviceconfig.TenantFairness{MetadataKey: tenantKey}
	}
	s, err := server.New(server.WithLimits(limits))
	if err != nil {
		return FairnessResult{}, err
	}
	srv, err := serve(newCapacityServer(cfg.Tokens, cfg.Service), grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor()))
	if err != nil {
		return FairnessResult{}, err
	}
	defer srv.stop()
	cc, err := srv.dial()
	if err != nil {
		return FairnessResult{}, err
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)
	capacity := cfg.capacity()
	var rec recorder
	call := func(tenant string, class int) func(int, time.Duration) {
		return func(_ int, start time.Duration) {
			ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, tenantKey, tenant)
			began := time.Now()
			_, err := client.Echo(ctx, &echov1.EchoRequest{})
			took := time.Since(began)
			rec.add(outcome{start: start, took: took, code: status.Code(err), class: class, ok: err == nil && took <= cfg.Deadline})
		}
	}
	t0 := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		openLoop(t0, []phase{{0, fairIdle}, {5 * capacity, fairFor}}, call("a", 0))
	}()
	openLoop(t0, []phase{{capacity / 4, fairIdle + fairFor}}, call("b", 1))
	<-done
	out := rec.all()
	_, idle := good(pick(out, 1, 0, fairIdle))
	b := pick(out, 1, fairIdle+time.Second, fairIdle+fairFor)
	_, loaded := good(b)
	nA, _ := good(pick(out, 0, fairIdle+time.Second, fairIdle+fairFor))
	return FairnessResult{
		Fair: fair, BSuccess: success(b), BIdleP99: quantile(idle, 0.99), BP99: quantile(loaded, 0.99),
		AGoodput: float64(nA) / (capacity * (fairFor - time.Second).Seconds()),
	}, nil
}
