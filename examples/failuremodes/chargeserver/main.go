// Command chargeserver is the server process of the kill harness in
// examples/failuremodes (charge_kill_test.go): a gRPC server whose Echo
// method charges, writing business rows to PostgreSQL, behind the
// idempotency interceptor with one of three stores, and which can kill
// itself (SIGKILL) at a chosen point of a chosen call, so the harness can
// land kills where they hurt most: after the business commit, between the
// COMMIT and the reply.
//
// With -outbox-to, each charge also writes an outbox message (package
// pgstore/outbox) in the call's transaction, and the process runs a relay
// that delivers the messages to that address: another chargeserver with
// -store receiver, whose handler writes a delivery row per message in its
// own joined transaction, keyed by the message's id.
//
// It is a test program: its flags are the harness's, and it logs nothing
// but its listening address (and its relay's warnings, on stderr).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// The stores, as -store names them.
const (
	// joined: pgstore in joined mode; the charge row is written in the
	// call's transaction.
	storeJoined = "joined"
	// phases: pgstore in joined mode, the handler in phases: an order row,
	// then a foreign payment (a table written outside the call's
	// transaction, deduplicated by pgstore.ForeignKey) and a payment row,
	// then the charge row with the record.
	storePhases = "phases"
	// redis: redisstore; the charge row is written in a transaction of the
	// handler's own, committed before the handler returns.
	storeRedis = "redis"
	// receiver: pgstore in joined mode, the receiver of the charges' outbox
	// messages: a delivery row per message, in the call's transaction.
	storeReceiver = "receiver"
)

// The kill points, as -die-at names them (POINT:N, the Nth time the point
// is reached).
const (
	// pointWrite: in the handler, after the charge row was written (joined,
	// phases: not yet committed; redis: committed, the record not yet).
	pointWrite = "write"
	// pointCommit: after the idempotency interceptor has returned, so after
	// the COMMIT (or the record's Complete), before grpc sends the reply.
	pointCommit = "commit"
	// pointOrder, pointPay: in phases, right after the phase committed.
	pointOrder = "order"
	pointPay   = "pay"
)

type config struct {
	addr, dsn, schema, store, redisAddr string
	outboxTo                            string
	lease                               time.Duration
	dieAt                               string
	dieN                                int64
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chargeserver:", err)
		os.Exit(1)
	}
}

func run() error {
	var c config
	var dieAt string
	flag.StringVar(&c.addr, "addr", "127.0.0.1:0", "listen address")
	flag.StringVar(&c.dsn, "dsn", "", "PostgreSQL connection string")
	flag.StringVar(&c.schema, "schema", "public", "schema of the store and of the business tables")
	flag.StringVar(&c.store, "store", storeJoined, "joined, phases, redis or receiver")
	flag.StringVar(&c.outboxTo, "outbox-to", "", "joined, phases: write an outbox message per charge, delivered to this address")
	flag.StringVar(&c.redisAddr, "redis-addr", "", "Redis address, for -store redis")
	flag.DurationVar(&c.lease, "lease", time.Second, "the interceptor's lease")
	flag.StringVar(&dieAt, "die-at", "", "POINT:N: SIGKILL itself the Nth time POINT is reached (write, commit, order, pay)")
	flag.Parse()
	if dieAt != "" {
		point, n, ok := strings.Cut(dieAt, ":")
		nn, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil || nn < 1 {
			return fmt.Errorf("-die-at %q: want POINT:N", dieAt)
		}
		c.dieAt, c.dieN = point, nn
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(c.dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := openStore(ctx, &c, pool)
	if err != nil {
		return err
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{
		Store:       store,
		Scope:       server.SharedScope,
		Lease:       c.lease,
		KeyPolicies: map[string]server.KeyPolicy{"": server.KeyRequired},
	}))
	if err != nil {
		return err
	}
	defer srv.Close()
	k := &killer{point: c.dieAt, n: c.dieN}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(k.afterCommit, srv.UnaryServerInterceptor()))
	ch := &charger{c: &c, pool: pool, k: k, q: pgx.Identifier{c.schema}.Sanitize()}
	if c.outboxTo != "" {
		stop, err := ch.startRelay(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}
	echov1.RegisterEchoServiceServer(gs, ch)
	lis, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	fmt.Printf("grpc listening on %s\n", lis.Addr())
	return gs.Serve(lis)
}

func openStore(ctx context.Context, c *config, pool *pgxpool.Pool) (idempotency.Store, error) {
	switch c.store {
	case storeJoined, storePhases, storeReceiver:
		s, err := pgstore.Open(ctx, pool, pgstore.WithSchema(c.schema), pgstore.WithLockTimeout(300*time.Millisecond))
		if err != nil {
			return nil, err
		}
		return s.Joined(), nil
	case storeRedis:
		return redisstore.Open(ctx, redis.NewClient(&redis.Options{Addr: c.redisAddr}), redisstore.WithScopeQuota(0, 0))
	}
	return nil, fmt.Errorf("-store %q: want joined, phases, redis or receiver", c.store)
}

// killer kills the process the nth time its point is reached.
type killer struct {
	point string
	n     int64
	seen  atomic.Int64
}

// at kills the process when point is the killer's, the nth time.
func (k *killer) at(point string) {
	if point == k.point && k.seen.Add(1) == k.n {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // SIGKILL is not caught: the process is gone
	}
}

// afterCommit is the outermost interceptor: once the idempotency
// interceptor has returned a success, its COMMIT (or Complete) is done and
// the reply is not yet sent. (Replays pass here too; they count.)
func (k *killer) afterCommit(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err == nil {
		k.at(pointCommit)
	}
	return resp, err
}

type charger struct {
	echov1.UnimplementedEchoServiceServer
	c    *config
	pool *pgxpool.Pool
	k    *killer
	q    string         // the schema, quoted
	ob   *outbox.Outbox // with -outbox-to
}

// echoMethod is the method the outbox's messages are requests of: the
// receiver's Echo.
const echoMethod = "/resilience.echo.v1.EchoService/Echo"

// startRelay starts the relay of the outbox to -outbox-to; stop stops it.
func (s *charger) startRelay(ctx context.Context) (stop func(), err error) {
	if s.ob, err = outbox.New(s.c.schema); err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient("passthrough:///"+s.c.outboxTo, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.5, MaxDelay: 50 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(s.ob, s.pool, cc, nil, outbox.RelayConfig{Batch: 32, Lease: 3 * time.Second, Timeout: time.Second,
		PollInterval: 20 * time.Millisecond, InitialBackoff: 50 * time.Millisecond, MaxBackoff: 500 * time.Millisecond})
	if err != nil {
		_ = cc.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = relay.Run(rctx)
	}()
	return func() {
		cancel()
		<-done
		_ = relay.Close()
		_ = cc.Close()
	}, nil
}

// Echo charges the call's key and answers "charge <id>", the charge row's
// id.
func (s *charger) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	key := metadata.ValueFromIncomingContext(ctx, "idempotency-key")[0]
	var (
		id  int64
		err error
	)
	switch s.c.store {
	case storeJoined:
		id, err = s.chargeJoined(ctx, key)
	case storePhases:
		id, err = s.chargePhases(ctx, key)
	case storeRedis:
		id, err = s.chargeOwnTx(ctx, key)
	case storeReceiver:
		id, err = s.receive(ctx, key, req.GetMessage())
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "charging %s: %v", key, err)
	}
	return &echov1.EchoResponse{Message: "charge " + strconv.FormatInt(id, 10)}, nil
}

var errNoTx = errors.New("no joined transaction")

func (s *charger) chargeJoined(ctx context.Context, key string) (int64, error) {
	tx, ok := pgstore.Tx(ctx)
	if !ok {
		return 0, errNoTx
	}
	var id int64
	if err := tx.QueryRow(ctx, "INSERT INTO "+s.q+".charges (key) VALUES ($1) RETURNING id", key).Scan(&id); err != nil {
		return 0, err
	}
	if s.ob != nil {
		if _, err := s.ob.Enqueue(ctx, tx, echoMethod, &echov1.EchoRequest{Message: key}); err != nil {
			return 0, err
		}
	}
	s.k.at(pointWrite)
	return id, nil
}

// receive is the receiver's Echo: a delivery row for the charge the
// message names (msg), in the call's transaction, keyed by the message's
// idempotency key.
func (s *charger) receive(ctx context.Context, key, msg string) (int64, error) {
	tx, ok := pgstore.Tx(ctx)
	if !ok {
		return 0, errNoTx
	}
	var id int64
	err := tx.QueryRow(ctx, "INSERT INTO "+s.q+".deliveries (key, charge) VALUES ($1, $2) RETURNING id", key, msg).Scan(&id)
	return id, err
}

func (s *charger) chargePhases(ctx context.Context, key string) (int64, error) {
	if _, err := pgstore.Phase(ctx, pointOrder, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "INSERT INTO "+s.q+".orders (key) VALUES ($1)", key)
		return nil, err
	}); err != nil {
		return 0, err
	}
	s.k.at(pointOrder)
	if _, err := pgstore.Phase(ctx, pointPay, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		fkey, _ := pgstore.ForeignKey(ctx)
		// The foreign payment API: its own database, its own commit, and
		// it deduplicates by the key it is given.
		if _, err := s.pool.Exec(ctx, "INSERT INTO "+s.q+".foreign_calls (key, fkey) VALUES ($1, $2)", key, fkey); err != nil {
			return nil, err
		}
		if _, err := s.pool.Exec(ctx, "INSERT INTO "+s.q+".foreign_payments (fkey, key) VALUES ($1, $2) ON CONFLICT DO NOTHING", fkey, key); err != nil {
			return nil, err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+s.q+".payments (key, fkey) VALUES ($1, $2)", key, fkey)
		return nil, err
	}); err != nil {
		return 0, err
	}
	s.k.at(pointPay)
	return s.chargeJoined(ctx, key)
}

func (s *charger) chargeOwnTx(ctx context.Context, key string) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "INSERT INTO "+s.q+".charges (key) VALUES ($1) RETURNING id", key).Scan(&id)
	})
	if err != nil {
		return 0, err
	}
	s.k.at(pointWrite) // the charge is committed; the record is not
	return id, nil
}
