package outbox_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/outbox"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// A handler that charges and tells another service, in one transaction: the
// call's joined transaction when it is keyed, so that the message is
// written if and only if the charge and the call's record commit, and a
// replay of the call sends nothing again.
func ExampleOutbox_Enqueue() {
	var pool *pgxpool.Pool // the application's
	ob, err := outbox.New("public")
	if err != nil {
		log.Fatal(err)
	}
	charge := func(ctx context.Context, account string) error {
		return pgstore.InTx(ctx, pool, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO charges (account, amount) VALUES ($1, 10)", account); err != nil {
				return err
			}
			_, err := ob.Enqueue(ctx, tx, "/resilience.echo.v1.EchoService/Echo", &echov1.EchoRequest{Message: "charged " + account})
			return err
		})
	}
	_ = charge
}

// The relay of one replica: it delivers the outbox's messages to the
// receiving service through this module's client (retries, a breaker),
// each delivery keyed by its message's id, until its context ends. Dial
// the receiver plainly: the relay applies its client.
func ExampleNewRelay() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool, ""); err != nil { // creates the outbox table with the store's
		log.Fatal(err)
	}
	ob, err := outbox.New("")
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient("dns:///notifier.internal:443", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	relay, err := outbox.NewRelay(ob, pool, conn, nil, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer relay.Close()
	go func() { _ = relay.Run(ctx) }()
}
