package redisquota

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/grpc-resilience/resilience/interceptor/internal/telemetry"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
)

// The store's metrics, recorded through WithMeterProvider's meter, each by
// resilience.ratelimit (the limit's name: the document's names, so the
// label is bounded).
const (
	// metricLeases counts the round trips to Redis, by
	// resilience.ratelimit.outcome: granted, refused (no token fitted:
	// the key is saturated), failed (an error, Redis unreachable).
	metricLeases = "resilience.server.ratelimit.leases"
	// metricLeasedTokens counts the tokens leased.
	metricLeasedTokens = "resilience.server.ratelimit.leased_tokens"
	// metricLeaseDuration is the round trip's latency, in seconds.
	metricLeaseDuration = "resilience.server.ratelimit.lease.duration"
	// metricFallbacks counts the times a limit entered fallback (Redis
	// unreachable).
	metricFallbacks = "resilience.server.ratelimit.fallbacks"
	// metricInFallback is 1 while a limit is in fallback, else 0.
	metricInFallback = "resilience.server.ratelimit.in_fallback"
	// metricForfeited counts the leased tokens never spent.
	metricForfeited = "resilience.server.ratelimit.forfeited_tokens"
)

var (
	attrLimit   = attribute.Key("resilience.ratelimit")
	attrOutcome = attribute.Key("resilience.ratelimit.outcome")
)

const (
	outGranted = iota
	outRefused
	outFailed
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"granted", "refused", "failed"}

// metrics are the store's instruments; with no meter provider, they record
// nothing.
type metrics struct {
	on        bool
	leases    metric.Int64Counter
	tokens    metric.Int64Counter
	duration  metric.Float64Histogram
	fallbacks metric.Int64Counter
	reg       metric.Registration

	mu       sync.Mutex
	limiters []*Limiter // guarded by mu
}

// limitSets are one limit's attribute sets, built once.
type limitSets struct {
	limit   metric.MeasurementOption
	outcome [numOutcomes]metric.MeasurementOption
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := &metrics{}
	if mp == nil {
		return m, nil
	}
	meter := mp.Meter(telemetry.MeterName)
	var err error
	mk := func(f func() error) {
		if err == nil {
			err = f()
		}
	}
	mk(func() (e error) {
		m.leases, e = meter.Int64Counter(metricLeases, metric.WithUnit("{lease}"), metric.WithDescription("Round trips to Redis for rate-limit tokens."))
		return e
	})
	mk(func() (e error) {
		m.tokens, e = meter.Int64Counter(metricLeasedTokens, metric.WithUnit("{token}"), metric.WithDescription("Rate-limit tokens leased from Redis."))
		return e
	})
	mk(func() (e error) {
		m.duration, e = meter.Float64Histogram(metricLeaseDuration, metric.WithUnit("s"),
			metric.WithDescription("Latency of a lease of rate-limit tokens."), metric.WithExplicitBucketBoundaries(telemetry.A66LatencyBounds...))
		return e
	})
	mk(func() (e error) {
		m.fallbacks, e = meter.Int64Counter(metricFallbacks, metric.WithUnit("{transition}"), metric.WithDescription("Times a rate limit entered fallback: Redis unreachable."))
		return e
	})
	var forfeited metric.Int64ObservableCounter
	var gauge metric.Int64ObservableGauge
	mk(func() (e error) {
		gauge, e = meter.Int64ObservableGauge(metricInFallback, metric.WithUnit("1"), metric.WithDescription("1 while a rate limit is in fallback."))
		return e
	})
	mk(func() (e error) {
		forfeited, e = meter.Int64ObservableCounter(metricForfeited, metric.WithUnit("{token}"), metric.WithDescription("Leased rate-limit tokens never spent."))
		return e
	})
	if err != nil {
		return nil, err
	}
	m.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, l := range m.limiters {
			v := int64(0)
			if l.shared.InFallback() {
				v = 1
			}
			o.ObserveInt64(gauge, v, l.sets.limit)
			o.ObserveInt64(forfeited, l.shared.Forfeited(), l.sets.limit)
		}
		return nil
	}, gauge, forfeited)
	if err != nil {
		return nil, err
	}
	m.on = true
	return m, nil
}

func (m *metrics) sets(name string) limitSets {
	var s limitSets
	s.limit = metric.WithAttributeSet(attribute.NewSet(attrLimit.String(name)))
	for i, o := range outcomeNames {
		s.outcome[i] = metric.WithAttributeSet(attribute.NewSet(attrLimit.String(name), attrOutcome.String(o)))
	}
	return s
}

// watch adds l to the gauges' callback.
func (m *metrics) watch(l *Limiter) {
	m.mu.Lock()
	m.limiters = append(m.limiters, l)
	m.mu.Unlock()
}

// leased records a round trip of l's.
func (m *metrics) leased(ctx context.Context, l *Limiter, g ratelimit.Grant, err error, d time.Duration) {
	if !m.on {
		return
	}
	out := outGranted
	switch {
	case err != nil:
		out = outFailed
	case g.Tokens == 0:
		out = outRefused
	}
	m.leases.Add(ctx, 1, l.sets.outcome[out])
	if g.Tokens > 0 {
		m.tokens.Add(ctx, int64(g.Tokens), l.sets.limit)
	}
	m.duration.Record(ctx, d.Seconds(), l.sets.limit)
}

// fallback records l's entering fallback.
func (m *metrics) fallback(l *Limiter, entered bool) {
	if m.on && entered {
		m.fallbacks.Add(context.Background(), 1, l.sets.limit)
	}
}

func (m *metrics) close() error {
	if !m.on {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reg == nil {
		return nil
	}
	err := m.reg.Unregister()
	m.reg = nil
	return err
}
