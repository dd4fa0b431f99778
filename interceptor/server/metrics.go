package server

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/telemetry"
)

// The server's metrics, recorded through the OpenTelemetry metric API when
// WithMeterProvider is given. Every instrument carries grpc.method
// (gRFC A66: the full method without its leading slash).
const (
	// metricSrvExecutions counts handler runs under an idempotency claim.
	metricSrvExecutions = "resilience.server.idempotency.executions"
	// metricSrvReplays counts stored outcomes replayed, by
	// resilience.idempotency.source: store (a duplicate after completion)
	// or flight (a duplicate that waited for a running call of this
	// process).
	metricSrvReplays = "resilience.server.idempotency.replays"
	// metricSrvWaits counts duplicates that waited for a running call, by
	// resilience.idempotency.wait: flight (coalesced in this process) or
	// poll (the owner is another process).
	metricSrvWaits = "resilience.server.idempotency.waits"
	// metricSrvConflicts counts keyed calls refused, by
	// resilience.idempotency.conflict: mismatch (the key was used with
	// another request: FAILED_PRECONDITION) or in_progress (ABORTED with
	// pushback, when waiting is off).
	metricSrvConflicts = "resilience.server.idempotency.conflicts"
	// metricSrvStoreErrors counts failed store operations, by
	// resilience.idempotency.op and resilience.idempotency.mode (fail_open
	// or fail_closed: what a failed claim does).
	metricSrvStoreErrors = "resilience.server.idempotency.store_errors"
	// metricSrvStoreDuration is the latency of store operations, in
	// seconds, by resilience.idempotency.op.
	metricSrvStoreDuration = "resilience.server.idempotency.store.duration"
)

var (
	attrIdemSource   = attribute.Key("resilience.idempotency.source")
	attrIdemWait     = attribute.Key("resilience.idempotency.wait")
	attrIdemConflict = attribute.Key("resilience.idempotency.conflict")
	attrIdemOp       = attribute.Key("resilience.idempotency.op")
	attrIdemMode     = attribute.Key("resilience.idempotency.mode")
)

// Store operations, as resilience.idempotency.op names them.
type srvStoreOp uint8

const (
	srvOpClaim srvStoreOp = iota
	srvOpComplete
	srvOpRelease
	srvOpRenew
	srvOps
)

var srvOpNames = [srvOps]string{"claim", "complete", "release", "renew"}

// The labels of replays (source), waits and conflicts, as indexes of
// srvMethodSets' arrays.
const (
	srvFromStore  = 0 // a replay of a record the store returned
	srvFromFlight = 1 // a replay of a running flight's outcome
	srvWaitFlight = 0 // a wait for a flight of this process
	srvWaitPoll   = 1 // a wait, polling the store, for another process
	srvMismatch   = 0 // the key was used with another request
	srvInProgress = 1 // the key is in progress and waiting is off
)

// srvMetrics are a Server's instruments; the zero value records nothing.
type srvMetrics struct {
	on          bool
	failOpen    bool
	executions  metric.Int64Counter
	replays     metric.Int64Counter
	waits       metric.Int64Counter
	conflicts   metric.Int64Counter
	storeErrors metric.Int64Counter
	storeDur    metric.Float64Histogram

	methods methodSets[srvMethodSets] // attribute sets by full method
}

// srvMethodSets are the attribute sets of one method, built once.
type srvMethodSets struct {
	plain     []metric.AddOption
	replays   [2][]metric.AddOption // by srvFromStore, srvFromFlight
	waits     [2][]metric.AddOption // by srvWaitFlight, srvWaitPoll
	conflicts [2][]metric.AddOption // by srvMismatch, srvInProgress
	errors    [srvOps][]metric.AddOption
	durations [srvOps][]metric.RecordOption
}

func newSrvMetrics(mp metric.MeterProvider, failOpen bool) (*srvMetrics, error) {
	m := &srvMetrics{failOpen: failOpen}
	if mp == nil {
		return m, nil
	}
	mk := instrumentMaker{meter: mp.Meter(telemetry.MeterName)}
	m.executions = mk.counter(metricSrvExecutions, "{call}", "Handler runs under an idempotency claim.")
	m.replays = mk.counter(metricSrvReplays, "{call}", "Stored outcomes replayed to duplicates.")
	m.waits = mk.counter(metricSrvWaits, "{call}", "Duplicates that waited for a running call with the same key.")
	m.conflicts = mk.counter(metricSrvConflicts, "{call}", "Keyed calls refused: key reused with another request, or in progress.")
	m.storeErrors = mk.counter(metricSrvStoreErrors, "{error}", "Failed idempotency store operations.")
	m.storeDur = mk.seconds(metricSrvStoreDuration, "Latency of idempotency store operations.")
	if mk.err != nil {
		return nil, mk.err
	}
	m.methods.build = m.newSets
	m.on = true
	return m, nil
}

// instrumentMaker makes the server's instruments on one meter and keeps
// the first error; after it, each method returns the zero instrument, so
// that a constructor checks err once.
type instrumentMaker struct {
	meter metric.Meter
	err   error
}

// counter makes an Int64Counter.
func (mk *instrumentMaker) counter(name, unit, desc string) metric.Int64Counter {
	var c metric.Int64Counter
	if mk.err == nil {
		c, mk.err = mk.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	}
	return c
}

// seconds makes a Float64Histogram of durations in seconds, with gRFC
// A66's latency buckets.
func (mk *instrumentMaker) seconds(name, desc string) metric.Float64Histogram {
	var h metric.Float64Histogram
	if mk.err == nil {
		h, mk.err = mk.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(telemetry.A66LatencyBounds...))
	}
	return h
}

// gauge makes an Int64ObservableGauge.
func (mk *instrumentMaker) gauge(name, unit, desc string) metric.Int64ObservableGauge {
	var g metric.Int64ObservableGauge
	if mk.err == nil {
		g, mk.err = mk.meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	}
	return g
}

// sets returns the attribute sets of fullMethod, building them on its first
// call. The fast path is one map read.
func (m *srvMetrics) sets(fullMethod string) *srvMethodSets {
	return m.methods.get(fullMethod)
}

func (m *srvMetrics) newSets(fullMethod string) *srvMethodSets {
	meth := telemetry.AttrMethod.String(strings.TrimPrefix(fullMethod, "/"))
	add := func(kvs ...attribute.KeyValue) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append(kvs, meth)...))}
	}
	mode := "fail_closed"
	if m.failOpen {
		mode = "fail_open"
	}
	s := &srvMethodSets{plain: add()}
	s.replays = [2][]metric.AddOption{add(attrIdemSource.String("store")), add(attrIdemSource.String("flight"))}
	s.waits = [2][]metric.AddOption{add(attrIdemWait.String("flight")), add(attrIdemWait.String("poll"))}
	s.conflicts = [2][]metric.AddOption{add(attrIdemConflict.String("mismatch")), add(attrIdemConflict.String("in_progress"))}
	for op, name := range srvOpNames {
		s.errors[op] = add(attrIdemOp.String(name), attrIdemMode.String(mode))
		s.durations[op] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(meth, attrIdemOp.String(name)))}
	}
	return s
}

// execution records a handler run under a claim.
func (m *srvMetrics) execution(ctx context.Context, fullMethod string) {
	if m.on {
		m.executions.Add(ctx, 1, m.sets(fullMethod).plain...)
	}
}

// replay records an outcome replayed from source (srvFromStore or
// srvFromFlight), with its event on the server's span.
func (m *srvMetrics) replay(ctx context.Context, fullMethod string, source int, rec *idempotency.Record) {
	if m.on {
		m.replays.Add(ctx, 1, m.sets(fullMethod).replays[source]...)
	}
	traceReplay(ctx, source, rec)
}

// wait records a duplicate waiting for a running call (srvWaitFlight or
// srvWaitPoll).
func (m *srvMetrics) wait(ctx context.Context, fullMethod string, kind int) {
	if m.on {
		m.waits.Add(ctx, 1, m.sets(fullMethod).waits[kind]...)
	}
}

// conflict records a keyed call refused (srvMismatch or srvInProgress).
func (m *srvMetrics) conflict(ctx context.Context, fullMethod string, kind int) {
	if m.on {
		m.conflicts.Add(ctx, 1, m.sets(fullMethod).conflicts[kind]...)
	}
}

// start returns the time a store operation starts, for storeDone; the zero
// time when metrics are off.
func (m *srvMetrics) start() time.Time {
	if !m.on {
		return time.Time{}
	}
	return time.Now()
}

// storeDone records a store operation op that started at start and ended
// with err. The store's answers that are not failures (the key is owned by
// another call, the store is full, the record too large) and errors of a
// context that has ended are not counted as errors.
func (m *srvMetrics) storeDone(ctx context.Context, fullMethod string, op srvStoreOp, start time.Time, err error) {
	if !m.on {
		return
	}
	s := m.sets(fullMethod)
	m.storeDur.Record(ctx, time.Since(start).Seconds(), s.durations[op]...)
	if err == nil || ctx.Err() != nil || errors.Is(err, idempotency.ErrNotOwner) ||
		errors.Is(err, idempotency.ErrRecordTooLarge) {
		return
	}
	if _, full := errors.AsType[*idempotency.FullError](err); full {
		return
	}
	m.storeErrors.Add(ctx, 1, s.errors[op]...)
}

// traceReplay adds the replay event to the server's span in ctx, when it
// records.
func traceReplay(ctx context.Context, source int, rec *idempotency.Record) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	src := "store"
	if source == srvFromFlight {
		src = "flight"
	}
	attrs := []attribute.KeyValue{attrIdemSource.String(src)}
	if rec != nil {
		attrs = append(attrs, telemetry.AttrCode.Int(int(rec.Code)))
	}
	span.AddEvent(telemetry.EventReplay, trace.WithAttributes(attrs...))
}

// maxMetricMethods bounds the methods a server's metrics keep attribute
// sets for. A server whose UnknownServiceHandler runs the interceptors for
// any method name a caller sends would otherwise keep (and copy) one entry
// per name a caller invents; past the bound, further methods are recorded
// as "other", as gRFC A66 records methods that are not registered.
const maxMetricMethods = 1024

// methodSets maps full methods to their attribute sets, built once per
// method by build, for at most maxMetricMethods methods; the rest share
// the sets built for "other". The map is replaced, never modified, under
// mu: readers load it without a lock.
type methodSets[T any] struct {
	build   func(fullMethod string) *T
	methods atomic.Pointer[map[string]*T]
	other   atomic.Pointer[T] // set once the bound is reached
	mu      sync.Mutex
}

// get returns fullMethod's sets; the fast path is one map read.
func (s *methodSets[T]) get(fullMethod string) *T {
	if p := s.methods.Load(); p != nil {
		if v, ok := (*p)[fullMethod]; ok {
			return v
		}
	}
	if o := s.other.Load(); o != nil {
		return o
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var old map[string]*T
	if p := s.methods.Load(); p != nil {
		old = *p
	}
	if v, ok := old[fullMethod]; ok {
		return v
	}
	if len(old) >= maxMetricMethods {
		if o := s.other.Load(); o != nil {
			return o
		}
		o := s.build("other")
		s.other.Store(o)
		return o
	}
	v := s.build(fullMethod)
	next := make(map[string]*T, len(old)+1)
	for k, x := range old {
		next[k] = x
	}
	next[fullMethod] = v
	s.methods.Store(&next)
	return v
}
