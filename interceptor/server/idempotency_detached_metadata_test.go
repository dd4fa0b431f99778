package server

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyDetachedHandlerMetadataIsReplayed pins what a retry
// receives from a handler that finished after its caller left, against
// every store: the header and trailer the handler set. A keyed handler runs
// detached from its caller, so the usual path of a retry is a first
// attempt whose caller has gone while the handler goes on; the metadata
// the handler then set was passed first to the caller's grpc stream, which
// refuses it once the caller has gone (ErrIllegalHeaderWrite), and the
// capture returned that error without recording it: the stored outcome,
// and every replay, lacked the handler's header and trailer. Now metadata
// set after the caller has gone is recorded (and the handler gets no
// error), so the replay carries it.
func TestIdempotencyDetachedHandlerMetadataIsReplayed(t *testing.T) {
	forEachStore(t, []idemCase{{"SetAfterTheCallerLeft", testIdemDetachedMetadata}})
}

func testIdemDetachedMetadata(t *testing.T, env *idemEnv) {
	started := make(chan struct{}, 1) // the first handler runs
	gone := make(chan struct{})       // the first caller's server-side context has ended
	returned := make(chan error, 1)   // the first handler's grpc.SetHeader error, once it returned
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		started <- struct{}{}
		<-gone
		err := grpc.SetHeader(ctx, metadata.Pairs("x-h", "receipt-7"))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-t", "done"))
		returned <- err
		return &echov1.EchoResponse{Message: "charged"}, nil
	}}
	s, err := New(WithIdempotency(Idempotency{Scope: SharedScope, Store: env.store}))
	if err != nil {
		t.Fatal(err)
	}
	first := true
	watch := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if first { // the first call only; the retry comes after it
			first = false
			go func() { <-ctx.Done(); close(gone) }()
		}
		return h(ctx, req)
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(watch, s.UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, e)
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close(); gs.Stop(); <-served }()

	// The caller leaves once the handler runs: a 50ms deadline could end
	// before the call reached the server on a busy machine, and then no
	// handler ever ran and the test hung on returned.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	firstErr := make(chan error, 1)
	go func() { firstErr <- idemDo(ctx, cc, "charge-7", "10 EUR").err }()
	select {
	case <-started:
	case err := <-firstErr:
		t.Fatalf("first attempt = %v before its handler ran", err)
	}
	cancel()
	wantCode(t, "first attempt", <-firstErr, codes.Canceled, "")
	if err := <-returned; err != nil {
		t.Errorf("grpc.SetHeader in the handler after its caller left = %v, want nil (recorded for the replay)", err)
	}
	retry := idemDo(idemCtx(t), cc, "charge-7", "10 EUR")
	if retry.err != nil {
		t.Fatal(retry.err)
	}
	if !wire.IdempotencyReplayed(retry.header) || len(retry.header.Get("x-h")) != 1 || retry.header.Get("x-h")[0] != "receipt-7" ||
		len(retry.trailer.Get("x-t")) != 1 {
		t.Errorf("replay: header %v, trailer %v; want the handler's x-h: receipt-7 and x-t: done", retry.header, retry.trailer)
	}
	wantCalls(t, e, 1)
}
