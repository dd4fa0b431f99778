package server_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// principalKey is where an authentication interceptor puts the caller's
// principal, in these examples.
type principalKey struct{}

// principalScope is a scope function: the principal that authentication
// verified. A call that reaches it unauthenticated is refused.
func principalScope(ctx context.Context) (string, error) {
	if p, ok := ctx.Value(principalKey{}).(string); ok && p != "" {
		return p, nil
	}
	return "", status.Error(codes.Unauthenticated, "no principal")
}

// Idempotency on the server, with keys scoped by the authenticated caller:
// a keyed call retried three times runs its handler once, and the retries
// receive the first outcome.
func ExampleWithIdempotency() {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{
		Store: store,
		Scope: principalScope, // keys are per authenticated caller
		TTL:   time.Hour,
		// Methods of the service called below must carry a key; methods
		// without side effects could use KeyIgnored.
		KeyPolicies: map[string]server.KeyPolicy{"resilience.echo.v1.EchoService": server.KeyRequired},
	}))
	if err != nil {
		log.Fatal(err)
	}
	// Install it with grpc.ChainUnaryInterceptor(recovery, auth,
	// srv.UnaryServerInterceptor()). Here it is called directly.
	unary := srv.UnaryServerInterceptor()
	runs := 0
	handler := func(_ context.Context, req any) (any, error) {
		runs++
		return &echov1.EchoResponse{Message: fmt.Sprintf("order #%d for %s", runs, req.(*echov1.EchoRequest).Message)}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/resilience.echo.v1.EchoService/Echo"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.IdempotencyKeyHeader, "c0ffee-1"))
	ctx = context.WithValue(ctx, principalKey{}, "alice") // what auth would do
	for attempt := 1; attempt <= 3; attempt++ {
		resp, err := unary(ctx, &echov1.EchoRequest{Message: "alice"}, info, handler)
		fmt.Println(attempt, resp.(*echov1.EchoResponse).GetMessage(), err)
	}
	fmt.Println("handler runs:", runs)
	// Output:
	// 1 order #1 for alice <nil>
	// 2 order #1 for alice <nil>
	// 3 order #1 for alice <nil>
	// handler runs: 1
}

// The README's server setup: idempotency and deadline headroom on one
// Server, installed on a grpc.Server after recovery and authentication.
func ExampleNew() {
	store, err := idempotency.NewMemoryStore() // or redisstore.Open(ctx, redisClient) for many replicas
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(
		server.WithIdempotency(server.Idempotency{
			Store: store,
			// Keys are per caller: the verified client certificate (mTLS,
			// SPIFFE), or your authentication's principal (Scope: f).
			Scope: server.PeerScope,
		}),
		server.WithHeadroom(20*time.Millisecond, 5*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close() // after the grpc.Server has stopped: unregisters its gauges
	recovery := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req) // stands for a panic-recovery interceptor
	}
	auth := recovery // stands for authentication
	gs := grpc.NewServer(
		grpc.ChainUnaryInterceptor(recovery, auth, srv.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()),
	)
	defer gs.Stop()
	fmt.Println(len(gs.GetServiceInfo()))
	// Output: 0
}

// A server whose callers are not authenticated must say so: every caller
// shares one scope, so keys must be unguessable.
func ExampleSharedScope() {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	_, err = server.New(server.WithIdempotency(server.Idempotency{Store: store}))
	fmt.Println(err != nil) // no scope: refused
	srv, err := server.New(server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope}))
	fmt.Println(srv != nil, err)
	// Output:
	// true
	// true <nil>
}

// Metadata meant for one response only is not replayed to duplicates.
func ExampleIdempotency_omitMetadata() {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{
		Store:        store,
		Scope:        principalScope,
		OmitMetadata: []string{"set-cookie"},
	}))
	if err != nil {
		log.Fatal(err)
	}
	unary := srv.UnaryServerInterceptor()
	handler := func(ctx context.Context, req any) (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("set-cookie", "session=s3cr3t", "order-id", "42"))
		return &echov1.EchoResponse{Message: "placed"}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/resilience.echo.v1.EchoService/Echo"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.IdempotencyKeyHeader, "k-1"))
	ctx = context.WithValue(ctx, principalKey{}, "alice")
	for _, call := range []string{"first", "replay"} {
		stream := &headerRecorder{}
		_, err := unary(grpc.NewContextWithServerTransportStream(ctx, stream), &echov1.EchoRequest{}, info, handler)
		fmt.Println(call, stream.header.Get("order-id"), stream.header.Get("set-cookie"), err)
	}
	// Output:
	// first [42] [session=s3cr3t] <nil>
	// replay [42] [] <nil>
}

// A keyed handler runs detached from its caller's deadline by default, so
// that one that commits before it could notice the caller's deadline has
// its outcome stored, and a retry finds it instead of running it again.
// DetachedMax sets the server's bound instead.
func ExampleIdempotency_detachedMax() {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{
		Store:       store,
		Scope:       principalScope,
		DetachedMax: time.Minute, // the server's bound instead of the caller's (default 30 s)
	}))
	if err != nil {
		log.Fatal(err)
	}
	unary := srv.UnaryServerInterceptor()
	charges := 0
	handler := func(ctx context.Context, req any) (any, error) {
		charges++
		if err := ctx.Err(); err != nil { // the caller has gone: too late, the card is charged
			return nil, status.FromContextError(err).Err()
		}
		return &echov1.EchoResponse{Message: "charged"}, nil
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/resilience.echo.v1.EchoService/Echo"}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(wire.IdempotencyKeyHeader, "charge-7"))
	ctx = context.WithValue(ctx, principalKey{}, "alice")
	gone, cancel := context.WithCancel(ctx)
	cancel() // the caller gave up before the handler ran
	resp, err := unary(gone, &echov1.EchoRequest{}, info, handler)
	fmt.Println(resp.(*echov1.EchoResponse).GetMessage(), err)
	resp, err = unary(ctx, &echov1.EchoRequest{}, info, handler) // the retry
	fmt.Println(resp.(*echov1.EchoResponse).GetMessage(), err, "charges:", charges)
	// Output:
	// charged <nil>
	// charged <nil> charges: 1
}

// headerRecorder stands for grpc's stream in ExampleIdempotency_omitMetadata.
type headerRecorder struct{ header metadata.MD }

func (r *headerRecorder) Method() string { return "/resilience.echo.v1.EchoService/Echo" }
func (r *headerRecorder) SetHeader(md metadata.MD) error {
	r.header = metadata.Join(r.header, md)
	return nil
}
func (r *headerRecorder) SendHeader(md metadata.MD) error { return r.SetHeader(md) }
func (r *headerRecorder) SetTrailer(metadata.MD) error    { return nil }
