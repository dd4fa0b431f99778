package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const echoMethod = "/resilience.echo.v1.EchoService/Echo"

// env is a sender's schema with the outbox, and a receiver: an echo
// service behind server-side idempotency in joined mode that writes one
// row per execution (received), on loopback TCP, which a test can stop
// and start again on its address.
type env struct {
	pool     *pgxpool.Pool
	schema   string
	ob       *outbox.Outbox
	received string // the receiver's table, quoted

	// answer, when set, decides the receiver's answer to a message, after
	// its write (a non-nil error undoes it, as a handler's error does).
	answer func(msg string, run int) error
	runs   sync.Map // message -> *atomic.Int32, executions

	addr string
	mu   sync.Mutex
	gs   *grpc.Server
	srv  *server.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pool := pgtest.Pool(t, pgtest.DSN(t))
	schema := pgtest.Schema(t, pool)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{pool: pool, schema: schema, ob: ob, received: pgtest.Ident(schema) + ".received"}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+e.received+" (key text NOT NULL, msg text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = lis.Addr().String()
	e.start(t, lis)
	t.Cleanup(e.stop)
	return e
}

// Echo is the receiver: it writes the message in the call's joined
// transaction, then answers as e.answer says.
func (e *env) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	v, _ := e.runs.LoadOrStore(req.Message, new(atomic.Int32))
	run := int(v.(*atomic.Int32).Add(1))
	tx, ok := pgstore.Tx(ctx)
	if !ok {
		return nil, status.Error(codes.FailedPrecondition, "no joined transaction: the delivery carried no key")
	}
	key := metadata.ValueFromIncomingContext(ctx, "idempotency-key")[0]
	if _, err := tx.Exec(ctx, "INSERT INTO "+e.received+" (key, msg) VALUES ($1, $2)", key, req.Message); err != nil {
		return nil, err
	}
	if e.answer != nil {
		if err := e.answer(req.Message, run); err != nil {
			return nil, err
		}
	}
	return &echov1.EchoResponse{Message: "got " + req.Message}, nil
}

// start serves the receiver on lis.
func (e *env) start(t *testing.T, lis net.Listener) {
	t.Helper()
	s, err := pgstore.New(e.pool, pgstore.WithSchema(e.schema))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{Store: s.Joined(), Scope: server.SharedScope,
		KeyPolicies: map[string]server.KeyPolicy{"": server.KeyRequired}}))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(e.loseFirstReplies, srv.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, &echoService{e: e})
	go func() { _ = gs.Serve(lis) }()
	e.mu.Lock()
	e.gs, e.srv = gs, srv
	e.mu.Unlock()
}

// loseReplies, when set, makes the receiver lose the reply of a message's
// first delivery after it committed: as a network that drops it.
var loseReplies atomic.Bool

func (e *env) loseFirstReplies(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err == nil && loseReplies.Load() {
		if md := metadata.ValueFromIncomingContext(ctx, "grpc-previous-rpc-attempts"); len(md) == 0 {
			return nil, status.Error(codes.Unavailable, "the reply was lost")
		}
	}
	return resp, err
}

// stop stops the receiver: its address refuses connections.
func (e *env) stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gs != nil {
		e.gs.Stop()
		_ = e.srv.Close()
		e.gs, e.srv = nil, nil
	}
}

type echoService struct {
	echov1.UnimplementedEchoServiceServer
	e *env
}

func (s *echoService) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	return s.e.Echo(ctx, req)
}

// Lookup is a second method of the receiver, with a breaker of its own on
// the relay's client: it does what Echo does, its message prefixed with
// "lookup:".
func (s *echoService) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	resp, err := s.e.Echo(ctx, &echov1.EchoRequest{Message: "lookup:" + req.Message})
	if err != nil {
		return nil, err
	}
	return &echov1.LookupResponse{Message: resp.Message}, nil
}

// conn dials the receiver, plainly: the relay applies its client.
func (e *env) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDisableRetry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// relay returns a relay of e's outbox to the receiver, through a client
// NewRelay makes of cfg.
func (e *env) relay(t *testing.T, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	return e.relayWith(t, nil, cfg)
}

// relayWith returns a relay of e's outbox to the receiver, through client
// (nil: one NewRelay makes of cfg), over a conn of its own, closed when
// the test ends.
func (e *env) relayWith(t *testing.T, client *interceptor.Client, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(e.ob, e.pool, e.conn(t), client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// onceAnswers runs one pass of r and fails the test at once unless the
// pass answered n messages without error and dead, the count of r's
// OnDead calls, is then wantDead. when says what the pass meets, why what
// a wrong count of dead messages means.
func onceAnswers(t *testing.T, r *outbox.Relay, dead *atomic.Int32, n, wantDead int, when, why string) {
	t.Helper()
	if got, err := r.Once(context.Background()); got != n || err != nil {
		t.Fatalf("Once %s = %d, %v, want %d answered, nil", when, got, err, n)
	}
	if got := int(dead.Load()); got != wantDead {
		t.Fatalf("OnDead called %d times %s, want %d: %s", got, when, wantDead, why)
	}
}

// enqueue writes messages msgs in one transaction, committed or not.
func (e *env) enqueue(t *testing.T, commit bool, msgs ...string) {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if _, err := e.ob.Enqueue(ctx, tx, echoMethod, &echov1.EchoRequest{Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		err = tx.Commit(ctx)
	} else {
		err = tx.Rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// drain runs passes of the relays until the outbox holds no due message,
// moving every backoff and lease to now between passes.
func (e *env) drain(t *testing.T, relays ...*outbox.Relay) {
	t.Helper()
	ctx := context.Background()
	for range 200 {
		var wg sync.WaitGroup
		for _, r := range relays {
			wg.Go(func() {
				if _, err := r.Once(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var left int
		if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgtest.Ident(e.schema)+".resilience_outbox WHERE dead_at IS NULL").Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		e.due(t)
	}
	t.Fatal("the outbox was not drained in 200 passes")
}

// due makes every message due now: their leases and backoffs over.
func (e *env) due(t *testing.T) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), "UPDATE "+pgtest.Ident(e.schema)+".resilience_outbox SET next_at = statement_timestamp()"); err != nil {
		t.Fatal(err)
	}
}

// received returns the receiver's rows per message.
func (e *env) receivedRows(t *testing.T) map[string]int {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT msg, count(*) FROM "+e.received+" GROUP BY msg")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var m string
		var n int
		if err := rows.Scan(&m, &n); err != nil {
			t.Fatal(err)
		}
		got[m] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestEnqueueRefusesWhatCannotBeDelivered: a message the relay could never
// deliver is refused when it is written, naming what is wrong.
func TestEnqueueRefusesWhatCannotBeDelivered(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	tests := []struct {
		method string
		req    *echov1.EchoRequest
		want   string
	}{
		{"resilience.echo.v1.EchoService/Echo", &echov1.EchoRequest{}, "not a full method"},
		{"/resilience.echo.v1.EchoService", &echov1.EchoRequest{}, "not a full method"},
		{"/nope.v1.Nope/Echo", &echov1.EchoRequest{}, "not in the protobuf registry"},
		{"/resilience.echo.v1.EchoService/Nope", &echov1.EchoRequest{}, "has no method Nope"},
		{"/resilience.echo.v1.EchoService/ServerStream", &echov1.EchoRequest{}, "streaming"},
		{"/resilience.echo.v1.EchoService/Lookup", &echov1.EchoRequest{}, "want resilience.echo.v1.LookupRequest"},
		{echoMethod, nil, "nil request"},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				var req *echov1.EchoRequest = tt.req
				if req == nil {
					_, err := e.ob.Enqueue(ctx, tx, tt.method, nil)
					return err
				}
				_, err := e.ob.Enqueue(ctx, tx, tt.method, req)
				return err
			})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Enqueue(%q) = %v, want an error naming %q", tt.method, err, tt.want)
			}
		})
	}
}

// TestRelayDeliversEachMessageOnceThroughTheReceiversIdempotency: the
// messages of committed transactions are delivered, those of rolled-back
// ones never; every delivery of a message carries its id as the key, so
// that lost replies (the client retries) and two relays taking turns, and
// a relay that died holding messages (taken again once its lease passed),
// make at most one row per message on the receiver, and every message one.
func TestRelayDeliversEachMessageOnceThroughTheReceiversIdempotency(t *testing.T) {
	e := newEnv(t)
	var sent []string
	for i := range 4 {
		batch := []string{}
		for k := range 5 {
			batch = append(batch, "m"+strconv.Itoa(i*5+k))
		}
		e.enqueue(t, true, batch...)
		sent = append(sent, batch...)
	}
	e.enqueue(t, false, "rolled-back-1", "rolled-back-2")
	// A relay that died after taking a batch: its messages wait out its lease.
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, "UPDATE "+pgtest.Ident(e.schema)+".resilience_outbox SET next_at = statement_timestamp() + interval '1 hour', "+
		"attempts = attempts + 1 WHERE seq IN (SELECT seq FROM "+pgtest.Ident(e.schema)+".resilience_outbox ORDER BY seq LIMIT 3)"); err != nil {
		t.Fatal(err)
	}
	loseReplies.Store(true)
	defer loseReplies.Store(false)
	a, b := e.relay(t, outbox.RelayConfig{Batch: 4}), e.relay(t, outbox.RelayConfig{Batch: 4})
	e.drain(t, a, b)
	got := e.receivedRows(t)
	for _, m := range sent {
		if got[m] != 1 {
			t.Errorf("receiver's rows of %s = %d, want 1", m, got[m])
		}
	}
	if got["rolled-back-1"]+got["rolled-back-2"] != 0 {
		t.Errorf("messages of a rolled-back transaction were delivered: %v", got)
	}
	var retried int
	e.runs.Range(func(_, v any) bool {
		if v.(*atomic.Int32).Load() > 1 {
			retried++
		}
		return true
	})
	if retried > 0 {
		t.Errorf("%d messages ran twice on the receiver, want each once (replays for the rest)", retried)
	}
}

// TestRelayMarksRefusedMessagesDeadAndRetriesTheRest: a message the
// receiver refuses for good (INVALID_ARGUMENT) is marked dead, kept, and
// reported; one it fails for now (UNAVAILABLE, through every attempt of
// the client) is retried after its backoff, and delivered once the
// receiver answers.
func TestRelayMarksRefusedMessagesDeadAndRetriesTheRest(t *testing.T) {
	e := newEnv(t)
	var flaky atomic.Int32
	e.answer = func(msg string, _ int) error {
		switch {
		case msg == "bad":
			return status.Error(codes.InvalidArgument, "no such account")
		case msg == "flaky" && flaky.Add(1) <= 4: // the client's 4 attempts, of the first pass
			return status.Error(codes.Unavailable, "try later")
		}
		return nil
	}
	e.enqueue(t, true, "bad", "flaky", "fine")
	var dead []string
	r := e.relay(t, outbox.RelayConfig{InitialBackoff: time.Hour, OnDead: func(m outbox.Message, err error) {
		dead = append(dead, m.ID+" "+status.Code(err).String())
	}})
	ctx := context.Background()
	if n, err := r.Once(ctx); err != nil || n != 2 {
		t.Fatalf("first pass = %d, %v, want 2 answered (fine delivered, bad refused)", n, err)
	}
	if len(dead) != 1 || !strings.HasSuffix(dead[0], "InvalidArgument") {
		t.Errorf("OnDead calls = %v, want the bad message's", dead)
	}
	q := pgtest.Ident(e.schema) + ".resilience_outbox"
	var deadN int
	var lastErr string
	if err := e.pool.QueryRow(ctx, "SELECT count(*), max(last_error) FROM "+q+" WHERE dead_at IS NOT NULL").Scan(&deadN, &lastErr); err != nil {
		t.Fatal(err)
	}
	if deadN != 1 || !strings.Contains(lastErr, "no such account") {
		t.Errorf("dead messages = %d (%q), want the bad one, with its error", deadN, lastErr)
	}
	var attempts int
	var wait time.Duration
	if err := e.pool.QueryRow(ctx, "SELECT attempts, next_at - statement_timestamp() FROM "+q+" WHERE dead_at IS NULL").Scan(&attempts, &wait); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || wait < 50*time.Minute {
		t.Errorf("the flaky message: attempts %d, due in %v; want 1, in about the hour of InitialBackoff", attempts, wait)
	}
	if n, err := r.Once(ctx); err != nil || n != 0 {
		t.Errorf("a pass before the backoff ends = %d, %v, want nothing taken", n, err)
	}
	e.due(t)
	if n, err := r.Once(ctx); err != nil || n != 1 {
		t.Fatalf("second pass, once due = %d, %v; want it delivered", n, err)
	}
	got := e.receivedRows(t)
	if got["fine"] != 1 || got["flaky"] != 1 || got["bad"] != 0 {
		t.Errorf("receiver's rows = %v, want fine and flaky once, bad never (its write undone with its error)", got)
	}
}

// TestRelayMessagesSurviveAReceiverOutage: while the receiver is down the
// messages stay (the breaker, once open, gives them back without counting
// an attempt), and are delivered once it is back.
func TestRelayMessagesSurviveAReceiverOutage(t *testing.T) {
	e := newEnv(t)
	e.stop()
	for i := range 6 {
		e.enqueue(t, true, "during-outage-"+strconv.Itoa(i))
	}
	r := e.relay(t, outbox.RelayConfig{Batch: 1, Timeout: time.Second, Lease: 10 * time.Second})
	ctx := context.Background()
	for range 8 {
		if n, err := r.Once(ctx); err != nil || n != 0 {
			t.Fatalf("pass while the receiver is down = %d, %v, want nothing answered", n, err)
		}
		e.due(t)
	}
	var left, maxAttempts int
	q := pgtest.Ident(e.schema) + ".resilience_outbox"
	if err := e.pool.QueryRow(ctx, "SELECT count(*), max(attempts) FROM "+q).Scan(&left, &maxAttempts); err != nil {
		t.Fatal(err)
	}
	if left != 6 || maxAttempts > 5 {
		t.Errorf("after the outage: %d messages, at most %d attempts each; want 6 kept, and the breaker's give-backs not counted", left, maxAttempts)
	}
	lis, err := net.Listen("tcp", e.addr)
	if err != nil {
		t.Skipf("the receiver's port was taken meanwhile: %v", err)
	}
	e.start(t, lis)
	deadline := time.Now().Add(30 * time.Second)
	for len(e.receivedRows(t)) < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("delivered %v 30s after the receiver came back, want all 6", e.receivedRows(t))
		}
		if _, err := r.Once(ctx); err != nil {
			t.Fatal(err)
		}
		e.due(t)
		time.Sleep(50 * time.Millisecond) // the breaker's open duration, and the reconnection
	}
	for m, n := range e.receivedRows(t) {
		if n != 1 {
			t.Errorf("receiver's rows of %s = %d, want 1", m, n)
		}
	}
}

// TestRelayRunStopsWithItsContext: Run delivers until its context ends,
// then returns the context's error, leaving no goroutine.
func TestRelayRunStopsWithItsContext(t *testing.T) {
	e := newEnv(t)
	e.enqueue(t, true, "run-1", "run-2")
	r := e.relay(t, outbox.RelayConfig{PollInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); len(e.receivedRows(t)) < 2; {
		if time.Now().After(deadline) {
			t.Fatal("Run did not deliver within 10s")
		}
		time.Sleep(10 * time.Millisecond) // Run's passes
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run() = %v, want context.Canceled", err)
	}
}

// TestNewRelayRefusesBadConfig names what is wrong.
func TestNewRelayRefusesBadConfig(t *testing.T) {
	e := newEnv(t)
	cc := e.conn(t)
	tests := []struct {
		name string
		cfg  outbox.RelayConfig
		want string
	}{
		{"NegativeBatch", outbox.RelayConfig{Batch: -1}, "Batch"},
		{"LeaseBelowTimeout", outbox.RelayConfig{Lease: time.Second, Timeout: 2 * time.Second}, "Lease"},
		{"LeaseBelowDefaultTimeout", outbox.RelayConfig{Lease: time.Second}, "Lease"},
		{"MaxBelowInitial", outbox.RelayConfig{InitialBackoff: time.Minute, MaxBackoff: time.Second}, "MaxBackoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := outbox.NewRelay(e.ob, e.pool, cc, nil, tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewRelay(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
			}
		})
	}
	if _, err := outbox.NewRelay(nil, e.pool, cc, nil, outbox.RelayConfig{}); err == nil {
		t.Error("NewRelay(nil outbox) = nil error")
	}
}
