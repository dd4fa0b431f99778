package pgstore_test

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"
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

// crashCluster is a cluster of a test's own, to be crashed: the store's
// schema migrated in it, a table charges (key text NOT NULL) beside the
// store's, and synchronous_commit off for its database, the setting under
// test (a commit is acknowledged before its WAL reaches the disk).
type crashCluster struct {
	srv    *pgtest.Server
	admin  *pgxpool.Pool
	schema string
	table  string // charges, schema-qualified and quoted
}

// startCrashCluster starts a crashCluster, skipped under -short.
func startCrashCluster(t *testing.T) crashCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("starts and crashes a cluster of its own")
	}
	srv := pgtest.StartWith(t, "-c", "bgwriter_lru_maxpages=0")
	ctx := context.Background()
	admin := pgtest.Pool(t, srv.DSN)
	schema := pgtest.Schema(t, admin)
	if err := pgstore.Migrate(ctx, admin, schema); err != nil {
		t.Fatal(err)
	}
	table := pgtest.Ident(schema) + ".charges"
	for _, sql := range []string{"CREATE TABLE " + table + " (key text NOT NULL)",
		"ALTER DATABASE postgres SET synchronous_commit = off"} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	return crashCluster{srv: srv, admin: admin, schema: schema, table: table}
}

// stopWALWriter stops the cluster's WAL writer (SIGSTOP), so that nothing
// but a commit's own flush writes the WAL; the crash (Restart(true))
// kills it with the rest.
func (c crashCluster) stopWALWriter(t *testing.T) {
	t.Helper()
	var walWriter int
	if err := c.admin.QueryRow(context.Background(), "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").Scan(&walWriter); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(walWriter, syscall.SIGSTOP); err != nil {
		t.Fatalf("stopping the WAL writer: %v", err)
	}
}
