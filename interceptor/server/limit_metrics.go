package server

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/grpc-resilience/resilience/interceptor/internal/telemetry"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	"github.com/grpc-resilience/resilience/internal/limit"
)

// The metrics of the server's overload protection (WithLimits: the limits
// of Limits.Config, Limits.CPU), recorded through
// WithMeterProvider's meter.
const (
	// metricSrvLimitCurrent is each limiter's current limit, by
	// resilience.limiter; for the CPU shedder, its bandwidth-delay product
	// (0 before it measured one).
	metricSrvLimitCurrent = "resilience.server.limit.current"
	// metricSrvLimitInFlight is the calls admitted and running under each
	// limiter, by resilience.limiter.
	metricSrvLimitInFlight = "resilience.server.limit.in_flight"
	// metricSrvLimitQueued is the calls waiting in each limiter's queue,
	// by resilience.limiter.
	metricSrvLimitQueued = "resilience.server.limit.queued"
	// metricSrvLimitAdmitted counts the calls admitted under a limiter or
	// the CPU shedder, by grpc.method and resilience.criticality; a call
	// admitted from the queue counts once, when admitted.
	metricSrvLimitAdmitted = "resilience.server.limit.admitted"
	// metricSrvLimitShed counts the calls shed, by grpc.method,
	// resilience.criticality and resilience.reason (limit, queue_timeout,
	// deadline, cpu).
	metricSrvLimitShed = "resilience.server.limit.shed"
	// metricSrvLimitQueueWait is the time calls spent in a limiter's
	// queue, admitted or not, in seconds, by grpc.method.
	metricSrvLimitQueueWait = "resilience.server.limit.queue.duration"
)

var (
	attrLimiter     = attribute.Key("resilience.limiter")
	attrCriticality = attribute.Key("resilience.criticality")
)

// shedReason is why the overload protection shed a call, as
// resilience.reason names it.
type shedReason uint8

const (
	// shedOverLimit: over the criticality's share of the limit, with no
	// room in the queue (or no queue).
	shedOverLimit shedReason = iota
	// shedQueueTimeout: waited in the queue and got no slot: MaxQueueWait
	// passed, the deadline came within the base RTT, or the caller left.
	shedQueueTimeout
	// shedDeadline: rejected at the door, its remaining deadline shorter
	// than the base RTT (DEADLINE_EXCEEDED).
	shedDeadline
	// shedCPU: shed by the CPU-aware shedder.
	shedCPU
	numShedReasons
)

var shedReasonTokens = [numShedReasons]string{"limit", "queue_timeout", "deadline", "cpu"}

// limiterMetricName is the resilience.limiter value of a limiter named
// name in srvLimits.all: "server" for the server's, else the full method
// without its leading slash or the service.
func limiterMetricName(name string) string {
	if name == "" {
		return "server"
	}
	return strings.TrimPrefix(name, "/")
}

// srvLimitMetrics are the instruments of the overload protection; the zero
// value records nothing.
type srvLimitMetrics struct {
	on        bool
	gauges    metric.Registration // the gauges' callback; nil when off. Server.Close unregisters it
	admitted  metric.Int64Counter
	shed      metric.Int64Counter
	queueWait metric.Float64Histogram

	methods methodSets[srvLimitSets] // attribute sets by full method
}

// srvLimitSets are the attribute sets of one method, built once.
type srvLimitSets struct {
	admitted [limit.NumCriticalities][]metric.AddOption
	shed     [numShedReasons][limit.NumCriticalities][]metric.AddOption
	wait     []metric.RecordOption
}

// newSrvLimitMetrics builds the instruments of ls with mp (nil: off) and
// registers the gauges, which read ls at each collection, until
// Server.Close unregisters them.
func newSrvLimitMetrics(mp metric.MeterProvider, ls *srvLimits) (*srvLimitMetrics, error) {
	m := &srvLimitMetrics{}
	if mp == nil {
		return m, nil
	}
	mk := instrumentMaker{meter: mp.Meter(telemetry.MeterName)}
	m.admitted = mk.counter(metricSrvLimitAdmitted, "{call}", "Calls admitted by the server's concurrency limit or CPU shedder.")
	m.shed = mk.counter(metricSrvLimitShed, "{call}", "Calls shed by the server's overload protection, by reason and criticality.")
	m.queueWait = mk.seconds(metricSrvLimitQueueWait, "Time calls waited in a concurrency limit's queue, admitted or not.")
	var err error
	if m.gauges, err = registerLimitGauges(&mk, ls); err != nil {
		return nil, err
	}
	m.methods.build = newSrvLimitSets
	m.on = true
	return m, nil
}

// registerLimitGauges registers the gauges of the current limit, the calls
// in flight and the calls queued of each limiter of ls, with attribute
// sets built here, once, and returns the callback's registration.
func registerLimitGauges(mk *instrumentMaker, ls *srvLimits) (metric.Registration, error) {
	current := mk.gauge(metricSrvLimitCurrent, "{call}", "Current concurrency limit of each limiter; the CPU shedder's bandwidth-delay product.")
	inFlight := mk.gauge(metricSrvLimitInFlight, "{call}", "Calls admitted and running under each limiter.")
	queued := mk.gauge(metricSrvLimitQueued, "{call}", "Calls waiting in each limiter's queue.")
	if mk.err != nil {
		return nil, mk.err
	}
	// sets follows ls.statuses: the CPU shedder's first, when there is one.
	sets := make([]metric.ObserveOption, 0, len(ls.all)+1)
	if ls.cpu != nil {
		sets = append(sets, metric.WithAttributeSet(attribute.NewSet(attrLimiter.String("cpu"))))
	}
	for _, nl := range ls.all {
		sets = append(sets, metric.WithAttributeSet(attribute.NewSet(attrLimiter.String(limiterMetricName(nl.name)))))
	}
	return mk.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for i, st := range ls.statuses(ls.clk.Now()) {
			o.ObserveInt64(current, int64(st.Limit), sets[i])
			o.ObserveInt64(inFlight, int64(st.InFlight), sets[i])
			if st.Name != CPUSheddingName { // the CPU shedder has no queue
				o.ObserveInt64(queued, int64(st.Queued), sets[i])
			}
		}
		return nil
	}, current, inFlight, queued)
}

// sets returns the attribute sets of fullMethod, building them on its first
// call. The fast path is one map read.
func (m *srvLimitMetrics) sets(fullMethod string) *srvLimitSets {
	return m.methods.get(fullMethod)
}

func newSrvLimitSets(fullMethod string) *srvLimitSets {
	meth := telemetry.AttrMethod.String(strings.TrimPrefix(fullMethod, "/"))
	s := &srvLimitSets{wait: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(meth))}}
	for c := range limit.NumCriticalities {
		crit := attrCriticality.String(wire.Criticality(c).String())
		s.admitted[c] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(meth, crit))}
		for r, tok := range shedReasonTokens {
			s.shed[r][c] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(meth, crit, telemetry.AttrReason.String(tok)))}
		}
	}
	return s
}

// admit records a call of criticality c admitted.
func (m *srvLimitMetrics) admit(ctx context.Context, fullMethod string, c wire.Criticality) {
	if m.on {
		m.admitted.Add(ctx, 1, m.sets(fullMethod).admitted[c&3]...)
	}
}

// shedCall records a call of criticality c shed for reason r.
func (m *srvLimitMetrics) shedCall(ctx context.Context, fullMethod string, c wire.Criticality, r shedReason) {
	if m.on {
		m.shed.Add(ctx, 1, m.sets(fullMethod).shed[r][c&3]...)
	}
}

// waited records a call's time in a queue.
func (m *srvLimitMetrics) waited(ctx context.Context, fullMethod string, d time.Duration) {
	if m.on {
		m.queueWait.Record(ctx, d.Seconds(), m.sets(fullMethod).wait...)
	}
}
