package serviceconfig

import (
	"encoding/json"
	"time"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

var (
	_ json.Marshaler   = Config{}
	_ json.Unmarshaler = (*Config)(nil)
)

// MarshalJSON writes c as a service-config document: gRFC A6's fields with
// their A6 names, our extension blocks beside them, durations in protobuf
// JSON form ("0.5s"), status codes as upper-case names, absent and zero
// fields left out. Parse reads the result back to a Config equal to c when c
// came from Parse (with the same ParseOptions).
//
// A Config written in Go may leave policy fields zero to mean their
// defaults; those are written as the values they mean (maxAttempts 3,
// initialBackoff "0.1s", maxBackoff "5s", backoffMultiplier 2), since a
// document must spell them out. MarshalJSON returns an error when c fails
// Validate, or when a retry policy has no document form: MaxAttempts 1, or
// empty RetryableStatusCodes (the default rules cannot be written as a list).
func (c Config) MarshalJSON() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	out := jsonConfig{
		LoadBalancingPolicy: c.LoadBalancingPolicy,
		LoadBalancingConfig: c.LoadBalancingConfig,
	}
	for i := range c.MethodConfig {
		m, err := newJSONMethod(&c.MethodConfig[i])
		if err != nil {
			return nil, prefix(index("methodConfig", i), err)
		}
		out.MethodConfig = append(out.MethodConfig, m)
	}
	if t := c.RetryThrottling; t != nil {
		out.RetryThrottling = &jsonThrottling{MaxTokens: t.MaxTokens, TokenRatio: t.TokenRatio}
	}
	if h := c.HealthCheckConfig; h != nil {
		out.HealthCheckConfig = &jsonHealthCheck{ServiceName: h.ServiceName}
	}
	if b := c.RetryBudget; b != nil {
		out.RetryBudget = &jsonBudget{TTL: jsonDuration(b.TTL)}
		if b.Ratio != 0 || b.Zero {
			out.RetryBudget.Ratio = &b.Ratio
		}
		if b.MinRetriesPerSecond != 0 || b.Zero {
			out.RetryBudget.MinRetriesPerSecond = &b.MinRetriesPerSecond
		}
	}
	return json.Marshal(out)
}

// UnmarshalJSON parses data with Parse and the default options, so that a
// Config inside a larger JSON document reads as a service config.
func (c *Config) UnmarshalJSON(data []byte) error {
	p, err := Parse(data)
	if err != nil {
		return err
	}
	*c = *p
	return nil
}

func newJSONMethod(mc *MethodConfig) (jsonMethod, error) {
	m := jsonMethod{
		Name:                    mc.Name,
		WaitForReady:            mc.WaitForReady,
		Timeout:                 jsonDuration(mc.Timeout),
		MaxRequestMessageBytes:  mc.MaxRequestMessageBytes,
		MaxResponseMessageBytes: mc.MaxResponseMessageBytes,
	}
	if m.Name == nil {
		m.Name = []Name{}
	}
	if p := mc.RetryPolicy; p != nil {
		switch {
		case p.MaxAttempts == 1:
			return m, newError("retryPolicy.maxAttempts", "1 (no retry) has no document form: drop the retryPolicy")
		case len(p.RetryableStatusCodes) == 0:
			return m, newError("retryPolicy.retryableStatusCodes", "empty (the default rules) has no document form: list the codes")
		}
		m.RetryPolicy = &jsonRetry{
			MaxAttempts:           orDefault(p.MaxAttempts, DefaultMaxAttempts),
			InitialBackoff:        jsonDuration(orDefault(p.InitialBackoff, DefaultInitialBackoff)),
			MaxBackoff:            jsonDuration(orDefault(p.MaxBackoff, DefaultMaxBackoff)),
			BackoffMultiplier:     orDefault(p.BackoffMultiplier, DefaultBackoffMultiplier),
			RetryableStatusCodes:  rescodes.Of(p.RetryableStatusCodes...),
			PerAttemptRecvTimeout: jsonDuration(p.PerAttemptRecvTimeout),
			Jitter:                p.Jitter,
		}
	}
	if p := mc.HedgingPolicy; p != nil {
		m.HedgingPolicy = &jsonHedging{
			MaxAttempts:         p.MaxAttempts,
			HedgingDelay:        jsonDuration(p.HedgingDelay),
			NonFatalStatusCodes: rescodes.Of(p.NonFatalStatusCodes...),

			HedgingDelayQuantile:   p.HedgingDelayQuantile,
			HedgingDelayFloor:      jsonDuration(p.HedgingDelayFloor),
			HedgingDelayMinSamples: p.HedgingDelayMinSamples,
		}
	}
	if b := mc.CircuitBreaker; b != nil {
		m.CircuitBreaker = &jsonBreaker{
			Mode:                  b.Mode,
			K:                     b.K,
			ConsecutiveFailures:   b.ConsecutiveFailures,
			FailureRateThreshold:  b.FailureRateThreshold,
			SlowCallDuration:      jsonDuration(b.SlowCallDuration),
			SlowCallRateThreshold: b.SlowCallRateThreshold,
			MinimumCalls:          b.MinimumCalls,
			Window:                jsonDuration(b.Window),
			OpenDuration:          jsonDuration(b.OpenDuration),
			MaxOpenDuration:       jsonDuration(b.MaxOpenDuration),
			HalfOpenProbes:        b.HalfOpenProbes,
			FailureStatusCodes:    rescodes.Of(b.FailureStatusCodes...),
		}
	}
	if b := mc.Bulkhead; b != nil {
		m.Bulkhead = &jsonBulkhead{
			MaxConcurrent: b.MaxConcurrent,
			MaxQueue:      b.MaxQueue,
			MaxQueueWait:  jsonDuration(b.MaxQueueWait),
		}
	}
	if r := mc.RateLimit; r != nil {
		m.RateLimit = &jsonClientRateLimit{Rate: r.Rate, Per: jsonDuration(r.Per), Burst: r.Burst, MaxWait: jsonDuration(r.MaxWait)}
	}
	return m, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// jsonDuration writes a time.Duration in protobuf JSON form.
type jsonDuration time.Duration

func (d jsonDuration) MarshalJSON() ([]byte, error) {
	return json.Marshal(formatDuration(time.Duration(d)))
}

// The output types: the document MarshalJSON writes, field order as in
// gRFC A6, then our blocks.

type jsonConfig struct {
	LoadBalancingPolicy string           `json:"loadBalancingPolicy,omitempty"`
	LoadBalancingConfig json.RawMessage  `json:"loadBalancingConfig,omitempty"`
	MethodConfig        []jsonMethod     `json:"methodConfig,omitempty"`
	RetryThrottling     *jsonThrottling  `json:"retryThrottling,omitempty"`
	HealthCheckConfig   *jsonHealthCheck `json:"healthCheckConfig,omitempty"`
	RetryBudget         *jsonBudget      `json:"retryBudget,omitempty"`
}

type jsonMethod struct {
	Name                    []Name               `json:"name"`
	WaitForReady            *bool                `json:"waitForReady,omitempty"`
	Timeout                 jsonDuration         `json:"timeout,omitempty"`
	MaxRequestMessageBytes  *int64               `json:"maxRequestMessageBytes,omitempty"`
	MaxResponseMessageBytes *int64               `json:"maxResponseMessageBytes,omitempty"`
	RetryPolicy             *jsonRetry           `json:"retryPolicy,omitempty"`
	HedgingPolicy           *jsonHedging         `json:"hedgingPolicy,omitempty"`
	CircuitBreaker          *jsonBreaker         `json:"circuitBreaker,omitempty"`
	Bulkhead                *jsonBulkhead        `json:"bulkhead,omitempty"`
	RateLimit               *jsonClientRateLimit `json:"rateLimit,omitempty"`
}

type jsonRetry struct {
	MaxAttempts           int          `json:"maxAttempts"`
	InitialBackoff        jsonDuration `json:"initialBackoff"`
	MaxBackoff            jsonDuration `json:"maxBackoff"`
	BackoffMultiplier     float64      `json:"backoffMultiplier"`
	RetryableStatusCodes  rescodes.Set `json:"retryableStatusCodes"`
	PerAttemptRecvTimeout jsonDuration `json:"perAttemptRecvTimeout,omitempty"`
	Jitter                Jitter       `json:"jitter,omitempty"`
}

type jsonHedging struct {
	MaxAttempts         int          `json:"maxAttempts"`
	HedgingDelay        jsonDuration `json:"hedgingDelay,omitempty"`
	NonFatalStatusCodes rescodes.Set `json:"nonFatalStatusCodes,omitempty"`

	HedgingDelayQuantile   float64      `json:"hedgingDelayQuantile,omitempty"`
	HedgingDelayFloor      jsonDuration `json:"hedgingDelayFloor,omitempty"`
	HedgingDelayMinSamples int          `json:"hedgingDelayMinSamples,omitempty"`
}

type jsonThrottling struct {
	MaxTokens  float64 `json:"maxTokens"`
	TokenRatio float64 `json:"tokenRatio"`
}

type jsonHealthCheck struct {
	ServiceName string `json:"serviceName,omitempty"`
}

type jsonBudget struct {
	// Ratio and MinRetriesPerSecond are written when set, and as 0 for a
	// zero budget (RetryBudget.Zero).
	Ratio               *float64     `json:"ratio,omitempty"`
	MinRetriesPerSecond *float64     `json:"minRetriesPerSecond,omitempty"`
	TTL                 jsonDuration `json:"ttl,omitempty"`
}

type jsonBreaker struct {
	Mode                  string       `json:"mode,omitempty"`
	K                     float64      `json:"k,omitempty"`
	ConsecutiveFailures   int          `json:"consecutiveFailures,omitempty"`
	FailureRateThreshold  float64      `json:"failureRateThreshold,omitempty"`
	SlowCallDuration      jsonDuration `json:"slowCallDuration,omitempty"`
	SlowCallRateThreshold float64      `json:"slowCallRateThreshold,omitempty"`
	MinimumCalls          int          `json:"minimumCalls,omitempty"`
	Window                jsonDuration `json:"window,omitempty"`
	OpenDuration          jsonDuration `json:"openDuration,omitempty"`
	MaxOpenDuration       jsonDuration `json:"maxOpenDuration,omitempty"`
	HalfOpenProbes        int          `json:"halfOpenProbes,omitempty"`
	FailureStatusCodes    rescodes.Set `json:"failureStatusCodes,omitempty"`
}

type jsonBulkhead struct {
	MaxConcurrent int          `json:"maxConcurrent"`
	MaxQueue      int          `json:"maxQueue,omitempty"`
	MaxQueueWait  jsonDuration `json:"maxQueueWait,omitempty"`
}
