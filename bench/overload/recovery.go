package overload

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The recovery scenario of issue 32: a fresh client's throttling through an
// outage and the healthy phase after it, open loop.
const (
	recoveryRate    = 2000.0                  // calls per second
	recoveryHealthy = 1500 * time.Millisecond // the healthy phase after the outage
	recoveryRun     = 10                      // successes in a row that make a recovery
)

// RecoveryOutages are the outages of the scenario.
var RecoveryOutages = []time.Duration{time.Second, 1250 * time.Millisecond, 1500 * time.Millisecond}

// Recovery contenders.
const (
	RecAdaptive = "grpc-resilience adaptive (K 2, window 60s)"
	RecBreaker  = "grpc-resilience breaker (5 consecutive failures, open 500ms)"
	RecFailsafe = "failsafe-go adaptivethrottler (defaults)"
)

// RecoveryContenders lists them in report order.
var RecoveryContenders = []string{RecAdaptive, RecBreaker, RecFailsafe}

// RecoveryResult is one run of one contender.
type RecoveryResult struct {
	Contender string
	Outage    time.Duration
	// Failing is the share of calls the backend still refuses after the
	// outage.
	Failing float64
	// Recovered is the time from the outage's end to the start of the
	// first call ending a run of 10 successes (in the order the calls
	// started); negative: none within the healthy phase.
	Recovered time.Duration
	// Succeeded is the share of the calls of the healthy phase that
	// succeeded.
	Succeeded float64
	// AttemptsInOutage is the number of calls that reached the backend
	// during the outage (of recoveryRate × Outage offered).
	AttemptsInOutage int64
	// RejectedAfter and TimedOutAfter are the shares of the calls of the
	// healthy phase that the contender rejected locally (the others it
	// admitted), and that ended past their deadline (a machine too busy to
	// run them in time, which says nothing of the throttle).
	RejectedAfter, TimedOutAfter float64
}

// Classes of a recovery call's outcome (outcome.class).
const (
	recOK = iota
	recRejected
	recTimedOut
	recRefused
)

// RunRecovery runs contender against a backend that refuses every call
// (UNAVAILABLE) for outage, then accepts them, but for the share failing it
// still refuses, for 1.5s: 2,000 calls a second, open loop, each with a 1s
// deadline, from a fresh client.
func RunRecovery(contender string, outage time.Duration, failing float64) (RecoveryResult, error) {
	r := RecoveryResult{Contender: contender, Outage: outage, Failing: failing}
	impl := &capacityServer{}
	var down atomic.Bool
	var answered atomic.Int64
	down.Store(true)
	every := int64(0)
	if failing > 0 {
		every = int64(1 / failing)
	}
	impl.refuse = func() error {
		if down.Load() {
			return status.Error(codes.Unavailable, "down")
		}
		if every > 0 && answered.Add(1)%every == 0 {
			return status.Error(codes.Unavailable, "still refusing a few")
		}
		return nil
	}
	srv, err := serve(impl)
	if err != nil {
		return r, err
	}
	defer srv.stop()
	opts, err := recoveryDialOptions(contender)
	if err != nil {
		return r, err
	}
	cc, err := srv.dial(opts...)
	if err != nil {
		return r, err
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)
	// The connection up, with nothing counted: one call through a client
	// of its own.
	if err := warm(srv); err != nil {
		return r, err
	}
	var rec recorder
	base := impl.calls.Load()
	t0 := time.Now()
	go func() {
		time.Sleep(outage - time.Since(t0))
		r.AttemptsInOutage = impl.calls.Load() - base
		down.Store(false)
	}()
	openLoop(t0, []phase{{recoveryRate, outage + recoveryHealthy}}, func(_ int, start time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		began := time.Now()
		_, err := client.Echo(ctx, &echov1.EchoRequest{})
		class := recRefused
		switch {
		case err == nil:
			class = recOK
		case errors.Is(err, interceptor.ErrCircuitOpen), errors.Is(err, adaptivethrottler.ErrExceeded):
			class = recRejected
		case ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded:
			class = recTimedOut
		}
		rec.add(outcome{start: start, took: time.Since(began), code: status.Code(err), class: class, ok: err == nil})
	})
	after := pick(rec.all(), -1, outage, outage+recoveryHealthy)
	sortByStart(after)
	r.Succeeded = success(after)
	for _, o := range after {
		switch o.class {
		case recRejected:
			r.RejectedAfter++
		case recTimedOut:
			r.TimedOutAfter++
		}
	}
	if n := float64(len(after)); n > 0 {
		r.RejectedAfter /= n
		r.TimedOutAfter /= n
	}
	r.Recovered = -1
	run := 0
	for _, o := range after {
		if !o.ok {
			run = 0
			continue
		}
		if run++; run == recoveryRun {
			r.Recovered = o.start - outage
			break
		}
	}
	return r, nil
}

// sortByStart sorts out by the calls' starts.
func sortByStart(out []outcome) {
	slices.SortFunc(out, func(a, b outcome) int { return cmp.Compare(a.start, b.start) })
}

// warm makes one call to srv on a connection of its own.
func warm(srv *served) error {
	cc, err := srv.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = echov1.NewEchoServiceClient(cc).Echo(ctx, &echov1.EchoRequest{Message: msgFail})
	if status.Code(err) == codes.InvalidArgument || status.Code(err) == codes.Unavailable {
		return nil
	}
	return err
}

// recoveryDialOptions returns the dial options of contender.
func recoveryDialOptions(contender string) ([]grpc.DialOption, error) {
	name := []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}}
	switch contender {
	case RecAdaptive, RecBreaker:
		cb := &serviceconfig.CircuitBreaker{Mode: serviceconfig.ModeAdaptive}
		if contender == RecBreaker {
			cb = &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: 500 * time.Millisecond}
		}
		c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{Name: name, CircuitBreaker: cb}))
		if err != nil {
			return nil, err
		}
		return c.DialOptions(), nil
	case RecFailsafe:
		th := adaptivethrottler.NewBuilder[any]().HandleIf(func(_ any, err error) bool {
			return status.Code(err) == codes.Unavailable || status.Code(err) == codes.ResourceExhausted
		}).Build()
		return []grpc.DialOption{grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor[any](th))}, nil
	}
	return nil, errors.New("overload: unknown recovery contender " + contender)
}

// String describes r in one line.
func (r RecoveryResult) String() string {
	rec := "never"
	if r.Recovered >= 0 {
		rec = r.Recovered.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%s, outage %v, %.0f%% failing after: 10 in a row after %s, %.1f%% succeeded after (%.1f%% rejected locally, %.1f%% past their deadline), %d attempts in the outage",
		r.Contender, r.Outage, 100*r.Failing, rec, 100*r.Succeeded, 100*r.RejectedAfter, 100*r.TimedOutAfter, r.AttemptsInOutage)
}
