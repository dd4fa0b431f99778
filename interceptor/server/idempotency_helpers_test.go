package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// idemMaxRecord is the record bound of the stores under test.
const idemMaxRecord = 8 << 10

const idemEchoMethod = "/resilience.echo.v1.EchoService/Echo"

// idemEnv is one store under test, as the semantics tests see it.
type idemEnv struct {
	// store is fresh and isolated from other tests.
	store idempotency.Store
	// newStore returns another handle on the same records (a second
	// replica's client), or store itself for the memory store.
	newStore func() idempotency.Store
	// advance makes d pass for the store's leases and records.
	advance func(d time.Duration)
	// downStore returns a store whose every call fails (an outage).
	downStore func() idempotency.Store
	// fake is true inside a synctest bubble: time is fake.
	fake bool
	// joined is true for a store in joined mode (idempotency.TxStore): no
	// lease is renewed, and a duplicate waits on the owner's transaction,
	// up to the store's bound, then gets ABORTED.
	joined bool
}

// idemSUT is a kind of store; run gives each test its own env.
type idemSUT struct {
	name string
	// setup runs once per kind and returns the function that runs one test.
	setup func(t *testing.T) func(t *testing.T, f func(t *testing.T, env *idemEnv))
}

var idemSUTs = []idemSUT{
	{name: "memory", setup: func(*testing.T) func(*testing.T, func(*testing.T, *idemEnv)) {
		return func(t *testing.T, f func(*testing.T, *idemEnv)) {
			synctest.Test(t, func(t *testing.T) {
				s, err := idempotency.NewMemoryStore(idempotency.WithMaxRecordBytes(idemMaxRecord))
				if err != nil {
					t.Fatal(err)
				}
				f(t, &idemEnv{
					store:     s,
					newStore:  func() idempotency.Store { return s },
					advance:   func(d time.Duration) { time.Sleep(d) }, // fake time in the bubble
					downStore: func() idempotency.Store { return idemDownStore{} },
					fake:      true,
				})
			})
		}
	}},
	{name: "redis", setup: func(t *testing.T) func(*testing.T, func(*testing.T, *idemEnv)) {
		addr := redistest.Addr(t)
		return func(t *testing.T, f func(*testing.T, *idemEnv)) {
			prefix := redistest.Prefix(t)
			newStore := func() idempotency.Store {
				c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, PoolTimeout: 30 * time.Second})
				t.Cleanup(func() { _ = c.Close() })
				s, err := redisstore.New(c, redisstore.WithKeyPrefix(prefix), redisstore.WithMaxRecordBytes(idemMaxRecord))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			admin := redistest.Client(t, addr)
			f(t, &idemEnv{
				store:    newStore(),
				newStore: newStore,
				advance: func(d time.Duration) {
					if err := redistest.Advance(context.Background(), admin, prefix, d); err != nil {
						t.Fatal(err)
					}
				},
				downStore: func() idempotency.Store {
					c := redis.NewClient(&redis.Options{Addr: redistest.ClosedAddr(t), MaxRetries: -1})
					t.Cleanup(func() { _ = c.Close() })
					s, err := redisstore.New(c)
					if err != nil {
						t.Fatal(err)
					}
					return s
				},
			})
		}
	}},
}

// forEachStore runs each test of tests against every kind of store.
func forEachStore(t *testing.T, tests []idemCase) {
	for _, sut := range idemSUTs {
		t.Run(sut.name, func(t *testing.T) {
			run := sut.setup(t)
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) { run(t, tc.run) })
			}
		})
	}
}

type idemCase struct {
	name string
	run  func(t *testing.T, env *idemEnv)
}

// idemDownStore fails every call, as a store in an outage.
type idemDownStore struct{}

var errIdemDown = errors.New("store is down")

func (idemDownStore) Claim(context.Context, idempotency.RecordKey, []byte, time.Duration) (idempotency.Claim, error) {
	return idempotency.Claim{}, errIdemDown
}
func (idemDownStore) Complete(context.Context, idempotency.RecordKey, string, *idempotency.Record, time.Duration) error {
	return errIdemDown
}
func (idemDownStore) Renew(context.Context, idempotency.RecordKey, string, time.Duration) error {
	return errIdemDown
}
func (idemDownStore) Release(context.Context, idempotency.RecordKey, string) error {
	return errIdemDown
}

// idemSpy wraps a store and reports the claims that found a key in progress.
type idemSpy struct {
	idempotency.Store
	inProgress chan struct{} // receives, without blocking, after each InProgress claim
}

func newIdemSpy(s idempotency.Store) *idemSpy {
	return &idemSpy{Store: s, inProgress: make(chan struct{}, 1)}
}

func (s *idemSpy) Claim(ctx context.Context, k idempotency.RecordKey, fp []byte, lease time.Duration) (idempotency.Claim, error) {
	c, err := s.Store.Claim(ctx, k, fp, lease)
	if err == nil && c.State == idempotency.InProgress {
		select {
		case s.inProgress <- struct{}{}:
		default:
		}
	}
	return c, err
}

// idemEcho is the echo service with a scriptable Echo. It counts the calls
// its handler saw.
type idemEcho struct {
	echov1.UnimplementedEchoServiceServer
	calls atomic.Int64
	// fn, when set, answers Echo; by default Echo sets header x-h and
	// trailer x-t and echoes the request.
	fn func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error)
}

func (e *idemEcho) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	e.calls.Add(1)
	if e.fn != nil {
		return e.fn(ctx, req)
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-h", "header-"+req.Message))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-t", "trailer-"+req.Message, "x-t-bin", "\x00\x01\xff"))
	return &echov1.EchoResponse{Message: req.Message, Payload: req.Payload}, nil
}

func (e *idemEcho) Lookup(_ context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	e.calls.Add(1)
	return &echov1.LookupResponse{Message: req.Message}, nil
}

// idemLog collects log output.
type idemLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *idemLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *idemLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *idemLog) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// idemRecover turns a panic into INTERNAL, as a recovery interceptor
// installed outside the idempotency interceptor does.
func idemRecover(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = status.Errorf(codes.Internal, "panic: %v", r)
		}
	}()
	return h(ctx, req)
}

// idemInject stands for a client that sends bytes grpc-go's client refuses
// to send: it moves x-raw-key-bin into idempotency-key.
func idemInject(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if raw := md.Get("x-raw-key-bin"); len(raw) > 0 {
		md = md.Copy()
		md["idempotency-key"] = raw
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	return h(ctx, req)
}

// idemTenantScope reads the caller's scope from x-tenant metadata.
func idemTenantScope(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("x-tenant"); len(v) == 1 {
		if v[0] == "forbidden" {
			return "", status.Error(codes.PermissionDenied, "tenant forbidden")
		}
		return v[0], nil
	}
	return "", nil
}

// idemStart serves impl over bufconn behind a Server built with idempotency
// as idem says, and opts, and returns a client connection. Both are closed
// when t ends. The scope is shared (these callers are not authenticated)
// unless idem sets one. An idem without a Store serves without idempotency
// (the baseline of the benchmarks).
func idemStart(t testing.TB, impl echov1.EchoServiceServer, idem Idempotency, opts ...Option) *grpc.ClientConn {
	t.Helper()
	return idemStartDial(t, impl, nil, idem, opts...)
}

// idemStartDial is idemStart with the client connection's extra options,
// such as a Client's DialOptions.
func idemStartDial(t testing.TB, impl echov1.EchoServiceServer, dial []grpc.DialOption, idem Idempotency, opts ...Option) *grpc.ClientConn {
	t.Helper()
	_, cc := idemStartServerDial(t, impl, dial, idem, opts...)
	return cc
}

// idemStartServer is idemStart, returning the Server too.
func idemStartServer(t testing.TB, impl echov1.EchoServiceServer, idem Idempotency, opts ...Option) (*Server, *grpc.ClientConn) {
	t.Helper()
	return idemStartServerDial(t, impl, nil, idem, opts...)
}

func idemStartServerDial(t testing.TB, impl echov1.EchoServiceServer, dial []grpc.DialOption, idem Idempotency, opts ...Option) (*Server, *grpc.ClientConn) {
	t.Helper()
	if idem.Scope == nil {
		idem.Scope = SharedScope
	}
	if idem.Store != nil {
		opts = append([]Option{WithIdempotency(idem)}, opts...)
	}
	s, err := New(opts...)
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	sopts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(idemRecover, idemInject, s.UnaryServerInterceptor())}
	return s, testserver.StartWith(t, impl, sopts, dial...)
}

// idemCall is one Echo call's result, as raw reply bytes and metadata.
type idemCall struct {
	raw     []byte
	err     error
	header  metadata.MD
	trailer metadata.MD
}

// idemRawCodec hands the client the reply's bytes as they came off the wire.
type idemRawCodec struct{}

func (idemRawCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (idemRawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = bytes.Clone(data)
	return nil
}
func (idemRawCodec) Name() string { return "proto" }

// idemDo calls Echo with the given key ("" for none) and extra metadata
// pairs, bounded by a timeout.
func idemDo(ctx context.Context, cc *grpc.ClientConn, key, msg string, kv ...string) idemCall {
	if key != "" {
		kv = append(kv, "idempotency-key", key)
	}
	ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	var c idemCall
	c.err = cc.Invoke(ctx, idemEchoMethod, &echov1.EchoRequest{Message: msg}, &c.raw,
		grpc.ForceCodec(idemRawCodec{}), grpc.Header(&c.header), grpc.Trailer(&c.trailer))
	return c
}

// idemCtx is the context of a test's calls, cancelled when the test ends.
// It has no deadline: the calls take what the machine makes them take, and
// one that never ends is caught by go test's -timeout, with every
// goroutine's stack (inside synctest: as a deadlock). Regression: a 20s
// deadline shared by all of a test's calls ran out on a loaded machine
// before a flood of 3,200 calls, or a burst of 128 calls with 250 KB
// replies, was over, and the next call failed with DEADLINE_EXCEEDED.
func idemCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, what string, err error, want codes.Code, msgPart string) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: code = %v (%v), want %v", what, got, err, want)
	}
	if msgPart != "" && !strings.Contains(status.Convert(err).Message(), msgPart) {
		t.Errorf("%s: message %q does not contain %q", what, status.Convert(err).Message(), msgPart)
	}
}

func wantCalls(t *testing.T, e *idemEcho, want int64) {
	t.Helper()
	if got := e.calls.Load(); got != want {
		t.Errorf("handler ran %d times, want %d", got, want)
	}
}

func idemReply(t *testing.T, c idemCall) *echov1.EchoResponse {
	t.Helper()
	if c.err != nil {
		t.Fatalf("call error = %v, want success", c.err)
	}
	var r echov1.EchoResponse
	if err := proto.Unmarshal(c.raw, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// memoryIdemServer is a Server with idempotency on a fresh memory store
// and one scope for every caller.
func memoryIdemServer(tb testing.TB) *Server {
	tb.Helper()
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		tb.Fatal(err)
	}
	s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope}))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
