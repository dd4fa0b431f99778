package pgstore_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// echoFunc is an echo service whose Echo is fn, counting its executions.
type echoFunc struct {
	echov1.UnimplementedEchoServiceServer
	fn    func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error)
	calls atomic.Int64
}

func (e *echoFunc) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	e.calls.Add(1)
	return e.fn(ctx, req)
}

// serve serves e behind the idempotency interceptor of idem (SharedScope
// unless set) over bufconn, and returns its client; everything stops when
// t ends.
func serve(t *testing.T, e echov1.EchoServiceServer, idem server.Idempotency) echov1.EchoServiceClient {
	t.Helper()
	if idem.Scope == nil {
		idem.Scope = server.SharedScope
	}
	srv, err := server.New(server.WithIdempotency(idem))
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, e)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithDisableRetry(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		gs.Stop()
		_ = srv.Close()
	})
	return echov1.NewEchoServiceClient(cc)
}

// call calls Echo with msg and the idempotency key, within 10 s.
func call(t *testing.T, c echov1.EchoServiceClient, key, msg string) (*echov1.EchoResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "idempotency-key", key), 10*time.Second)
	defer cancel()
	return c.Echo(ctx, &echov1.EchoRequest{Message: msg})
}

// joinedStore returns a store in joined mode on a pool of its own (cfg,
// when set, edits its configuration) over schema of dsn.
func joinedStore(t *testing.T, dsn, schema string, cfg func(*pgxpool.Config), opts ...pgstore.Option) (*pgstore.JoinedStore, *pgxpool.Pool) {
	t.Helper()
	c, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != nil {
		cfg(c)
	}
	pool := pgtest.PoolConfig(t, c)
	s, err := pgstore.New(pool, append([]pgstore.Option{pgstore.WithSchema(schema)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return s.Joined(), pool
}

// countRows returns the rows of table (schema-qualified, quoted) whose key
// is key.
func countRows(t *testing.T, pool *pgxpool.Pool, table, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
