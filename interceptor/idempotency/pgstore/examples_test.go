package pgstore_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
	echov1.RegisterEchoServiceServer(gs, &shop{})
	// ... gs.Serve(lis)
}

type shop struct {
	echov1.UnimplementedEchoServiceServer
}

// Echo charges: its write commits with the call's record, or not at all.
func (shop) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	tx, ok := pgstore.Tx(ctx)
	if !ok { // a call without a key: this method requires one
		return nil, status.Error(codes.InvalidArgument, "send an idempotency-key")
	}
	var id int64
	if err := tx.QueryRow(ctx, "INSERT INTO charges (amount) VALUES ($1) RETURNING id", 10).Scan(&id); err != nil {
		return nil, status.Errorf(codes.Unavailable, "charging: %v", err) // unstored: rolled back, retried
	}
	return &echov1.EchoResponse{Message: fmt.Sprint("charge ", id)}, nil
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
// 15, so that 5 are always left for lookups (every replay is one) and for
// the application's own statements. A claim past a bound is refused at once
// with RESOURCE_EXHAUSTED and a retry hint; a replay is still answered.
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
