package pgstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// A server whose keyed calls run in the transaction of their record:
// migrate once, open the store, and give its joined mode to the
// interceptor.
func Example_joined() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, ""); err != nil { // idempotent; or apply pgstore.SQL with your tool
		log.Fatal(err)
	}
	store, err := pgstore.Open(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close() // stops the reaper
	srv, err := server.New(server.WithIdempotency(server.Idempotency{
		Store: store.Joined(),
		Scope: server.PeerScope,
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, &shop{pool: pool})
	// ... gs.Serve(lis)
}

type shop struct {
	echov1.UnimplementedEchoServiceServer
	pool *pgxpool.Pool
}

// Echo charges. Its write commits with the call's record, or not at all,
// when the call is keyed; in a transaction of its own otherwise (a call
// without a key, a store that failed open): one code path, InTx.
func (s *shop) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	var id int64
	err := pgstore.InTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) error {
		return tx.QueryRow(ctx, "INSERT INTO charges (amount) VALUES ($1) RETURNING id", 10).Scan(&id)
	})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "charging: %v", err) // unstored: rolled back, retried
	}
	return &echov1.EchoResponse{Message: fmt.Sprint("charge ", id)}, nil
}

// A store and its business tables in a schema of their own, "billing":
// Migrate creates the store's tables there, WithSchema finds them, and the
// handler names its own table with the schema, quoted as an identifier
// (any schema name works, quotes and dollar signs included).
func ExampleWithSchema() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS billing"); err != nil {
		log.Fatal(err)
	}
	if err := pgstore.Migrate(ctx, pool, "billing"); err != nil { // reads the version; changes nothing when current
		log.Fatal(err)
	}
	store, err := pgstore.Open(ctx, pool, pgstore.WithSchema("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	charges := pgx.Identifier{"billing", "charges"}.Sanitize() // "billing"."charges"
	handler := func(ctx context.Context, amount int) error {
		return pgstore.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+charges+" (amount) VALUES ($1)", amount)
			return err
		})
	}
	_, _ = store.Joined(), handler // give store.Joined() to server.Idempotency.Store
}

// One code path for every call: in joined mode the function runs in the
// call's transaction (the interceptor commits it with the record; return
// an error to undo the writes), otherwise in a transaction of its own,
// committed when the function returns nil.
func ExampleInTx() {
	var pool *pgxpool.Pool // the application's
	handler := func(ctx context.Context, orderID string) error {
		return pgstore.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "UPDATE orders SET state = 'paid' WHERE id = $1", orderID); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO ledger (order_id) VALUES ($1)", orderID)
			return err
		})
	}
	_ = handler
}

// A completer for phased calls their callers abandoned: a payment made in
// the "pay" phase, whose order was never confirmed, is confirmed (the same
// phases run on, as a retry would have run them), and the outcome stored,
// instead of the call waiting 24 hours in progress. Run it on every
// replica: a call is taken by one at a time.
func ExampleNewCompleter() {
	var store *pgstore.JoinedStore // store.Joined()
	confirm := func(ctx context.Context, call pgstore.Abandoned) (proto.Message, error) {
		if call.FullMethod != "/shop.v1.Shop/Order" {
			return nil, pgstore.ErrLeave // not ours to finish
		}
		receipt, err := pgstore.Phase(ctx, "pay", func(context.Context, pgx.Tx) ([]byte, error) {
			return nil, status.Error(codes.Aborted, "never paid") // runs only if "pay" had not committed
		})
		if err != nil {
			return nil, err // stored as the call's outcome: its retry gets it
		}
		tx, _ := pgstore.Tx(ctx)
		if _, err := tx.Exec(ctx, "UPDATE orders SET state = 'confirmed' WHERE receipt = $1", string(receipt)); err != nil {
			return nil, pgstore.ErrLeave // try again at the next pass
		}
		return &echov1.EchoResponse{Message: "confirmed"}, nil
	}
	c, err := pgstore.NewCompleter(store, confirm, pgstore.CompleterConfig{Idle: 10 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = c.Run(context.Background()) }() // until its context ends
}

// A handler in phases: the order is committed before the payment
// provider is called, and the provider's call carries a key of its own, so
// a retry after a crash neither creates the order twice nor pays twice.
func ExamplePhase() {
	handler := func(ctx context.Context, amount int) error {
		order, err := pgstore.Phase(ctx, "create-order", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			var id string
			err := tx.QueryRow(ctx, "INSERT INTO orders (amount) VALUES ($1) RETURNING id::text", amount).Scan(&id)
			return []byte(id), err
		})
		if err != nil {
			return err
		}
		_, err = pgstore.Phase(ctx, "pay", func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			key, _ := pgstore.ForeignKey(ctx) // the same on every run of this phase of this call
			receipt, err := payments.Charge(ctx, key, amount)
			if err != nil {
				return nil, err
			}
			_, err = tx.Exec(ctx, "UPDATE orders SET receipt = $1 WHERE id = $2", receipt, string(order))
			return nil, err
		})
		return err
	}
	_ = handler
}

// payments stands for a foreign API that deduplicates by idempotency key.
var payments interface {
	Charge(ctx context.Context, idempotencyKey string, amount int) (receipt string, err error)
}

// Teams that apply migrations with their own tool take the SQL.
func ExampleSQL() {
	sql := pgstore.SQL("billing")
	fmt.Println(len(sql) > 0)
	// Output: true
}

// A pool of 20 connections serving joined-mode calls: one caller (scope)
// may hold at most 5 of them in open transactions, and all callers together
// 15, so that 5 are always left for lookups (every replay and every
// duplicate is one) and for the application's own statements. A claim past
// a bound waits for a slot, holding no connection, up to the lock timeout,
// then is refused with RESOURCE_EXHAUSTED and a retry hint; a replay is
// still answered.
func ExampleWithJoinedTxLimit() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig("postgres://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.Open(ctx, pool, pgstore.WithJoinedTxLimit(5, 15))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	_ = store.Joined() // give it to server.Idempotency.Store
}
