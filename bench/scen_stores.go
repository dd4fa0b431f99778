package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore/pgtest"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	resserver "github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// IdempotencyStores measures what each idempotency store costs a handler
// that writes to PostgreSQL: the memory and Redis stores and pgstore's
// lease mode beside the handler's own transaction, pgstore's joined mode
// with the write in the record's transaction.
func IdempotencyStores() Scenario {
	return Scenario{
		Name: "idempotency stores",
		Workload: "A bufconn echo server whose handler writes one row to PostgreSQL 15 (loopback TCP, fsync on, " +
			"synchronous_commit on; a cluster of its own, or $PG_DSN) in its own transaction (BEGIN, INSERT, COMMIT), or, " +
			"with pgstore's joined mode, in the call's transaction (INSERT). Redis (loopback, or $REDIS_ADDR) for the Redis " +
			"store. server.New with each store and its defaults, one scope for all; the stores' pools are " +
			"warmed up (statements prepared). One caller, sequential unary calls with a 1 s deadline, Size.Pairs/4 each (1,000 at the default size). " +
			"First execution: a new key per call; replay: one key repeated. ms: the median call, client to client. " +
			"vs handler alone: the paired ratio (alternating blocks of 20) to the same handler without idempotency. " +
			"Round trips: per call, to PostgreSQL and Redis together, counted at the sockets (a pipeline is one; pgxpool's " +
			"health ping on acquire is off).",
		Run: runIdempotencyStores,
	}
}

// storesEnv is what the scenario runs against: PostgreSQL, Redis, and a
// schema with the store's tables and the business table.
type storesEnv struct {
	dsn, redisAddr string
	schema         string
	stop           []func()
}

func (e *storesEnv) close() {
	for i := len(e.stop) - 1; i >= 0; i-- {
		e.stop[i]()
	}
}

func newStoresEnv(ctx context.Context) (*storesEnv, error) {
	e := &storesEnv{dsn: os.Getenv("PG_DSN"), redisAddr: os.Getenv("REDIS_ADDR")}
	if e.dsn == "" {
		pg, err := pgtest.Launch("-c", "fsync=on", "-c", "full_page_writes=on")
		if err != nil {
			return nil, err
		}
		e.stop = append(e.stop, pg.Stop)
		e.dsn = pg.DSN
	}
	if e.redisAddr == "" {
		rs, err := redistest.Launch()
		if err != nil {
			e.close()
			return nil, err
		}
		e.stop = append(e.stop, rs.Stop)
		e.redisAddr = rs.Addr
	}
	pool, err := pgxpool.New(ctx, e.dsn)
	if err != nil {
		e.close()
		return nil, err
	}
	defer pool.Close()
	e.schema = "bench_stores_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	q := pgx.Identifier{e.schema}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+q); err != nil {
		e.close()
		return nil, err
	}
	e.stop = append(e.stop, func() {
		p, err := pgxpool.New(context.Background(), e.dsn)
		if err == nil {
			_, _ = p.Exec(context.Background(), "DROP SCHEMA "+q+" CASCADE")
			p.Close()
		}
	})
	if err := pgstore.Migrate(ctx, pool, e.schema); err != nil {
		e.close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+q+".charges (id bigserial PRIMARY KEY, key text NOT NULL)"); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// countedPool is a pool of one connection whose round trips are counted.
func (e *storesEnv) countedPool(ctx context.Context) (*pgxpool.Pool, *pgtest.RoundTrips, error) {
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = 1
	// No health ping on acquire (pgxpool pings a connection idle for a
	// second): the rows count the store's protocol, not the pool's checks.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	rt := pgtest.CountRoundTrips(cfg)
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	return p, rt, err
}

// storesSide is one server of the scenario: its client and the round-trip
// counters of its connections to PostgreSQL and Redis.
type storesSide struct {
	client echov1.EchoServiceClient
	rts    []func() int64 // round-trip counters of the side's connections
}

func (s *storesSide) roundTrips() int64 {
	var n int64
	for _, rt := range s.rts {
		n += rt()
	}
	return n
}

// chargeServer is the handler: one row, in the call's joined transaction
// when there is one, else in a transaction of its own on pool.
type chargeServer struct {
	echov1.UnimplementedEchoServiceServer
	pool *pgxpool.Pool
	q    string
}

func (c *chargeServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	insert := "INSERT INTO " + c.q + ".charges (key) VALUES ($1)"
	if tx, ok := pgstore.Tx(ctx); ok {
		if _, err := tx.Exec(ctx, insert, req.Message); err != nil {
			return nil, err
		}
		return &echov1.EchoResponse{Message: req.Message}, nil
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, insert, req.Message)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &echov1.EchoResponse{Message: req.Message}, nil
}

// serveCharges starts a bufconn server of the charge handler behind srv (nil: no
// interceptor) and returns its client.
func serveCharges(handlerPool *pgxpool.Pool, schema string, srv *resserver.Server) (echov1.EchoServiceClient, func(), error) {
	return serveHandler(&chargeServer{pool: handlerPool, q: pgx.Identifier{schema}.Sanitize()}, srv)
}

// serveHandler starts a bufconn server of h behind srv (nil: no
// interceptor) and returns its client.
func serveHandler(h echov1.EchoServiceServer, srv *resserver.Server) (echov1.EchoServiceClient, func(), error) {
	var opts []grpc.ServerOption
	if srv != nil {
		opts = append(opts, grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	}
	gs := grpc.NewServer(opts...)
	echov1.RegisterEchoServiceServer(gs, h)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet", grpc.WithDisableRetry(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		gs.Stop()
		return nil, nil, err
	}
	return echov1.NewEchoServiceClient(cc), func() { _ = cc.Close(); gs.Stop() }, nil
}

// The sides, in report order.
const (
	sideAlone  = "handler alone (its own transaction)"
	sideMemory = "memory store"
	sideRedis  = "Redis store"
	sideLease  = "PostgreSQL, lease mode"
	sideJoined = "PostgreSQL, joined mode (write in the record's transaction)"
)

// newSide builds one side. Every side's handler has a pool of its own, of
// one counted connection.
func (e *storesEnv) newSide(ctx context.Context, name string, stop *[]func()) (*storesSide, error) {
	handlerPool, handlerRT, err := e.countedPool(ctx)
	if err != nil {
		return nil, err
	}
	*stop = append(*stop, handlerPool.Close)
	side := &storesSide{rts: []func() int64{handlerRT.N}}
	var store idempotency.Store
	switch name {
	case sideMemory:
		store, err = idempotency.NewMemoryStore()
	case sideRedis:
		rc := redis.NewClient(&redis.Options{Addr: e.redisAddr})
		*stop = append(*stop, func() { _ = rc.Close() })
		side.rts = append(side.rts, redistest.CountRoundTrips(rc).N)
		store, err = redisstore.Open(ctx, rc, redisstore.WithKeyPrefix(e.schema+":"))
	case sideLease, sideJoined:
		var storePool *pgxpool.Pool
		var rt *pgtest.RoundTrips
		if name == sideJoined {
			storePool, rt = handlerPool, handlerRT // the handler writes through the call's transaction
		} else if storePool, rt, err = e.countedPool(ctx); err == nil {
			*stop = append(*stop, storePool.Close)
			side.rts = append(side.rts, rt.N)
		}
		if err != nil {
			return nil, err
		}
		var s *pgstore.Store
		if s, err = pgstore.New(storePool, pgstore.WithSchema(e.schema)); err == nil {
			store = s
			if name == sideJoined {
				store = s.Joined()
			}
		}
	}
	if err != nil {
		return nil, err
	}
	var srv *resserver.Server
	if store != nil {
		if srv, err = resserver.New(resserver.WithIdempotency(resserver.Idempotency{Store: store, Scope: resserver.SharedScope})); err != nil {
			return nil, err
		}
		*stop = append(*stop, func() { _ = srv.Close() })
	}
	client, stopServer, err := serveCharges(handlerPool, e.schema, srv)
	if err != nil {
		return nil, err
	}
	*stop = append(*stop, stopServer)
	side.client = client
	return side, nil
}

func runIdempotencyStores(ctx context.Context, sz Size) ([]Table, error) {
	env, err := newStoresEnv(ctx)
	if err != nil {
		if os.Getenv("CI") != "" {
			return nil, err
		}
		// Outside CI, a machine without PostgreSQL or Redis gets the
		// reason in the table, as a peer that cannot run does.
		reason := "(" + err.Error() + ")"
		return []Table{{Header: []string{"store", "first execution, ms"}, Rows: [][]string{{"all", reason}}}}, nil
	}
	defer env.close()
	var stop []func()
	defer func() {
		for i := len(stop) - 1; i >= 0; i-- {
			stop[i]()
		}
	}()
	names := []string{sideAlone, sideMemory, sideRedis, sideLease, sideJoined}
	sides := make(map[string]*storesSide, len(names))
	for _, name := range names {
		if sides[name], err = env.newSide(ctx, name, &stop); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	t := Table{Header: []string{"store", "first execution, ms", "vs handler alone", "round trips, first",
		"replay, ms", "round trips, replay", "round trips, duplicate in progress"}}
	alone := sides[sideAlone]
	var keys storesKeys
	for _, name := range names {
		row, err := storesRow(sz, name, sides[name], alone, &keys)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		row = append(row, "—")
		if name == sideJoined {
			rt, held, err := dupInProgress(ctx, env, storesCalls(sz))
			if err != nil {
				return nil, fmt.Errorf("%s, duplicate in progress: %w", name, err)
			}
			if held != 0 {
				return nil, fmt.Errorf("%s: a duplicate of a call in progress left %d connections held", name, held)
			}
			row[len(row)-1] = perCall(rt)
		}
		t.Rows = append(t.Rows, row)
	}
	t.Notes = []string{"Targets (issues 23, 31): joined mode adds at most one round trip to the handler's own transaction on a " +
		"first execution (its lookup; BEGIN, the claim, which pins the transaction's settings, and a savepoint share a " +
		"pipeline, as do the record and COMMIT), and a replay costs one (TestIdempotencyJoinedRoundTrips pins both). The " +
		"handler alone makes 3 (BEGIN, INSERT, COMMIT). A duplicate of a joined call in progress, on another server with " +
		"waiting off, costs one (its lookup sees the key's advisory lock held) and holds no connection after it."}
	return []Table{t}, nil
}

// storesKeys numbers the keys of every call of a run, so no two calls
// share one unless a replay wants it. The scenario's calls are sequential.
type storesKeys struct{ n int }

func (k *storesKeys) next() string {
	k.n++
	return "k" + strconv.Itoa(k.n)
}

// storesCall is one call with key, timed.
func storesCall(c echov1.EchoServiceClient, key string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), idemCallTimeout)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, wire.IdempotencyKeyHeader, key)
	start := time.Now()
	_, err := c.Echo(ctx, &echov1.EchoRequest{Message: key})
	return time.Since(start), err
}

// storesCalls is the number of timed calls per side and measure: a
// quarter of Size.Pairs (at least 40), since every first execution here
// commits to a disk (fsync on), and five sides at the full count took
// minutes on their own.
func storesCalls(sz Size) int { return max(sz.Pairs/4, 40) }

// storesRow measures one side: first executions (new keys) and replays (one
// key), each after a warm-up; the handler alone has no replay.
func storesRow(sz Size, name string, side, alone *storesSide, keys *storesKeys) ([]string, error) {
	n := storesCalls(sz)
	warm := max(n/10, 20)
	first := func() error { _, err := storesCall(side.client, keys.next()); return err }
	for range warm {
		if err := first(); err != nil {
			return nil, err
		}
	}
	vsAlone := "—"
	if side != alone {
		x, err := pairedRatio(n, func() error { _, err := storesCall(alone.client, keys.next()); return err }, first)
		if err != nil {
			return nil, err
		}
		vsAlone = ratio(x)
	}
	firstMs, firstRT, err := storesTimed(n, side, keys.next)
	if err != nil {
		return nil, err
	}
	row := []string{name, perCall(firstMs), vsAlone, perCall(firstRT), "—", "—"}
	if side == alone {
		return row, nil
	}
	key := keys.next()
	if _, err := storesCall(side.client, key); err != nil {
		return nil, err
	}
	replayMs, replayRT, err := storesTimed(n, side, func() string { return key })
	if err != nil {
		return nil, err
	}
	row[4], row[5] = perCall(replayMs), perCall(replayRT)
	return row, nil
}

// storesTimed makes n calls with the keys of key and returns the median
// call in ms and the round trips per call.
func storesTimed(n int, side *storesSide, key func() string) (medianMs, roundTrips float64, err error) {
	ds := make([]float64, 0, n)
	before := side.roundTrips()
	for range n {
		d, err := storesCall(side.client, key())
		if err != nil {
			return 0, 0, err
		}
		ds = append(ds, float64(d)/float64(time.Millisecond))
	}
	if len(ds) == 0 {
		return 0, 0, errors.New("no calls")
	}
	slices.Sort(ds)
	return ds[len(ds)/2], float64(side.roundTrips()-before) / float64(n), nil
}

// dupInProgress measures n duplicates of a joined call in progress, sent
// to another server with waiting off (ABORTED at once): the round trips to
// PostgreSQL per duplicate, and the connections the duplicate's pool holds
// after its answers.
func dupInProgress(ctx context.Context, env *storesEnv, n int) (roundTrips float64, held int, err error) {
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	// The owner's call, in progress until the gate closes.
	ownerClient, _, _, stopOwner, err := env.joinedServer(ctx, 4, 0, gate, entered, false)
	if err != nil {
		return 0, 0, err
	}
	defer stopOwner()
	dupPool, rt, err := env.countedPool(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer dupPool.Close()
	s, err := pgstore.New(dupPool, pgstore.WithSchema(env.schema))
	if err != nil {
		return 0, 0, err
	}
	srv, err := resserver.New(resserver.WithIdempotency(resserver.Idempotency{Store: s.Joined(), Scope: resserver.SharedScope, NoWait: true}))
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = srv.Close() }()
	dup, stopDup, err := serveHandler(&holdServer{q: pgx.Identifier{env.schema}.Sanitize(), gate: gate}, srv)
	if err != nil {
		return 0, 0, err
	}
	defer stopDup()
	key := "dup-in-progress"
	ownerDone := make(chan error, 1)
	go func() { // held until the gate closes, however long the duplicates take
		octx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, wire.IdempotencyKeyHeader, key), 10*time.Minute)
		defer cancel()
		_, err := ownerClient.Echo(octx, &echov1.EchoRequest{Message: key})
		ownerDone <- err
	}()
	defer func() {
		close(gate)
		if oerr := <-ownerDone; oerr != nil && err == nil {
			err = oerr
		}
	}()
	<-entered // the owner holds the key: its handler runs in its transaction
	// Warm-up: the connection made, the lookup prepared.
	for range 3 {
		if _, derr := storesCall(dup, key); status.Code(derr) != codes.Aborted {
			return 0, 0, fmt.Errorf("duplicate in progress = %v, want ABORTED", derr)
		}
	}
	before := rt.N()
	for range n {
		if _, derr := storesCall(dup, key); status.Code(derr) != codes.Aborted {
			return 0, 0, fmt.Errorf("duplicate in progress = %v, want ABORTED", derr)
		}
	}
	return float64(rt.N()-before) / float64(n), int(dupPool.Stat().AcquiredConns()), nil
}
