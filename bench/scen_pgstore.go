package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/pgstore"
	resserver "github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// JoinedUnderLoad measures pgstore's joined mode under concurrent load:
// claims while Migrate runs (issue 31, finding 4), and how the pool's size
// bounds a burst of calls (finding 8).
func JoinedUnderLoad() Scenario {
	return Scenario{
		Name: "joined mode under load",
		Workload: "pgstore's joined mode behind server.New (one scope), over bufconn, on PostgreSQL 15 (loopback TCP, fsync on; " +
			"a cluster of its own, or $PG_DSN). Migrate: 16 callers, each a new key per call, whose handler writes one row and " +
			"holds its transaction 100 ms, for 3 phases each (pool of 48 connections, so no claim waits for a slot), without a " +
			"migration, with pgstore.Migrate run in a loop on the current schema (a rolling deploy's starts), and with the " +
			"statement the previous Migrate ran at every start (CREATE INDEX IF NOT EXISTS, which takes a SHARE lock); the claim " +
			"is ClaimTx, timed in the store. Pool sizing: 16 callers, a new key per call, a 5 ms handler, for 2 phases per pool " +
			"size (WithJoinedTxLimit's default shares of MaxConns); with duplicates, every key is sent by two callers at once.",
		Run: runJoinedUnderLoad,
	}
}

// timedJoined is a joined store whose claims are timed.
type timedJoined struct {
	*pgstore.JoinedStore
	mu     sync.Mutex
	claims []time.Duration
}

func (s *timedJoined) ClaimTx(ctx context.Context, key idempotency.RecordKey, fp []byte, lease time.Duration) (idempotency.Claim, idempotency.Txn, error) {
	start := time.Now()
	cl, txn, err := s.JoinedStore.ClaimTx(ctx, key, fp, lease)
	s.mu.Lock()
	s.claims = append(s.claims, time.Since(start))
	s.mu.Unlock()
	return cl, txn, err
}

func (s *timedJoined) take() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims
	s.claims = nil
	return c
}

// holdServer's handler writes one row in the call's transaction and holds
// it for hold, or, with a gate, until the gate is closed.
type holdServer struct {
	echov1.UnimplementedEchoServiceServer
	q       string
	hold    time.Duration
	gate    chan struct{}
	entered chan struct{} // with a gate: receives once a call holds it
}

func (h *holdServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	err := pgstore.InTx(ctx, nil, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+h.q+".charges (key) VALUES ($1)", req.Message)
		return err
	})
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	if h.gate != nil {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.gate
	} else {
		time.Sleep(h.hold) // the handler's own work, its transaction open
	}
	return &echov1.EchoResponse{Message: req.Message}, nil
}

// loadResult is what a closed-loop load of keyed calls got.
type loadResult struct {
	calls, exhausted, aborted, failed int
	latency                           []time.Duration
	elapsed                           time.Duration
}

// keyedLoad runs callers closed-loop for d: each call a new key (sent by
// dup callers at once when dup > 1).
func keyedLoad(ctx context.Context, c echov1.EchoServiceClient, callers, dup int, d time.Duration, prefix string) loadResult {
	var (
		mu  sync.Mutex
		res loadResult
		n   atomic.Int64
		wg  sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range callers / dup {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				key := prefix + strconv.Itoa(w) + "-" + strconv.Itoa(i) + "-" + strconv.FormatInt(n.Add(1), 10)
				var cw sync.WaitGroup
				for range dup {
					cw.Go(func() {
						cctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, wire.IdempotencyKeyHeader, key), 5*time.Second)
						t0 := time.Now()
						_, err := c.Echo(cctx, &echov1.EchoRequest{Message: key})
						lat := time.Since(t0)
						cancel()
						mu.Lock()
						res.calls++
						switch status.Code(err) {
						case codes.OK:
							res.latency = append(res.latency, lat)
						case codes.ResourceExhausted:
							res.exhausted++
						case codes.Aborted:
							res.aborted++
						default:
							res.failed++
						}
						mu.Unlock()
					})
				}
				cw.Wait()
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// joinedServer serves holdServer behind a joined store on a pool of
// maxConns, and returns its client, the timed store and a stop func.
func (e *storesEnv) joinedServer(ctx context.Context, maxConns int32, hold time.Duration, gate, entered chan struct{}, noWait bool) (echov1.EchoServiceClient,
	*timedJoined, *pgxpool.Pool, func(), error) {
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	s, err := pgstore.New(pool, pgstore.WithSchema(e.schema))
	if err != nil {
		pool.Close()
		return nil, nil, nil, nil, err
	}
	store := &timedJoined{JoinedStore: s.Joined()}
	srv, err := resserver.New(resserver.WithIdempotency(resserver.Idempotency{Store: store, Scope: resserver.SharedScope, NoWait: noWait}))
	if err != nil {
		pool.Close()
		return nil, nil, nil, nil, err
	}
	client, stopServer, err := serveHandler(&holdServer{q: pgx.Identifier{e.schema}.Sanitize(), hold: hold, gate: gate, entered: entered}, srv)
	if err != nil {
		_ = srv.Close()
		pool.Close()
		return nil, nil, nil, nil, err
	}
	return client, store, pool, func() { stopServer(); _ = srv.Close(); pool.Close() }, nil
}

func runJoinedUnderLoad(ctx context.Context, sz Size) ([]Table, error) {
	env, err := newStoresEnv(ctx)
	if err != nil {
		if os.Getenv("CI") != "" {
			return nil, err
		}
		reason := "(" + err.Error() + ")"
		return []Table{{Header: []string{"case", "claims"}, Rows: [][]string{{"all", reason}}}}, nil
	}
	defer env.close()
	migrate, err := migrateUnderLoad(ctx, env, sz)
	if err != nil {
		return nil, fmt.Errorf("migrate under load: %w", err)
	}
	pools, err := poolSizing(ctx, env, sz)
	if err != nil {
		return nil, fmt.Errorf("pool sizing: %w", err)
	}
	return []Table{migrate, pools}, nil
}

// migrateUnderLoad times the claims of 16 callers with 100 ms handlers
// without a migration, with Migrate looping, and with the previous
// release's start statement looping.
func migrateUnderLoad(ctx context.Context, env *storesEnv, sz Size) (Table, error) {
	t := Table{Title: "Claims while Migrate runs (16 callers, 100 ms handlers)",
		Header: []string{"case", "claims", "claim p50 (ms)", "claim p99 (ms)", "p99 vs none", "ABORTED", "other errors"}}
	client, store, pool, stop, err := env.joinedServer(ctx, 48, 100*time.Millisecond, nil, nil, false)
	if err != nil {
		return t, err
	}
	defer stop()
	q := pgx.Identifier{env.schema}.Sanitize()
	cases := []struct {
		name string
		loop func(ctx context.Context) error
	}{
		{"no migration", nil},
		{"pgstore.Migrate in a loop (schema current)", func(ctx context.Context) error { return pgstore.Migrate(ctx, pool, env.schema) }},
		{"the previous start's CREATE INDEX IF NOT EXISTS in a loop", func(ctx context.Context) error {
			_, err := pool.Exec(ctx, "CREATE INDEX IF NOT EXISTS resilience_idempotency_expires ON "+q+".resilience_idempotency (expires_at)")
			return err
		}},
	}
	warm := keyedLoad(ctx, client, 16, 1, sz.Phase/2, "warm-migrate-")
	_ = warm
	store.take()
	var base time.Duration
	for i, c := range cases {
		lctx, cancel := context.WithCancel(ctx)
		var loops sync.WaitGroup
		var loopErr error
		if c.loop != nil {
			loops.Go(func() {
				for lctx.Err() == nil {
					if err := c.loop(lctx); err != nil && lctx.Err() == nil {
						loopErr = err
						return
					}
				}
			})
		}
		res := keyedLoad(ctx, client, 16, 1, 3*sz.Phase, "migrate-"+strconv.Itoa(i)+"-")
		cancel()
		loops.Wait()
		if loopErr != nil {
			return t, fmt.Errorf("%s: %w", c.name, loopErr)
		}
		claims := store.take()
		p50, p99 := quantile(claims, 0.5), quantile(claims, 0.99)
		if i == 0 {
			base = p99
		}
		t.Rows = append(t.Rows, []string{c.name, strconv.Itoa(len(claims)), ms(p50), ms(p99), ratio(float64(p99) / float64(base)),
			strconv.Itoa(res.aborted), strconv.Itoa(res.failed + res.exhausted)})
	}
	t.Notes = []string{"Target (issue 31): claim p99 during Migrate at most 2× without, and no call ABORTED (every key is new: " +
		"none is a duplicate). Migrate reads the schema's version first and changes nothing on a current schema; the " +
		"previous release's index statement waited for every open joined transaction, and every claim waited behind it."}
	return t, nil
}

// poolSizing runs bursts of fast calls on pools of several sizes.
func poolSizing(ctx context.Context, env *storesEnv, sz Size) (Table, error) {
	t := Table{Title: "Pool size and a burst of joined calls (16 callers, 5 ms handlers)",
		Header: []string{"MaxConns", "callers per key", "calls/s", "answered", "RESOURCE_EXHAUSTED", "ABORTED", "p50 (ms)", "p99 (ms)"}}
	cases := []struct {
		maxConns int32
		dup      int
	}{{4, 1}, {8, 1}, {16, 1}, {32, 1}, {4, 2}, {16, 2}}
	for i, c := range cases {
		client, _, _, stop, err := env.joinedServer(ctx, c.maxConns, 5*time.Millisecond, nil, nil, false)
		if err != nil {
			return t, err
		}
		keyedLoad(ctx, client, 16, c.dup, sz.Phase/4, "warm-pool-"+strconv.Itoa(i)+"-")
		res := keyedLoad(ctx, client, 16, c.dup, 2*sz.Phase, "pool-"+strconv.Itoa(i)+"-")
		stop()
		answered := len(res.latency)
		t.Rows = append(t.Rows, []string{strconv.Itoa(int(c.maxConns)), strconv.Itoa(c.dup),
			strconv.FormatFloat(float64(answered)/res.elapsed.Seconds(), 'f', 0, 64), pct(float64(answered) / float64(res.calls)),
			pct(float64(res.exhausted) / float64(res.calls)), pct(float64(res.aborted) / float64(res.calls)),
			ms(quantile(res.latency, 0.5)), ms(quantile(res.latency, 0.99))})
		if res.failed > 0 {
			return t, fmt.Errorf("MaxConns %d: %d calls failed otherwise", c.maxConns, res.failed)
		}
	}
	t.Notes = []string{"A claim past WithJoinedTxLimit (by default half of MaxConns per scope, three quarters in all) waits " +
		"for a slot, holding no connection, up to the lock timeout (1 s), then is refused with RESOURCE_EXHAUSTED and a retry " +
		"hint; a duplicate of a call in progress holds no slot nor connection (one lookup; the interceptor polls). Before " +
		"issue 31, 293 of 320 calls were RESOURCE_EXHAUSTED on pgxpool's default pool (4 on 2 cores)."}
	return t, nil
}
