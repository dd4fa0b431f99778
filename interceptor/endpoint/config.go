package endpoint

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcsc "google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/internal/outlier"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// defaultFailures are the codes that count as an endpoint's failure when
// the policy lists none (see serviceconfig.EndpointPolicy).
const defaultFailures = rescodes.Set(1<<codes.Unavailable | 1<<codes.Unknown | 1<<codes.Internal | 1<<codes.DataLoss)

// lbConfig is the policy's parsed configuration, as grpc hands it back.
type lbConfig struct {
	grpcsc.LoadBalancingConfig
	ordered  bool // pick_first: the resolver's order, not a rotation
	outlier  outlier.Config
	failures rescodes.Set
}

// newConfig normalizes p, which is valid.
func newConfig(p *serviceconfig.EndpointPolicy) *lbConfig {
	c := &lbConfig{ordered: p.ChildPolicy == "pick_first", failures: defaultFailures}
	if len(p.FailureStatusCodes) > 0 {
		c.failures = rescodes.Of(p.FailureStatusCodes...)
	}
	o := outlier.Config{
		ConsecutiveFailures: p.ConsecutiveFailures,
		MinimumCalls:        serviceconfig.DefaultFailurePercentageVolume,
		Window:              serviceconfig.DefaultFailurePercentageWindow,
		BaseEjectionTime:    orDuration(p.BaseEjectionTime, serviceconfig.DefaultEndpointBaseEjectionTime),
		MaxEjectionTime:     orDuration(p.MaxEjectionTime, serviceconfig.DefaultEndpointMaxEjectionTime),
		MaxEjectionPercent:  p.MaxEjectionPercent,
	}
	if o.MaxEjectionPercent == 0 {
		o.MaxEjectionPercent = serviceconfig.DefaultEndpointMaxEjectionPercent
	}
	switch {
	case o.ConsecutiveFailures == -1:
		o.ConsecutiveFailures = 0
	case o.ConsecutiveFailures == 0 && p.FailurePercentage == nil:
		o.ConsecutiveFailures = serviceconfig.DefaultEndpointConsecutiveFailures
	}
	if f := p.FailurePercentage; f != nil {
		o.FailureRate = float64(f.Threshold) / 100
		if f.RequestVolume > 0 {
			o.MinimumCalls = f.RequestVolume
		}
		o.Window = orDuration(f.Window, o.Window)
	}
	c.outlier = o
	return c
}

func orDuration(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// parseConfig reads the policy's JSON object (see
// serviceconfig.EndpointPolicy); errors name the path from the policy's
// name, e.g. "resilience_endpoint.maxEjectionPercent: ...".
func parseConfig(js json.RawMessage) (*lbConfig, error) {
	p, err := serviceconfig.ParseEndpointPolicy(js)
	if err != nil {
		if e, ok := err.(*serviceconfig.Error); ok && e.Path != "" {
			return nil, fmt.Errorf("%s.%s: %w", Name, e.Path, e.Err)
		}
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	return newConfig(p), nil
}

// outcome classifies how an attempt on an endpoint ended: busy when the
// server refused it for load (RESOURCE_EXHAUSTED, or any status with a
// pushback), a failure when its code is in failures, a success when it
// succeeded, and nothing otherwise (the caller's cancellation or deadline,
// an application's error). received says whether anything came back from
// the endpoint (balancer.DoneInfo.BytesReceived): without it, only
// UNAVAILABLE (the endpoint could not be reached, or its connection broke)
// is the endpoint's; another code is the client's own (grpc's INTERNAL for
// a request that does not marshal), which a caller chooses.
func outcome(err error, trailer metadata.MD, received bool, failures rescodes.Set) outlier.Outcome {
	if err == nil {
		return outlier.Success
	}
	if len(trailer[pushbackKey]) > 0 {
		return outlier.Busy
	}
	c := status.Code(err)
	switch {
	case c == codes.ResourceExhausted:
		return outlier.Busy
	case !received && c != codes.Unavailable:
		return outlier.Ignored
	case failures.Has(c):
		return outlier.Failure
	}
	return outlier.Ignored
}

// pushbackKey is gRFC A6's server pushback trailer.
const pushbackKey = "grpc-retry-pushback-ms"
