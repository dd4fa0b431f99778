package overload

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// CostResult is one run of the cost scenario: the expensive method (Echo,
// the capacity server's Tokens × Service) beside a cheap one (Lookup,
// answered at once) at 1% of the calls, under one server-wide limit, at a
// load below the capacity and at 3 times it.
type CostResult struct {
	Name string
	// Load is the load of the expensive method, in multiples of the
	// capacity.
	Load float64
	// Shed is the share of the expensive method's calls whose handler
	// never ran (refused by the protection, whatever the status, over the
	// whole run); Goodput its calls served within their deadline after the
	// first second, as a share of the capacity.
	Shed, Goodput float64
}

func (r CostResult) String() string {
	return fmt.Sprintf("%s at %.1f×: shed %.1f%%, goodput %.1f%%", r.Name, r.Load, 100*r.Shed, 100*r.Goodput)
}

// CostLoads are the loads of the cost scenario: below the capacity, where
// nothing should be shed, and at three times it.
var CostLoads = []float64{0.5, 0.9, 3}

const costFor, costSettle = 4 * time.Second, time.Second

// RunCost runs the cost scenario against the protection name (Failsafe or
// Ours) at load times the capacity, with one cheap call per 99 expensive
// ones, for 4s, the first second skipped.
func RunCost(cfg Config, name string, load float64) (CostResult, error) {
	cfg = cfg.withDefaults()
	prot, err := newProtection(name)
	if err != nil {
		return CostResult{}, err
	}
	impl := newCapacityServer(cfg.Tokens, cfg.Service) // Lookup: no delay, no token
	srv, err := serve(impl, grpc.ChainUnaryInterceptor(prot.icpt))
	if err != nil {
		return CostResult{}, err
	}
	defer srv.stop()
	cc, err := srv.dial()
	if err != nil {
		return CostResult{}, err
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)
	capacity := cfg.capacity()
	var rec recorder
	t0 := time.Now()
	openLoop(t0, []phase{{load * capacity * 100 / 99, costFor}}, func(i int, start time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
		defer cancel()
		if i%100 == 99 {
			_, _ = client.Lookup(ctx, &echov1.LookupRequest{})
			return
		}
		began := time.Now()
		_, err := client.Echo(ctx, &echov1.EchoRequest{})
		took := time.Since(began)
		rec.add(outcome{start: start, took: took, code: status.Code(err), ok: err == nil && took <= cfg.Deadline})
	})
	all := rec.all()
	n, _ := good(pick(all, -1, costSettle, costFor))
	// Shed: the expensive calls whose handler never ran, whatever status
	// the protection answered with.
	shed := 1 - float64(impl.calls.Load())/float64(max(len(all), 1))
	return CostResult{Name: name, Load: load, Shed: max(shed, 0),
		Goodput: float64(n) / (capacity * (costFor - costSettle).Seconds())}, nil
}
