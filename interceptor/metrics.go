package interceptor

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc/codes"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

// The client's metrics, recorded through the OpenTelemetry metric API when
// WithMeterProvider is given (and not at all otherwise). Every instrument
// carries rpc.method, the full method.
const (
	// metricAttempts counts attempts by rpc.grpc.status_code.
	metricAttempts = "resilience.client.attempts"
	// metricRetries counts retries scheduled (after their decision, before
	// their wait).
	metricRetries = "resilience.client.retries"
	// metricStops counts calls that ended without success under a retry
	// policy, by resilience.stop_reason: why retrying stopped (exhausted,
	// non_retryable, deadline, pushback, cancelled, committed, throttled,
	// budget, circuit_open, bulkhead_full, no_retry).
	metricStops = "resilience.client.stops"
	// metricStateChanges counts breaker state changes by
	// resilience.breaker.from and resilience.breaker.to.
	metricStateChanges = "resilience.client.breaker.state_changes"
	// metricBudget is the number of retries the retry budget would grant
	// now (an observable gauge, without rpc.method).
	metricBudget = "resilience.client.retry_budget.available"
)

// Attribute keys of the client's metrics.
var (
	attrMethod     = attribute.Key("rpc.method")
	attrStatusCode = attribute.Key("rpc.grpc.status_code")
	attrStopReason = attribute.Key("resilience.stop_reason")
	attrFrom       = attribute.Key("resilience.breaker.from")
	attrTo         = attribute.Key("resilience.breaker.to")
)

// WithMeterProvider records the client's metrics with mp: attempts by
// status code, retries, calls that stopped retrying by reason, breaker
// state changes, and the retry budget's balance. The success path records
// with attribute sets built once per method, so it allocates nothing.
func WithMeterProvider(mp metric.MeterProvider) ClientOption {
	return clientOptionFunc(func(o *clientOptions) {
		if mp == nil {
			o.errorf("WithMeterProvider: nil provider")
			return
		}
		o.meterProvider = mp
	})
}

// instruments are a client's metric instruments; the zero value records
// nothing.
type instruments struct {
	on           bool
	attempts     metric.Int64Counter
	retries      metric.Int64Counter
	stops        metric.Int64Counter
	stateChanges metric.Int64Counter
}

func newInstruments(mp metric.MeterProvider, c *Client) (instruments, error) {
	if mp == nil {
		return instruments{}, nil
	}
	m := mp.Meter("github.com/grpc-resilience/resilience/interceptor")
	var in instruments
	var err error
	if in.attempts, err = m.Int64Counter(metricAttempts, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts of client calls, by method and status code.")); err != nil {
		return in, err
	}
	if in.retries, err = m.Int64Counter(metricRetries, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries scheduled by the client.")); err != nil {
		return in, err
	}
	if in.stops, err = m.Int64Counter(metricStops, metric.WithUnit("{call}"),
		metric.WithDescription("Calls that ended without success under a retry policy, by why retrying stopped.")); err != nil {
		return in, err
	}
	if in.stateChanges, err = m.Int64Counter(metricStateChanges, metric.WithUnit("{change}"),
		metric.WithDescription("Circuit breaker state changes.")); err != nil {
		return in, err
	}
	_, err = m.Float64ObservableGauge(metricBudget, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries the client's retry budget would grant now."),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			if b := c.state.Load().storm.budget; b != nil {
				o.Observe(b.Available(time.Now()))
			}
			return nil
		}))
	if err != nil {
		return in, err
	}
	in.on = true
	return in, nil
}

// methodMetrics are the attribute sets of one method, built once.
type methodMetrics struct {
	method attribute.KeyValue
	ok     []metric.AddOption // rpc.method and status code OK
	plain  []metric.AddOption // rpc.method
}

func newMethodMetrics(fullMethod string) methodMetrics {
	m := attribute.String(string(attrMethod), fullMethod)
	return methodMetrics{
		method: m,
		ok:     []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(m, attrStatusCode.Int(int(codes.OK))))},
		plain:  []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(m))},
	}
}

// attempt records an attempt that ended with err.
func (in *instruments) attempt(ctx context.Context, mm *methodMetrics, err error) {
	if !in.on {
		return
	}
	if err == nil {
		in.attempts.Add(ctx, 1, mm.ok...)
		return
	}
	code := rescodes.Classify(err)
	in.attempts.Add(ctx, 1, metric.WithAttributes(mm.method, attrStatusCode.Int(int(code))))
}

func (in *instruments) retry(ctx context.Context, mm *methodMetrics) {
	if in.on {
		in.retries.Add(ctx, 1, mm.plain...)
	}
}

func (in *instruments) stop(ctx context.Context, mm *methodMetrics, reason StopReason) {
	if in.on {
		in.stops.Add(ctx, 1, metric.WithAttributes(mm.method, attrStopReason.String(reason.token())))
	}
}

func (in *instruments) stateChange(fullMethod string, from, to BreakerState) {
	if in.on {
		in.stateChanges.Add(context.Background(), 1, metric.WithAttributes(
			attrMethod.String(fullMethod), attrFrom.String(from.String()), attrTo.String(to.String())))
	}
}
