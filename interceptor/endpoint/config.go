package endpoint

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/codes"
	grpcsc "google.golang.org/grpc/serviceconfig"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/internal/outlier"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// defaultFailures are the codes that count as an endpoint's failure when
// the policy lists none (see serviceconfig.EndpointPolicy): not UNKNOWN,
// which is what a handler's plain error becomes, an answer a caller can
// provoke.
const defaultFailures = rescodes.Set(1<<codes.Unavailable | 1<<codes.Internal | 1<<codes.DataLoss)

// mode is the order of picks among the endpoints (the child policy).
type mode uint8

const (
	rotate  mode = iota // round_robin
	ordered             // pick_first: the resolver's order
	p2c                 // peak_ewma: the better of two random endpoints by latency
)

var modeNames = [...]string{"round_robin", "pick_first", "peak_ewma"}

func (m mode) String() string { return modeNames[m] }

// lbConfig is the policy's parsed configuration, as grpc hands it back.
type lbConfig struct {
	grpcsc.LoadBalancingConfig
	mode  mode
	decay time.Duration // peak_ewma's τ
	// concurrency is peak_ewma's endpointConcurrency, and perAttempt the
	// share of its latency that each attempt outstanding adds to an
	// endpoint's cost: 1 / concurrency.
	concurrency int
	perAttempt  float64
	outlier     outlier.Config
	failures    rescodes.Set
}

// newConfig normalizes p, which is valid.
func newConfig(p *serviceconfig.EndpointPolicy) *lbConfig {
	c := &lbConfig{failures: defaultFailures, decay: orDuration(p.DecayTime, serviceconfig.DefaultPeakEWMADecayTime)}
	switch p.ChildPolicy {
	case "pick_first":
		c.mode = ordered
	case "peak_ewma":
		c.mode = p2c
	}
	c.concurrency = p.EndpointConcurrency
	if c.concurrency == 0 {
		c.concurrency = serviceconfig.DefaultPeakEWMAEndpointConcurrency
	}
	c.perAttempt = 1 / float64(c.concurrency)
	if len(p.FailureStatusCodes) > 0 {
		c.failures = rescodes.Of(p.FailureStatusCodes...)
	}
	o := outlier.Config{
		ConsecutiveFailures:      p.ConsecutiveFailures,
		ConsecutiveLocalFailures: p.ConsecutiveLocalOriginFailures,
		MinimumCalls:             serviceconfig.DefaultFailurePercentageVolume,
		Window:                   serviceconfig.DefaultFailurePercentageWindow,
		BaseEjectionTime:         orDuration(p.BaseEjectionTime, serviceconfig.DefaultEndpointBaseEjectionTime),
		MaxEjectionTime:          orDuration(p.MaxEjectionTime, serviceconfig.DefaultEndpointMaxEjectionTime),
		MaxEjectionPercent:       serviceconfig.DefaultEndpointMaxEjectionPercent,
	}
	if p.MaxEjectionPercent != nil {
		o.MaxEjectionPercent = *p.MaxEjectionPercent // an explicit 0 ejects nothing
	}
	switch {
	case o.ConsecutiveFailures == -1:
		o.ConsecutiveFailures = 0
	case o.ConsecutiveFailures == 0 && p.FailurePercentage == nil:
		o.ConsecutiveFailures = serviceconfig.DefaultEndpointConsecutiveFailures
	}
	switch o.ConsecutiveLocalFailures {
	case -1:
		o.ConsecutiveLocalFailures = 0
	case 0:
		o.ConsecutiveLocalFailures = serviceconfig.DefaultEndpointConsecutiveLocalOriginFailures
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

// latencyUse says what an attempt's latency tells the peak_ewma estimate.
type latencyUse uint8

const (
	latencyNone   latencyUse = iota // nothing (no answer, or the caller cut it short)
	latencySample                   // a latency: the endpoint answered
	latencyPeak                     // an error answer: raise the estimate to it, never lower it
	latencyCut                      // cut short unanswered: raise the estimate to what such a latency is expected to be
)

// attemptEnd is what the policy knows of an attempt when grpc reports its
// end, besides grpc's DoneInfo.
type attemptEnd struct {
	// own: the attempt's deadline was the Client's per-attempt timeout, not
	// its caller's (package trail: Trail.OwnDeadline).
	own bool
	// timedOut: the Client's per-attempt timer ended the attempt (streams:
	// Trail.MarkTimedOut before it cancels).
	timedOut bool
	// ended: the Client ended the attempt's call while the attempt ran (a
	// hedged copy still running when another copy's outcome ended the
	// call: Trail.MarkEnded before it cancels).
	ended bool
}

// classify returns how the attempt that ended with di counts toward its
// endpoint's ejection, and what its latency says:
//
//   - nothing was sent (grpc abandoned the pick, or the client failed
//     before the stream existed, as per-RPC credentials do): nothing;
//   - success: a success, and a latency;
//   - RESOURCE_EXHAUSTED, or any status with a pushback: busy;
//   - the Client's own per-attempt timeout (DEADLINE_EXCEEDED with the
//     attempt's own deadline, or a stream's timer when the caller had
//     sent its whole request and nothing was received): a failure, and a
//     latency cut short (peakewma.Estimator.ObserveCut): the endpoint had
//     not answered in that time;
//   - CANCELLED as the Client ended the attempt's call (a hedged copy
//     still running when another copy's outcome, an answer or a fatal
//     status, ended the call): nothing, and a latency cut short, as above;
//   - nothing received and UNAVAILABLE: a local-origin failure (the
//     connection was refused or reset before any response);
//   - nothing received, another code: nothing (the client's own error,
//     e.g. a request that does not marshal, which a caller can send);
//   - a code in failures: a failure;
//   - the caller's cancellation or deadline: nothing;
//   - another code (an application's answer): nothing, and its time only
//     raises the latency estimate: a caller could provoke quick errors on a
//     slow endpoint, which must not make it look fast.
func classify(di balancer.DoneInfo, failures rescodes.Set, end attemptEnd) (outlier.Outcome, latencyUse) {
	if !di.BytesSent {
		return outlier.Ignored, latencyNone
	}
	if di.Err == nil {
		return outlier.Success, latencySample
	}
	if len(di.Trailer[pushbackKey]) > 0 {
		return outlier.Busy, latencyNone
	}
	switch c := status.Code(di.Err); {
	case c == codes.ResourceExhausted:
		return outlier.Busy, latencyNone
	case c == codes.DeadlineExceeded && end.own, c == codes.Canceled && end.timedOut && !di.BytesReceived:
		// A stream's timer counts only when the endpoint had sent nothing:
		// a stream commits on the caller's reads, so one that the caller
		// reads late is cut though its endpoint answered in time.
		return outlier.Failure, latencyCut
	case c == codes.Canceled && end.ended:
		// A hedged copy another copy's outcome outran: without this, an
		// endpoint slower than the hedging delay is never measured when
		// every call to it is hedged, and looks cheap to peak_ewma.
		return outlier.Ignored, latencyCut
	case !di.BytesReceived && c == codes.Unavailable:
		return outlier.LocalFailure, latencyNone
	case !di.BytesReceived:
		return outlier.Ignored, latencyNone
	case failures.Has(c):
		return outlier.Failure, latencyPeak
	case c == codes.Canceled || c == codes.DeadlineExceeded:
		return outlier.Ignored, latencyNone
	}
	return outlier.Ignored, latencyPeak
}

// pushbackKey is gRFC A6's server pushback trailer.
const pushbackKey = "grpc-retry-pushback-ms"
