package server

import (
	"context"
	"fmt"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestLimitStreamNamesTakeNoCostClass pins the cost classes against
// method names a caller invents: a proxy (its UnknownServiceHandler runs
// the stream interceptor) whose streams are limited (Limits.Streams names
// the proxied service) gave each stream's method a cost class of the
// server's limit, though a stream gives no latency sample. 100 streams
// of invented names took all 63 classes, and every unary method of the
// server then shared class 0: a cheap one made an expensive one look
// queued again (issue 33, finding 1). Streams take no class now; the
// unary methods keep one each.
func TestLimitStreamNamesTakeNoCostClass(t *testing.T) {
	l := limitsOf(serviceconfig.ConcurrencyLimit{})
	l.Streams = []string{"shop.Proxy"}
	srv := newLimitServer(t, l)
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()),
		grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error { return nil }))
	echov1.RegisterEchoServiceServer(gs, newCostEcho(0))
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close(); gs.Stop(); <-done }()
	desc := &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
	for i := range 100 {
		st, err := cc.NewStream(t.Context(), desc, fmt.Sprintf("/shop.Proxy/Invented%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if err := st.RecvMsg(new(echov1.EchoResponse)); err == nil {
			t.Fatalf("stream %d: a message, want its end", i)
		}
	}
	client := echov1.NewEchoServiceClient(cc)
	if _, err := client.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Lookup(t.Context(), &echov1.LookupRequest{}); err != nil {
		t.Fatal(err)
	}
	lim := srv.limits.server
	echo, lookup := lim.class(echov1.EchoService_Echo_FullMethodName), lim.class(echov1.EchoService_Lookup_FullMethodName)
	if echo == 0 || lookup == 0 || echo == lookup {
		t.Errorf("after 100 streams of invented names, Echo has cost class %d and Lookup %d; want one each, not 0", echo, lookup)
	}
	for _, st := range srv.LimitStatuses() {
		if st.InFlight != 0 || st.Queued != 0 {
			t.Errorf("limit %q holds %d in flight, %d queued; want nothing held", st.Name, st.InFlight, st.Queued)
		}
	}
}
