package outbox_test

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

const lookupMethod = "/resilience.echo.v1.EchoService/Lookup"

// breakerClient returns a relay's client whose breaker opens at a method's
// first failure, for openFor, and whose retry policy makes a second
// attempt: the breaker refuses it once the first failed.
func breakerClient(t *testing.T, openFor time.Duration) *interceptor.Client {
	t.Helper()
	c, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name: []serviceconfig.Name{{}},
		RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 2, InitialBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond,
			RetryableStatusCodes: []codes.Code{codes.Unavailable}},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: openFor},
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// runRelay runs r until the test ends, and checks that Run returns its
// context's error.
func runRelay(t *testing.T, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v, want context.Canceled", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls the database (through what cond reads) until cond holds,
// failing with what it last said after 20 s.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		var ok bool
		if ok, last = cond(); ok {
			return
		}
		time.Sleep(10 * time.Millisecond) // the relay's passes, on real time
	}
	t.Fatalf("waited 20s for %s: %s", what, last)
}

// rowState is a message's row as a relay leaves it.
type rowState struct {
	seq      int64
	method   string
	nextIn   time.Duration // next_at - now
	next     time.Time
	attempts int
}

func (e *env) rows(t *testing.T) []rowState {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT seq, method, next_at - statement_timestamp(), next_at, attempts FROM "+
		pgtest.Ident(e.schema)+".resilience_outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []rowState
	for rows.Next() {
		var r rowState
		if err := rows.Scan(&r.seq, &r.method, &r.nextIn, &r.next, &r.attempts); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// enqueueLookups writes Lookup messages msgs in one transaction.
func (e *env) enqueueLookups(t *testing.T, msgs ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, m := range msgs {
		if _, err := e.ob.Enqueue(ctx, tx, lookupMethod, &echov1.LookupRequest{Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRelayTakesNoMessageWhileTheBreakerIsOpen: with the receiver down and
// the relay's breaker open for a minute, a running relay gives back the
// batch the breaker refused, uncounted, due when the breaker lets a probe
// through (its RetryAfter, read from the refusal), and then takes no
// message at all: it polls once per PollInterval, as for an empty outbox.
// Before, it took and gave back every message of the outbox, batch after
// batch, for as long as the breaker stayed open (about 300 round trips a
// second here).
func TestRelayTakesNoMessageWhileTheBreakerIsOpen(t *testing.T) {
	e := newEnv(t)
	e.stop()
	var msgs []string
	for i := range 100 {
		msgs = append(msgs, "outage-"+strconv.Itoa(i))
	}
	e.enqueue(t, true, msgs...)
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	rt := pgtest.CountRoundTrips(cfg)
	pool := pgtest.PoolConfig(t, cfg)
	const poll = 50 * time.Millisecond
	client := breakerClient(t, time.Minute)
	r, err := outbox.NewRelay(e.ob, pool, e.conn(t), client, outbox.RelayConfig{PollInterval: poll, Timeout: time.Second, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stop := runRelay(t, r)

	// The first pass: its batch refused by the breaker its own failures
	// opened, and given back.
	waitFor(t, "the first batch given back", func() (bool, string) {
		back := 0
		for _, row := range e.rows(t) {
			if row.attempts == 0 && row.nextIn > 0 {
				back++
			}
		}
		return back >= 16, strconv.Itoa(back) + " messages given back, want 16"
	})
	if st := client.Status(echoMethod).Breaker; st == nil || st.State != interceptor.BreakerOpen {
		t.Fatalf("the client's breaker: %+v, want open", st)
	}
	before, rt0 := e.rows(t), rt.N()
	// A window of real time, in which the relay polls: what it does in it
	// is the measure.
	const window = time.Second
	time.Sleep(window)
	trips, after := rt.N()-rt0, e.rows(t)
	stop()

	// Each poll is one round trip, two where a connection of the pool first
	// prepares the take: at most window/poll polls, and the pass that
	// followed the first (a full batch) if it had not ended.
	if limit := int64(window/poll) + 1 + 8; trips > limit {
		t.Errorf("round trips of the relay in %v with the breaker open = %d, want at most %d (its polls)", window, trips, limit)
	}
	changed := 0
	for i := range min(len(before), len(after)) {
		if b, a := before[i], after[i]; b.seq != a.seq || !b.next.Equal(a.next) || b.attempts != a.attempts {
			changed++
		}
	}
	if changed > 0 || len(before) != len(after) {
		t.Errorf("%d of %d messages were taken or given back while the breaker was open, want none", changed, len(before))
	}
	back := 0
	for _, row := range after {
		if row.attempts != 0 {
			t.Fatalf("message %d: %d attempts counted, want 0: the breaker's refusals are not the receiver's failures", row.seq, row.attempts)
		}
		if row.nextIn > 0 {
			back++
			// Due when the breaker lets a probe through: its RetryAfter.
			if row.nextIn < 50*time.Second || row.nextIn > time.Minute+time.Second {
				t.Errorf("message %d given back due in %v, want the breaker's minute", row.seq, row.nextIn)
			}
		}
	}
	if back != 16 {
		t.Errorf("%d messages given back, want one batch (16)", back)
	}
	if held := outbox.HeldMethods(r); !slices.Equal(held, []string{echoMethod}) {
		t.Errorf("held methods = %v, want [%s]", held, echoMethod)
	}
	t.Logf("%d round trips in %v with the breaker open", trips, window)
}

// TestRelayDeliversOtherMethodsWhileOneMethodsBreakerIsOpen: a method the
// breaker refuses holds back its own messages only; the receiver's other
// methods, queued behind a backlog of them, are delivered at once.
func TestRelayDeliversOtherMethodsWhileOneMethodsBreakerIsOpen(t *testing.T) {
	e := newEnv(t)
	e.answer = func(msg string, _ int) error {
		if msg[0] == 'd' { // "down-..."
			return status.Error(codes.Unavailable, "this method is down")
		}
		return nil
	}
	var down, up []string
	for i := range 64 {
		down = append(down, "down-"+strconv.Itoa(i))
	}
	for i := range 8 {
		up = append(up, "up-"+strconv.Itoa(i))
	}
	e.enqueue(t, true, down...)
	e.enqueueLookups(t, up...)
	client := breakerClient(t, time.Minute)
	r := e.relayWith(t, client, outbox.RelayConfig{PollInterval: 20 * time.Millisecond})
	stop := runRelay(t, r)
	waitFor(t, "the other method's messages", func() (bool, string) {
		got := e.receivedRows(t)
		n := 0
		for _, m := range up {
			n += got["lookup:"+m]
		}
		return n == len(up), strconv.Itoa(n) + " of " + strconv.Itoa(len(up)) + " delivered, the breaker of " + echoMethod + " open for a minute"
	})
	stop()
	got := e.receivedRows(t)
	for _, m := range up {
		if got["lookup:"+m] != 1 {
			t.Errorf("receiver's rows of %s = %d, want 1", m, got["lookup:"+m])
		}
	}
	executed := 0
	for _, m := range down {
		if v, ok := e.runs.Load(m); ok {
			executed += int(v.(*atomic.Int32).Load())
		}
	}
	if executed > 16 {
		t.Errorf("the down method ran %d times, want at most one batch's first attempts (16): its breaker was open", executed)
	}
	if held := outbox.HeldMethods(r); !slices.Equal(held, []string{echoMethod}) {
		t.Errorf("held methods = %v, want [%s]", held, echoMethod)
	}
	var left int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgtest.Ident(e.schema)+".resilience_outbox WHERE method = $1 AND dead_at IS NULL AND attempts = 0",
		echoMethod).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left < len(down)-16 {
		t.Errorf("%d messages of the down method kept with no attempt counted, want at least %d", left, len(down)-16)
	}
}

// TestRelayRecoversOnceTheReceiverIsBack: through an outage in which the
// breaker opens, lets a probe through that fails and opens again, every
// message is kept; once the receiver is back, the relay delivers every
// one, once, and holds nothing: no method, no message, no connection.
func TestRelayRecoversOnceTheReceiverIsBack(t *testing.T) {
	e := newEnv(t)
	e.stop()
	var msgs []string
	for i := range 40 {
		msgs = append(msgs, "back-"+strconv.Itoa(i))
	}
	e.enqueue(t, true, msgs...)
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolConfig(t, cfg)
	client := breakerClient(t, 200*time.Millisecond)
	r, err := outbox.NewRelay(e.ob, pool, e.conn(t), client, outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Timeout: 2 * time.Second,
		Lease: 10 * time.Second, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	stop := runRelay(t, r)
	waitFor(t, "the breaker to trip twice (a failed probe)", func() (bool, string) {
		st := client.Status(echoMethod).Breaker
		if st == nil {
			return false, "no breaker yet"
		}
		return st.Trips >= 2, strconv.FormatUint(st.Trips, 10) + " trips"
	})
	if rows := e.rows(t); len(rows) != len(msgs) {
		t.Fatalf("%d messages in the outbox during the outage, want all %d", len(rows), len(msgs))
	}
	lis, err := net.Listen("tcp", e.addr)
	if err != nil {
		t.Skipf("the receiver's port was taken meanwhile: %v", err)
	}
	e.start(t, lis)
	waitFor(t, "the outbox drained", func() (bool, string) {
		n := len(e.rows(t))
		return n == 0, strconv.Itoa(n) + " messages left"
	})
	stop()
	got := e.receivedRows(t)
	for _, m := range msgs {
		if got[m] != 1 {
			t.Errorf("receiver's rows of %s = %d, want 1", m, got[m])
		}
	}
	if len(got) != len(msgs) {
		t.Errorf("receiver's rows: %d messages, want %d", len(got), len(msgs))
	}
	if held := outbox.HeldMethods(r); len(held) != 0 {
		t.Errorf("held methods after recovery = %v, want none", held)
	}
	if st := client.Status(echoMethod).Breaker; st == nil || st.State != interceptor.BreakerClosed {
		t.Errorf("the client's breaker after recovery: %+v, want closed", st)
	}
	if n := pool.Stat().AcquiredConns(); n != 0 {
		t.Errorf("relay's pool: %d connections acquired after Run returned, want 0", n)
	}
}

// TestRelayOnceHoldsAMethodTheClientRefusesWithoutSayingUntilWhen: a
// refusal without a RetryAfter (a breaker forced open) gives its message
// back due at once, uncounted, and holds its method for InitialBackoff:
// passes of Once within it take nothing; once the breaker admits calls
// again, the message is delivered.
func TestRelayOnceHoldsAMethodTheClientRefusesWithoutSayingUntilWhen(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, true, "forced")
	client := breakerClient(t, time.Minute)
	if err := client.ForceOpen(echoMethod); err != nil {
		t.Fatal(err)
	}
	r := e.relayWith(t, client, outbox.RelayConfig{InitialBackoff: 200 * time.Millisecond})
	ctx := context.Background()
	if n, err := r.Once(ctx); n != 0 || err != nil {
		t.Fatalf("Once with the breaker forced open = %d, %v, want 0, nil", n, err)
	}
	first := e.rows(t)
	if len(first) != 1 || first[0].attempts != 0 || first[0].nextIn > 0 {
		t.Fatalf("the refused message: %+v, want it given back due at once, no attempt counted", first)
	}
	if held := outbox.HeldMethods(r); !slices.Equal(held, []string{echoMethod}) {
		t.Fatalf("held methods = %v, want [%s]", held, echoMethod)
	}
	if n, err := r.Once(ctx); n != 0 || err != nil {
		t.Fatalf("Once while the method is held = %d, %v, want 0, nil", n, err)
	}
	if again := e.rows(t); !again[0].next.Equal(first[0].next) || again[0].attempts != 0 {
		t.Errorf("a pass while the method was held took its message: %+v, then %+v", first[0], again[0])
	}
	closeAndDeliverOne(t, client, r, "the message delivered after the hold")
	if got := e.receivedRows(t); got["forced"] != 1 {
		t.Errorf("receiver's rows = %v, want forced once", got)
	}
}

// closeAndDeliverOne forces the breaker of echoMethod closed and runs
// passes of r until one delivers a message.
func closeAndDeliverOne(t *testing.T, client *interceptor.Client, r *outbox.Relay, what string) {
	t.Helper()
	if err := client.ForceClosed(echoMethod); err != nil {
		t.Fatal(err)
	}
	waitFor(t, what, func() (bool, string) {
		n, err := r.Once(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n == 1, "Once = " + strconv.Itoa(n)
	})
}

// TestRelayBulkheadRefusalIsNotTheReceiversAnswer: deliveries the client's
// bulkhead refuses (RESOURCE_EXHAUSTED, raised on the client, nothing
// sent) are given back uncounted and delivered in later passes, even with
// RetryableCodes that leave RESOURCE_EXHAUSTED out: they are never marked
// dead as if the receiver had refused them.
func TestRelayBulkheadRefusalIsNotTheReceiversAnswer(t *testing.T) {
	e := newEnv(t)
	msgs := []string{"slot-0", "slot-1", "slot-2", "slot-3"}
	e.enqueue(t, true, msgs...)
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the receiver stops: a failed test must not leave the handler waiting
	var inHandler atomic.Int32
	e.answer = func(string, int) error {
		if inHandler.Add(1) == 1 {
			<-gate // the first delivery holds the only slot while the others are refused
		}
		return nil
	}
	client, err := interceptor.NewClient(interceptor.WithMethodConfig(serviceconfig.MethodConfig{
		Name:     []serviceconfig.Name{{}},
		Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 1},
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	var (
		mu   sync.Mutex
		dead []string
	)
	r := e.relayWith(t, client, outbox.RelayConfig{
		Batch: 4, RetryableCodes: rescodes.Of(codes.Unavailable), InitialBackoff: 50 * time.Millisecond,
		OnDead: func(m outbox.Message, err error) { // called by the pass's deliveries, concurrently
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, m.ID+": "+err.Error())
		},
	})
	ctx := context.Background()
	done := make(chan int, 1)
	go func() {
		n, err := r.Once(ctx)
		if err != nil {
			t.Error(err)
		}
		done <- n
	}()
	waitFor(t, "the other three refused by the bulkhead and given back", func() (bool, string) {
		back := 0
		for _, row := range e.rows(t) {
			if row.attempts == 0 {
				back++
			}
		}
		return back == 3, strconv.Itoa(back) + " given back"
	})
	open()
	if n := <-done; n != 1 {
		t.Fatalf("first pass answered %d, want the one that had the slot", n)
	}
	if held := outbox.HeldMethods(r); len(held) != 0 {
		t.Errorf("held methods = %v, want none: the slot's delivery, admitted, ended last", held)
	}
	waitFor(t, "the outbox drained", func() (bool, string) {
		if _, err := r.Once(ctx); err != nil {
			t.Fatal(err)
		}
		n := len(e.rows(t))
		return n == 0, strconv.Itoa(n) + " messages left"
	})
	mu.Lock()
	defer mu.Unlock()
	if len(dead) != 0 {
		t.Errorf("messages marked dead: %v, want none: a bulkhead's refusal is not the receiver's", dead)
	}
	got := e.receivedRows(t)
	for _, m := range msgs {
		if got[m] != 1 {
			t.Errorf("receiver's rows of %s = %d, want 1", m, got[m])
		}
	}
}

// TestRelayKeepsAMessageTheClientsFallbackAnswered: a relay's client with a
// fallback (interceptor.WithFallback) answers a call its breaker refuses
// with the fallback's answer, though nothing reached the receiver. Before,
// the relay took a nil answer for the receiver's and deleted the message,
// never delivered; then it took an error answer (here FAILED_PRECONDITION,
// not worth retrying) for the receiver's refusal for good and marked the
// message dead. A delivery is the receiver's answer only when an attempt
// the relay invoked returned it: the message is given back uncounted, its
// method held, as for a refusal, or, when an attempt had failed before
// the refusal, retried after its backoff with that attempt counted; it is
// never dead, and it is delivered once the breaker lets calls through.
func TestRelayKeepsAMessageTheClientsFallbackAnswered(t *testing.T) {
	for _, tc := range []struct {
		name         string
		answer       error // the fallback's
		rejection    bool  // the fallback returns the rejection it was given
		failFirst    bool  // the receiver fails the first attempt, which trips the breaker
		wantAttempts int
	}{
		{name: "reply, nothing sent"},
		{name: "the rejection itself, nothing sent", rejection: true},
		{name: "error, nothing sent", answer: status.Error(codes.FailedPrecondition, "no cached reply")},
		{name: "error after a failed attempt", answer: status.Error(codes.FailedPrecondition, "no cached reply"),
			failFirst: true, wantAttempts: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.failFirst {
				e.answer = func(_ string, run int) error {
					if run == 1 {
						return status.Error(codes.Unavailable, "try later")
					}
					return nil
				}
			}
			e.enqueue(t, true, "fallback")
			var fallbacks atomic.Int32
			client, err := interceptor.NewClient(
				interceptor.WithMethodConfig(serviceconfig.MethodConfig{
					Name: []serviceconfig.Name{{}},
					RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 2, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
						RetryableStatusCodes: []codes.Code{codes.Unavailable}},
					CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: time.Minute},
				}),
				interceptor.WithFallback(func(_ context.Context, _ string, _, _ any, rejection error) error {
					fallbacks.Add(1)
					if tc.rejection {
						return rejection
					}
					return tc.answer // a cached or default reply, or an error
				}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Close() })
			if !tc.failFirst {
				if err := client.ForceOpen(echoMethod); err != nil {
					t.Fatal(err)
				}
			}
			var dead atomic.Int32
			r := e.relayWith(t, client, outbox.RelayConfig{InitialBackoff: 200 * time.Millisecond,
				OnDead: func(outbox.Message, error) { dead.Add(1) }})
			onceAnswers(t, r, &dead, 0, 0, "with the breaker open and a fallback",
				"the message the fallback answered is not dead: the fallback's error is not the receiver's")
			if fallbacks.Load() != 1 {
				t.Fatalf("fallback ran %d times, want 1: the test does not reach the danger", fallbacks.Load())
			}
			if rows := e.rows(t); len(rows) != 1 || rows[0].attempts != tc.wantAttempts {
				t.Fatalf("the message the fallback answered: %+v, want it kept, given back, %d attempts counted", rows, tc.wantAttempts)
			}
			if !tc.failFirst {
				if held := outbox.HeldMethods(r); !slices.Equal(held, []string{echoMethod}) {
					t.Errorf("held methods = %v, want [%s]", held, echoMethod)
				}
			}
			closeAndDeliverOne(t, client, r, "the message delivered once the breaker closed")
			if got, want := e.receivedRows(t), map[string]int{"fallback": 1}; !maps.Equal(got, want) {
				t.Errorf("receiver's rows = %v, want %v (a failed attempt's row is undone)", got, want)
			}
			if rows := e.rows(t); len(rows) != 0 {
				t.Errorf("outbox after delivery: %+v, want empty", rows)
			}
		})
	}
}
