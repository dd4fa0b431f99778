package interceptor

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/telemetry"
	"github.com/grpc-resilience/resilience/interceptor/wire"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

// The client's metrics, recorded through the OpenTelemetry metric API when
// WithMeterProvider is given (and not at all otherwise). The table in
// doc.go lists them with their units and attributes.
//
// The grpc.client.call.* instruments are gRFC A96's, with its names, units
// and attributes (grpc.method and grpc.target as gRFC A66 defines them),
// recorded once per call that went through the retry or hedging loop. The
// others are this library's own, all under the prefix "resilience.".
const (
	// metricCallRetries is A96's: the retries of one call; not recorded
	// for a call without retries.
	metricCallRetries = "grpc.client.call.retries"
	// metricCallHedges is A96's: the hedged copies of one call beyond the
	// first; not recorded for a call without hedges.
	metricCallHedges = "grpc.client.call.hedges"
	// metricCallRetryDelay is A96's: the time of one call during which no
	// attempt was running, in seconds.
	metricCallRetryDelay = "grpc.client.call.retry_delay"

	// metricAttempts counts attempts by grpc.status.
	metricAttempts = "resilience.client.attempts"
	// metricRetries counts retries decided and hedged copies launched: a
	// retry once its OnRetry hook and span event have returned (one that
	// aborts ends the call with the retry unsent, uncounted), before its
	// backoff, so a retry that the caller's end, its deadline or a guard
	// then stops is counted unsent; resilience.client.attempts counts what
	// was sent.
	metricRetries = "resilience.client.retries"
	// metricStops counts calls that ended without success under a retry
	// policy, by resilience.stop_reason: why retrying stopped (exhausted,
	// non_retryable, deadline, pushback, cancelled, committed, throttled,
	// budget, circuit_open, bulkhead_full, no_retry, adaptive_throttle, rate_limited).
	metricStops = "resilience.client.stops"
	// metricRejections counts attempts refused locally, by
	// resilience.reason: circuit_open, bulkhead_full, adaptive_throttle or rate_limited.
	metricRejections = "resilience.client.rejections"
	// metricDenials counts retries and hedges not sent because the retry
	// budget or A6 throttling denied them, by resilience.reason: budget or
	// throttled.
	metricDenials = "resilience.client.retry.denials"
	// metricDeadlineSkips counts retries and hedges not sent because they
	// would not fit in the call's deadline.
	metricDeadlineSkips = "resilience.client.retry.deadline_skips"
	// metricReplays counts attempts whose answer the server marked as an
	// idempotency replay (wire.IdempotencyReplayedHeader).
	metricReplays = "resilience.client.idempotency.replays"
	// metricTransitions counts breaker state changes by
	// resilience.breaker.from and resilience.breaker.to.
	metricTransitions = "resilience.client.breaker.transitions"
	// metricBreakerState is the state of each breaker, as the number of
	// its BreakerState (an observable gauge).
	metricBreakerState = "resilience.client.breaker.state"
	// metricInFlight and metricQueued are the occupancy of each bulkhead
	// (observable gauges).
	metricInFlight = "resilience.client.bulkhead.in_flight"
	metricQueued   = "resilience.client.bulkhead.queued"
	// metricRejectProbability is the probability with which each
	// method's adaptive throttling rejects an attempt now (an observable
	// gauge).
	metricRejectProbability = "resilience.client.adaptive.reject_probability"
	// metricBudget is the number of retries the retry budget would grant
	// now (an observable gauge, without grpc.method).
	metricBudget = "resilience.client.retry_budget.available"
)

// meterName is the instrumentation scope of every instrument here.
const meterName = telemetry.MeterName

// Attribute keys of the metrics. grpc.method, grpc.target and grpc.status
// are gRFC A66's.
var (
	attrMethod     = telemetry.AttrMethod
	attrTarget     = attribute.Key("grpc.target")
	attrStatus     = attribute.Key("grpc.status")
	attrStopReason = attribute.Key("resilience.stop_reason")
	attrReason     = telemetry.AttrReason
	attrFrom       = attribute.Key("resilience.breaker.from")
	attrTo         = attribute.Key("resilience.breaker.to")
)

// a66LatencyBounds are gRFC A66's bucket boundaries for latencies, in
// seconds, used by A96's retry_delay.
var a66LatencyBounds = telemetry.A66LatencyBounds

// countBounds are the bucket boundaries of the per-call counts (retries,
// hedges): one bucket per count up to the default cap on attempts.
var countBounds = []float64{1, 2, 3, 4, 5}

// instruments are a client's metric instruments; the zero value records
// nothing.
type instruments struct {
	on bool
	// names maps the named methods (see WithMeterProvider) to their
	// attribute sets, built once per method; other is the sets of the
	// rest. names holds only the exact names of the config in force and
	// the methods generated stubs call: an update lets go the names only
	// an earlier config held (clientState.forget).
	names       *sync.Map // full method → *methodMetrics
	other       *methodMetrics
	retriesHist metric.Int64Histogram
	hedgesHist  metric.Int64Histogram
	delayHist   metric.Float64Histogram
	attempts    metric.Int64Counter
	retries     metric.Int64Counter
	stops       metric.Int64Counter
	rejections  metric.Int64Counter
	denials     metric.Int64Counter
	skips       metric.Int64Counter
	transitions metric.Int64Counter
	replays     metric.Int64Counter
	gauges      metric.Registration // the gauges' callback; Client.Close unregisters it
}

// newInstruments builds the client's instruments on mp; nil mp gives the
// zero instruments.
func newInstruments(mp metric.MeterProvider, c *Client) (instruments, error) {
	var in instruments
	if mp == nil {
		return in, nil
	}
	m := mp.Meter(meterName)
	var err error
	i64h := func(name, unit, desc string) metric.Int64Histogram {
		var h metric.Int64Histogram
		if err == nil {
			h, err = m.Int64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc),
				metric.WithExplicitBucketBoundaries(countBounds...))
		}
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		var ctr metric.Int64Counter
		if err == nil {
			ctr, err = m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		}
		return ctr
	}
	in.retriesHist = i64h(metricCallRetries, "{retry}", "Number of retries during the client call. If there were no retries, 0 is not reported.")
	in.hedgesHist = i64h(metricCallHedges, "{hedge}", "Number of hedges during the client call. If there were no hedges, 0 is not reported.")
	if err == nil {
		in.delayHist, err = m.Float64Histogram(metricCallRetryDelay, metric.WithUnit("s"),
			metric.WithDescription("Total time of delay while there is no active attempt during the client call."),
			metric.WithExplicitBucketBoundaries(a66LatencyBounds...))
	}
	in.attempts = counter(metricAttempts, "{attempt}", "Attempts of client calls, by method and status.")
	in.retries = counter(metricRetries, "{retry}", "Retries the client decided on (after OnRetry, before the backoff) and hedged copies it launched.")
	in.stops = counter(metricStops, "{call}", "Calls that ended without success under a retry policy, by why retrying stopped.")
	in.rejections = counter(metricRejections, "{attempt}", "Attempts refused locally by an open circuit breaker, a full bulkhead or a rate limit.")
	in.denials = counter(metricDenials, "{retry}", "Retries and hedges the retry budget or A6 throttling denied.")
	in.skips = counter(metricDeadlineSkips, "{retry}", "Retries and hedges not sent because they would not fit in the call's deadline.")
	in.transitions = counter(metricTransitions, "{transition}", "Circuit breaker state changes.")
	in.replays = counter(metricReplays, "{attempt}", "Attempts answered by a server's idempotency replay (idempotency-replayed header).")
	if err != nil {
		return instruments{}, err
	}
	in.names, in.other = new(sync.Map), newMethodMetrics("other")
	if in.gauges, err = registerGauges(m, c); err != nil {
		return instruments{}, err
	}
	in.on = true
	return in, nil
}

// registerGauges registers the observable gauges of c (breaker state,
// bulkhead occupancy, adaptive throttling and the retry budget's balance)
// with one callback, and returns its registration: Client.Close
// unregisters it, so the provider no longer reads c. No gauge takes a
// callback of its own (metric.WithFloat64Callback), which could never be
// unregistered.
func registerGauges(m metric.Meter, c *Client) (metric.Registration, error) {
	budget, err := m.Float64ObservableGauge(metricBudget, metric.WithUnit("{retry}"),
		metric.WithDescription("Retries the client's retry budget would grant now."))
	if err != nil {
		return nil, err
	}
	state, err := m.Int64ObservableGauge(metricBreakerState, metric.WithUnit("{state}"),
		metric.WithDescription("State of each method's circuit breaker: 0 closed, 1 open, 2 half-open, 3 forced open, 4 forced closed."))
	if err != nil {
		return nil, err
	}
	inFlight, err := m.Int64ObservableGauge(metricInFlight, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts holding a slot of each method's bulkhead."))
	if err != nil {
		return nil, err
	}
	queued, err := m.Int64ObservableGauge(metricQueued, metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts waiting for a slot of each method's bulkhead."))
	if err != nil {
		return nil, err
	}
	rejectP, err := m.Float64ObservableGauge(metricRejectProbability, metric.WithUnit("1"),
		metric.WithDescription("Probability with which each method's adaptive throttling rejects an attempt now."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := c.state.Load()
		if st == nil { // NewClient has not yet set the config
			return nil
		}
		var other guardGauges
		now := time.Now()
		if b := st.storm.budget; b != nil {
			o.ObserveFloat64(budget, b.Available(now))
		}
		st.each(func(p *methodPolicy) {
			var g guardGauges
			g.read(&p.g, now)
			if mm := p.mm.Load(); mm != nil {
				g.observe(o, metric.WithAttributeSet(mm.set), state, inFlight, queued, rejectP)
			} else {
				other.merge(g)
			}
		})
		other.observe(o, metric.WithAttributeSet(st.metrics.other.set), state, inFlight, queued, rejectP)
		return nil
	}, budget, state, inFlight, queued, rejectP)
}

// guardGauges are the gauge values of one method's guards, or of the
// methods reported together as "other".
type guardGauges struct {
	hasBreaker, hasAdaptive, hasBulkhead bool
	state                                BreakerState // of "other": the most refusing (severity)
	rejectP                              float64      // of "other": the highest
	inFlight, queued                     int64        // of "other": the sums
}

// read sets g from the guards g of one method at now.
func (gg *guardGauges) read(g *guards, now time.Time) {
	if b := g.breaker; b != nil {
		gg.hasBreaker, gg.state = true, BreakerState(b.Snapshot(now).State)
	}
	if a := g.adaptive; a != nil {
		gg.hasAdaptive, gg.rejectP = true, a.Snapshot(now).RejectProbability
	}
	if bh := g.bulkhead; bh != nil {
		s := bh.Snapshot()
		gg.hasBulkhead, gg.inFlight, gg.queued = true, int64(s.InFlight), int64(s.Queued)
	}
}

// merge adds x, one method's values, to the values of "other".
func (gg *guardGauges) merge(x guardGauges) {
	if x.hasBreaker && (!gg.hasBreaker || severity(x.state) > severity(gg.state)) {
		gg.hasBreaker, gg.state = true, x.state
	}
	if x.hasAdaptive {
		gg.hasAdaptive, gg.rejectP = true, max(gg.rejectP, x.rejectP)
	}
	if x.hasBulkhead {
		gg.hasBulkhead, gg.inFlight, gg.queued = true, gg.inFlight+x.inFlight, gg.queued+x.queued
	}
}

// severity orders breaker states by how much they refuse, for "other":
// forced open, open, half-open, closed, forced closed.
func severity(s BreakerState) int {
	switch s {
	case BreakerForcedOpen:
		return 4
	case BreakerOpen:
		return 3
	case BreakerHalfOpen:
		return 2
	case BreakerClosed:
		return 1
	}
	return 0
}

// observe reports gg under attrs.
func (gg *guardGauges) observe(o metric.Observer, attrs metric.ObserveOption, state, inFlight, queued metric.Int64Observable, rejectP metric.Float64Observable) {
	if gg.hasBreaker {
		o.ObserveInt64(state, int64(gg.state), attrs)
	}
	if gg.hasAdaptive {
		o.ObserveFloat64(rejectP, gg.rejectP, attrs)
	}
	if gg.hasBulkhead {
		o.ObserveInt64(inFlight, gg.inFlight, attrs)
		o.ObserveInt64(queued, gg.queued, attrs)
	}
}

// named returns the attribute sets of fullMethod, a named method, built
// once.
func (in *instruments) named(fullMethod string) *methodMetrics {
	if v, ok := in.names.Load(fullMethod); ok {
		return v.(*methodMetrics)
	}
	v, _ := in.names.LoadOrStore(fullMethod, newMethodMetrics(fullMethod))
	return v.(*methodMetrics)
}

// namedIfOn returns the attribute sets of fullMethod, a named method, or
// nil when metrics are off.
func (in *instruments) namedIfOn(fullMethod string) *methodMetrics {
	if !in.on {
		return nil
	}
	return in.named(fullMethod)
}

// forCall returns the attribute sets a call of mp records under: its
// method's for a call of a generated stub (static) once the method is
// named, else "other" (gRFC A66); nil when metrics are off.
func (in *instruments) forCall(mp *methodPolicy, static bool) *methodMetrics {
	if !in.on {
		return nil
	}
	if static {
		if mm := mp.mm.Load(); mm != nil {
			return mm
		}
	}
	return in.other
}

// methodMetrics are the attribute sets of one method, built once when the
// method's policy is resolved (and only when metrics are on).
type methodMetrics struct {
	method string        // grpc.method: the full method without its leading slash
	set    attribute.Set // grpc.method
	plain  []metric.AddOption
	// byCode holds grpc.method with each grpc.status; byStop, with each
	// resilience.stop_reason; byReason, with each resilience.reason.
	byCode   [17][]metric.AddOption
	byStop   [len(stopReasonTokens)][]metric.AddOption
	byReason [len(stopReasonTokens)][]metric.AddOption
	// targets maps connections' targets (as created) to the method's A96
	// attribute sets.
	// It is replaced, never modified, under mu: readers load it without a
	// lock.
	targets atomic.Pointer[map[string]*connMetrics]
	mu      sync.Mutex
}

func newMethodMetrics(fullMethod string) *methodMetrics {
	mm := &methodMetrics{method: strings.TrimPrefix(fullMethod, "/")}
	m := attrMethod.String(mm.method)
	mm.set = attribute.NewSet(m)
	mm.plain = []metric.AddOption{metric.WithAttributeSet(mm.set)}
	for c := range mm.byCode {
		mm.byCode[c] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(m, attrStatus.String(codeName(codes.Code(c)))))}
	}
	for r, tok := range stopReasonTokens {
		mm.byStop[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(m, attrStopReason.String(tok)))}
		mm.byReason[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(m, attrReason.String(tok)))}
	}
	return mm
}

// codeName returns the name gRFC A66 gives a status code in grpc.status,
// such as "UNAVAILABLE".
func codeName(c codes.Code) string {
	if int(c) < len(a66CodeNames) {
		return a66CodeNames[c]
	}
	return c.String()
}

// a66CodeNames are the status codes' names as gRFC A66 writes them.
var a66CodeNames = [17]string{
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
	"OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

// connMetrics are the A96 attribute set of one method (or "other") on one
// target: grpc.method and grpc.target.
type connMetrics struct {
	set []metric.RecordOption
}

// connSets returns the A96 attribute sets of mm's method on cc, built once
// per target. grpc.target is cc's canonical target (gRFC A66), "other" when
// the interceptor is called without a connection. The sets are found by the
// target as the connection was created with (ClientConn.Target, a field
// read; CanonicalTarget formats a URL on each call), so the fast path is one
// map read, with no allocation, however many connections call the method.
func (mm *methodMetrics) connSets(cc *grpc.ClientConn) *connMetrics {
	target := "other"
	if cc != nil {
		target = cc.Target()
	}
	if m := mm.targets.Load(); m != nil {
		if sets, ok := (*m)[target]; ok {
			return sets
		}
	}
	mm.mu.Lock()
	defer mm.mu.Unlock()
	var old map[string]*connMetrics
	if m := mm.targets.Load(); m != nil {
		old = *m
	}
	if sets, ok := old[target]; ok {
		return sets
	}
	canonical := target
	if cc != nil {
		canonical = cc.CanonicalTarget()
	}
	t := attrTarget.String(canonical)
	sets := &connMetrics{
		set: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attrMethod.String(mm.method), t))},
	}
	next := make(map[string]*connMetrics, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[target] = sets
	mm.targets.Store(&next)
	return sets
}

// callEnded records gRFC A96's per-call metrics of a call that ran
// attempts attempts (hedged: as copies of a hedging policy) on cc, and spent
// delay with no attempt running, under mm (the method's sets, or "other").
func (in *instruments) callEnded(ctx context.Context, mm *methodMetrics, cc *grpc.ClientConn,
	attempts int, hedged bool, delay time.Duration) {
	if !in.on {
		return
	}
	set := mm.connSets(cc).set
	if n := int64(attempts - 1); n > 0 {
		if hedged {
			in.hedgesHist.Record(ctx, n, set...)
		} else {
			in.retriesHist.Record(ctx, n, set...)
		}
	}
	in.delayHist.Record(ctx, delay.Seconds(), set...)
}

// attempt records an attempt that ended with err. A code outside the 17
// that a server wrote in grpc-status (grpc-go passes any number on) is
// recorded as UNKNOWN, as grpc-java reads it: grpc.status stays within 17
// values whatever a server sends.
func (in *instruments) attempt(ctx context.Context, mm *methodMetrics, err error) {
	if !in.on {
		return
	}
	code := codes.OK
	if err != nil {
		code = rescodes.Classify(err)
	}
	if int(code) >= len(mm.byCode) {
		code = codes.Unknown
	}
	in.attempts.Add(ctx, 1, mm.byCode[code]...)
}

// replayed records an attempt whose response header marks a replay.
func (in *instruments) replayed(ctx context.Context, mm *methodMetrics, header metadata.MD) {
	if in.on && wire.IdempotencyReplayed(header) {
		in.replays.Add(ctx, 1, mm.plain...)
	}
}

// retry records a retry or hedged copy sent.
func (in *instruments) retry(ctx context.Context, mm *methodMetrics) {
	if in.on {
		in.retries.Add(ctx, 1, mm.plain...)
	}
}

// stop records a call under a retry policy that ended without success.
func (in *instruments) stop(ctx context.Context, mm *methodMetrics, reason StopReason) {
	if in.on && int(reason) < len(mm.byStop) {
		in.stops.Add(ctx, 1, mm.byStop[reason]...)
	}
}

// rejected records an attempt the breaker or bulkhead refused.
func (in *instruments) rejected(ctx context.Context, mm *methodMetrics, reason StopReason) {
	if in.on && int(reason) < len(mm.byReason) {
		in.rejections.Add(ctx, 1, mm.byReason[reason]...)
	}
}

// skipped records a retry or hedge not sent for reason: StopBudget and
// StopThrottled are denials, StopDeadline a deadline skip; other reasons
// are not recorded here.
func (in *instruments) skipped(ctx context.Context, mm *methodMetrics, reason StopReason) {
	if !in.on {
		return
	}
	switch reason {
	case StopBudget, StopThrottled:
		in.denials.Add(ctx, 1, mm.byReason[reason]...)
	case StopDeadline:
		in.skips.Add(ctx, 1, mm.plain...)
	}
}

// stateChange records a breaker's transition: under the method's name
// when it is named, else as "other".
func (in *instruments) stateChange(fullMethod string, from, to BreakerState) {
	if !in.on {
		return
	}
	method := in.other.method
	if v, ok := in.names.Load(fullMethod); ok {
		method = v.(*methodMetrics).method
	}
	in.transitions.Add(context.Background(), 1, metric.WithAttributes(
		attrMethod.String(method), attrFrom.String(from.String()), attrTo.String(to.String())))
}
