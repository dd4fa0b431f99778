package outbox_test

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// fieldErrors is an error whose type == cannot compare, as a validation
// library's list of field errors is: a slice.
type fieldErrors []string

func (e fieldErrors) Error() string { return "invalid fields: " + e[0] }

// GRPCStatus makes it a refusal for good (INVALID_ARGUMENT).
func (e fieldErrors) GRPCStatus() *status.Status { return status.New(codes.InvalidArgument, e.Error()) }

// TestRelayTakesAnUncomparableErrorOfAnAttemptWithoutPanicking: an
// interceptor of the relay's conn (a client-side validation, say) fails an
// attempt with an error of a type that == cannot compare; the relay's
// client returns it unchanged (no retry policy) or in its RetryError. The
// relay must tell it is an attempt's answer without ==, which panics on two
// such values and, in a delivery's goroutine, crashed the process; and
// without errors.Is alone, which never matches such a value (the message
// was retried for ever). It is an attempt's INVALID_ARGUMENT: marked dead.
func TestRelayTakesAnUncomparableErrorOfAnAttemptWithoutPanicking(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []interceptor.ClientOption
	}{
		{name: "returned unchanged"},
		{name: "in a RetryError", opts: []interceptor.ClientOption{interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{}},
			RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
				RetryableStatusCodes: []codes.Code{codes.Unavailable}},
		})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.enqueue(t, true, "invalid")
			cc, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry(),
				grpc.WithChainUnaryInterceptor(func(context.Context, string, any, any, *grpc.ClientConn, grpc.UnaryInvoker, ...grpc.CallOption) error {
					return fieldErrors{"message"}
				}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cc.Close() })
			client, err := interceptor.NewClient(tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Close() })
			var dead atomic.Int32
			r, err := outbox.NewRelay(e.ob, e.pool, cc, client, outbox.RelayConfig{OnDead: func(outbox.Message, error) { dead.Add(1) }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = r.Close() })
			onceAnswers(t, r, &dead, 1, 1, "of a message an attempt's INVALID_ARGUMENT refuses for good",
				"an attempt's INVALID_ARGUMENT marks the message dead")
		})
	}
}

// TestRelayReadsAHedgedDeliveryAsAPlainOne: through a client that hedges
// (three copies at once, each a goroutine of its own, a loser may still
// run when the call returns), the relay reads the outcome as for a
// plain call: a message the receiver refuses for good is dead, one it
// answers is delivered once, and one the fallback answers with an error,
// its breaker forced open, is kept uncounted and its method held; the
// relay's record of the copies' errors, written by them concurrently, is
// race-free (-race).
func TestRelayReadsAHedgedDeliveryAsAPlainOne(t *testing.T) {
	e := newEnv(t)
	e.answer = func(msg string, _ int) error {
		if msg == "bad" {
			return status.Error(codes.FailedPrecondition, "no such account")
		}
		return nil
	}
	var msgs []string
	for i := range 6 {
		msgs = append(msgs, "good-"+strconv.Itoa(i))
	}
	e.enqueue(t, true, append(msgs, "bad")...)
	e.enqueueLookups(t, "held")
	var fallbacks atomic.Int32
	client, err := interceptor.NewClient(
		interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{}},
			HedgingPolicy:  &serviceconfig.HedgingPolicy{MaxAttempts: 3, NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: time.Minute},
		}),
		interceptor.WithFallback(func(context.Context, string, any, any, error) error {
			fallbacks.Add(1)
			return status.Error(codes.FailedPrecondition, "no cached reply")
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	if err := client.ForceOpen(lookupMethod); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		dead []string
	)
	var copies atomic.Int32 // the copies sent, counted on the conn
	cc, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry(),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker,
			opts ...grpc.CallOption) error {
			copies.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	r, err := outbox.NewRelay(e.ob, e.pool, cc, client, outbox.RelayConfig{InitialBackoff: time.Minute,
		OnDead: func(m outbox.Message, err error) {
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, m.FullMethod+" "+status.Code(err).String())
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if n, err := r.Once(context.Background()); n != len(msgs)+1 || err != nil {
		t.Fatalf("Once = %d, %v, want %d answered (the good delivered, bad refused), nil", n, err, len(msgs)+1)
	}
	if n := int(copies.Load()); n <= len(msgs)+1 {
		t.Fatalf("%d copies sent for %d deliveries, want more: the test does not hedge", n, len(msgs)+1)
	}
	mu.Lock()
	if want := []string{echoMethod + " FailedPrecondition"}; !slices.Equal(dead, want) {
		t.Errorf("dead = %v, want %v: the receiver's refusal, not the fallback's", dead, want)
	}
	mu.Unlock()
	if fallbacks.Load() != 1 {
		t.Errorf("fallback ran %d times, want 1 (the held message's delivery)", fallbacks.Load())
	}
	rows := e.rows(t)
	var kept []rowState
	for _, row := range rows {
		if row.method == lookupMethod {
			kept = append(kept, row)
		}
	}
	if len(kept) != 1 || kept[0].attempts != 0 {
		t.Errorf("the message the fallback answered: %+v, want it kept, no attempt counted", kept)
	}
	if held := outbox.HeldMethods(r); !slices.Equal(held, []string{lookupMethod}) {
		t.Errorf("held methods = %v, want [%s]", held, lookupMethod)
	}
	got := e.receivedRows(t)
	for _, m := range msgs {
		if got[m] != 1 {
			t.Errorf("receiver's rows of %s = %d, want 1", m, got[m])
		}
	}
}

// syncBuffer is a log's output, written by a pass's deliveries at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRelayBlamesNoFallbackForADeliveryWhoseTimeRanOutInTheBulkheadQueue:
// a delivery that waited in the client's bulkhead queue until its Timeout
// ended (another call held the only slot) fails with the client's own
// DEADLINE_EXCEEDED, nothing sent. It is given back uncounted, as the
// bulkhead's refusal would be, and logs nothing: before, it logged the
// relay's one warning about a fallback, telling the operator of a client
// without any to "give the relay a client without a fallback", and so
// spent it: the fallback that later answered a delivery went unreported.
func TestRelayBlamesNoFallbackForADeliveryWhoseTimeRanOutInTheBulkheadQueue(t *testing.T) {
	e := newEnv(t)
	gate, entered := make(chan struct{}), make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the receiver stops: a failed test must not leave the handler waiting
	e.answer = func(msg string, _ int) error {
		if msg == "holder" {
			close(entered)
			<-gate
		}
		return nil
	}
	client, err := interceptor.NewClient(
		interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{}},
			Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 4}, // a wait bounded by the deadline alone
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5, OpenDuration: time.Minute},
		}),
		interceptor.WithFallback(func(context.Context, string, any, any, error) error {
			return status.Error(codes.FailedPrecondition, "no cached reply")
		}, lookupMethod))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	// A call of the application's, through the same client, holds the
	// method's only slot until the gate opens.
	app, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry(),
		grpc.WithUnaryInterceptor(client.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = app.Close() })
	held := make(chan error, 1)
	go func() {
		_, err := echov1.NewEchoServiceClient(app).Echo(interceptor.ContextWithIdempotencyKey(context.Background(), "holder"),
			&echov1.EchoRequest{Message: "holder"})
		held <- err
	}()
	<-entered
	e.enqueue(t, true, "queued")
	var logs syncBuffer
	r := e.relayWith(t, client, outbox.RelayConfig{Timeout: 200 * time.Millisecond, Lease: 10 * time.Second,
		InitialBackoff: time.Minute, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	if n, err := r.Once(ctx); n != 0 || err != nil {
		t.Fatalf("Once with the only slot held = %d, %v, want 0, nil", n, err)
	}
	if rows := e.rows(t); len(rows) != 1 || rows[0].attempts != 0 {
		t.Errorf("the delivery whose time ran out in the queue: %+v, want it kept, given back, no attempt counted", rows)
	}
	if got := logs.String(); got != "" {
		t.Errorf("the relay logged %q, want nothing: no fallback answered, the client's bulkhead queue ran out of time", got)
	}
	open()
	if err := <-held; err != nil {
		t.Fatalf("the call that held the slot: %v", err)
	}
	// The fallback, when it does answer, is reported.
	e.enqueueLookups(t, "fallback")
	if err := client.ForceOpen(lookupMethod); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Once(ctx); err != nil {
		t.Fatal(err)
	}
	if got := logs.String(); !strings.Contains(got, "WithFallback") || !strings.Contains(got, lookupMethod) {
		t.Errorf("the relay logged %q after the fallback answered a delivery of %s, want its warning", got, lookupMethod)
	}
}

// TestRelayNeverMarksDeadADeliveryADeadlineOfItsOwnCut: a receiver slower
// than the relay's Timeout, or than its client's per-attempt timeout,
// gives no answer: the attempt fails with DEADLINE_EXCEEDED raised on the
// relay's side when the deadline it set passed. With RetryableCodes that
// leave DEADLINE_EXCEEDED out, the relay took it for the receiver's
// refusal for good and marked the message dead, logging that the receiver
// refused it, while the receiver was still running it. It is retried after
// its backoff, its attempt counted, and delivered once.
func TestRelayNeverMarksDeadADeliveryADeadlineOfItsOwnCut(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the relay's
		opts    []interceptor.ClientOption
	}{
		{name: "the relay's Timeout", timeout: 300 * time.Millisecond},
		{name: "the client's per-attempt timeout", timeout: 5 * time.Second, opts: []interceptor.ClientOption{
			interceptor.WithMethodConfig(serviceconfig.MethodConfig{
				Name: []serviceconfig.Name{{}},
				RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
					RetryableStatusCodes: []codes.Code{codes.Unavailable}, PerAttemptRecvTimeout: 100 * time.Millisecond},
			})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			gate := make(chan struct{})
			var opened sync.Once
			open := func() { opened.Do(func() { close(gate) }) }
			t.Cleanup(open) // before the receiver stops: a failed test must not leave the handler waiting
			e.answer = func(string, int) error {
				<-gate // slower than the deadline, until the gate opens
				return nil
			}
			e.enqueue(t, true, "slow")
			client, err := interceptor.NewClient(tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Close() })
			var dead atomic.Int32
			r := e.relayWith(t, client, outbox.RelayConfig{Timeout: tc.timeout, Lease: 10 * time.Second,
				InitialBackoff: time.Minute, RetryableCodes: rescodes.Of(codes.Unavailable),
				OnDead: func(outbox.Message, error) { dead.Add(1) }})
			onceAnswers(t, r, &dead, 0, 0, "with the receiver slower than the deadline",
				"the message is not dead: a deadline of the relay's side is not the receiver's answer")
			if rows := e.rows(t); len(rows) != 1 || rows[0].attempts != 1 || rows[0].nextIn < 50*time.Second {
				t.Fatalf("the message: %+v, want it kept, 1 attempt counted, due after the minute of InitialBackoff", rows)
			}
			open()
			e.drain(t, r)
			if got, want := e.receivedRows(t), map[string]int{"slow": 1}; !maps.Equal(got, want) {
				t.Errorf("receiver's rows = %v, want %v", got, want)
			}
			if dead.Load() != 0 {
				t.Error("the message was marked dead")
			}
		})
	}
}

// TestRelayGivesBackADeliveryStoppedMidAttempt: a pass whose context ends
// (Run stopping) while an attempt waits for the receiver gives its message
// back, its attempt uncounted, whatever RetryableCodes say of CANCELLED:
// the attempt's CANCELLED is the relay's own, not the receiver's answer.
func TestRelayGivesBackADeliveryStoppedMidAttempt(t *testing.T) {
	e := newEnv(t)
	gate, entered := make(chan struct{}), make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the receiver stops: a failed test must not leave the handler waiting
	var runs atomic.Int32
	e.answer = func(string, int) error {
		if runs.Add(1) == 1 {
			close(entered)
			<-gate
		}
		return nil
	}
	e.enqueue(t, true, "stopped")
	var dead atomic.Int32
	r := e.relay(t, outbox.RelayConfig{RetryableCodes: rescodes.Of(codes.Unavailable), OnDead: func(outbox.Message, error) { dead.Add(1) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Once(ctx)
		done <- err
	}()
	<-entered
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Once stopped mid-attempt: %v, want nil (its statements ran)", err)
	}
	if dead.Load() != 0 {
		t.Fatal("the message was marked dead: Run stopping is not the receiver's answer")
	}
	if rows := e.rows(t); len(rows) != 1 || rows[0].attempts != 0 {
		t.Fatalf("the message: %+v, want it given back, no attempt counted", rows)
	}
	open()
	e.drain(t, r)
	if got, want := e.receivedRows(t), map[string]int{"stopped": 1}; !maps.Equal(got, want) {
		t.Errorf("receiver's rows = %v, want %v", got, want)
	}
}
