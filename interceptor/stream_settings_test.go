package interceptor

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Settings that reach streams through a service's name or the default
// entry, where they do nothing: each is said once, naming the setting and
// the streams, and what the streams do instead is pinned over real gRPC.

// keysSeen returns the idempotency keys each method's attempts carried, by
// the method's last name.
func keysSeen(srv *testserver.Server) map[string][]string {
	out := make(map[string][]string)
	for _, a := range srv.Attempts() {
		m := a.Method[strings.LastIndexByte(a.Method, '/')+1:]
		out[m] = append(out[m], a.MD.Get(wire.IdempotencyKeyHeader)...)
	}
	return out
}

// TestIdempotencyKeysForAServiceWithStreamsNameTheStreams pins
// WithIdempotencyKeys given a service with streaming methods: the keys
// reach its unary methods only, and NewClient says so once, naming the
// streams. Before, the streams' calls carried a fresh key that a server's
// idempotency ignores (it runs a stream once per call, whatever its key):
// a setting that looked as if it protected them, in silence. Now a stream
// gets no key of the client's making; the caller's own key
// (ContextWithIdempotencyKey) still goes on every call.
func TestIdempotencyKeysForAServiceWithStreamsNameTheStreams(t *testing.T) {
	logger, rec := withRecorder()
	srv := &testserver.Server{}
	stub, _ := newEcho(t, srv, logger, WithIdempotencyKeys(echoService))
	const want = `interceptor: WithIdempotencyKeys("resilience.echo.v1.EchoService"): service resilience.echo.v1.EchoService ` +
		`has streaming methods (ServerStream, ClientStream, BidiStream), which get no key: keys apply to unary methods only ` +
		`(a server runs a stream once per call, whatever its key)`
	if got := rec.logged(); !slices.Equal(got, []string{want}) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}
	callEchoAndStream(t, stub)
	seen := keysSeen(srv)
	if k := seen["Echo"]; len(k) != 1 || len(k[0]) != 32 {
		t.Errorf("Echo carried keys %q, want one fresh key", k)
	}
	if k := seen["ServerStream"]; len(k) != 0 {
		t.Errorf("ServerStream carried keys %q, want none: a stream gets no key of the client's making", k)
	}
	callEchoAndStream(t, stub, "order-9")
	if k := keysSeen(srv)["ServerStream"]; !slices.Equal(k, []string{"order-9"}) {
		t.Errorf("ServerStream with the caller's own key carried %q, want [order-9]", k)
	}
}

// TestAutomaticIdempotencyKeysReachUnaryCallsOnly pins
// WithAutomaticIdempotencyKeys on streams: a unary call of a method not
// known to be idempotent gets a key, a stream none. Before, every stream
// carried a fresh key that did nothing on the server.
func TestAutomaticIdempotencyKeysReachUnaryCallsOnly(t *testing.T) {
	logger, rec := withRecorder()
	srv := &testserver.Server{}
	stub, _ := newEcho(t, srv, logger, WithAutomaticIdempotencyKeys())
	callEchoAndStream(t, stub)
	seen := keysSeen(srv)
	if k := seen["Echo"]; len(k) != 1 || len(k[0]) != 32 {
		t.Errorf("Echo carried keys %q, want one fresh key", k)
	}
	if k := seen["ServerStream"]; len(k) != 0 {
		t.Errorf("ServerStream carried keys %q, want none", k)
	}
	if got := rec.logged(); len(got) != 0 {
		t.Errorf("logged %q, want nothing: automatic keys are for unary calls, as documented", got)
	}
}

// callEchoAndStream makes one Echo call and one ServerStream call with
// stub, read to its end, each with key as the caller's own when given.
func callEchoAndStream(t *testing.T, stub echov1.EchoServiceClient, key ...string) {
	t.Helper()
	ctx := t.Context()
	if len(key) > 0 {
		ctx = ContextWithIdempotencyKey(ctx, key[0])
	}
	if _, err := stub.Echo(ctx, &echov1.EchoRequest{Message: "a"}); err != nil {
		t.Fatalf("Echo() = %v", err)
	}
	st, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Count: 1})
	if err != nil {
		t.Fatalf("ServerStream() = %v", err)
	}
	for {
		if _, err := st.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("ServerStream Recv() = %v", err)
		}
	}
}

// TestDefaultHedgingEntryNamesTheStreamsItCovers pins a hedgingPolicy on
// the default entry (name [{}]): it covers every streaming method no other
// entry names, and a stream is never hedged, so those run one attempt,
// without retries. NewClient says so once, naming the streams the registry
// describes under the entry (not those another entry names); before, it
// said nothing, and a stream failing UNAVAILABLE ran once under a config
// that looked as if it protected it. The service entry's warning leaves
// out a stream that an entry of its own names too.
func TestDefaultHedgingEntryNamesTheStreamsItCovers(t *testing.T) {
	logger, rec := withRecorder()
	srv := &testserver.Server{}
	srv.SetScript(failFirst(1, codes.Unavailable))
	hedge := &serviceconfig.HedgingPolicy{MaxAttempts: 3}
	stub, _ := newEcho(t, srv, logger, WithRetryBudget(nil),
		WithMethodConfig(
			serviceconfig.MethodConfig{Name: []serviceconfig.Name{{}}, HedgingPolicy: hedge},
			serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService, Method: "BidiStream"}}, RetryPolicy: fastPolicy(2)}))
	var under []string
	for _, fm := range rpcname.AllStreamMethods() {
		if fm != "/resilience.echo.v1.EchoService/BidiStream" {
			under = append(under, fm)
		}
	}
	if !slices.Contains(under, "/resilience.echo.v1.EchoService/ServerStream") {
		t.Fatalf("the registry's streams %q lack the echo service's", under)
	}
	want := "interceptor: WithMethodConfig: entry 0: HedgingPolicy: the default entry (name [{}]) covers streaming methods " +
		"that no other entry names (" + rpcname.List(under, maxListed) + "), which are never hedged: under this entry they run one attempt, without retries"
	if got := rec.logged(); !slices.Equal(got, []string{want}) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}

	st, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Count: 1})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unavailable || srv.Count("ServerStream") != 1 {
		t.Errorf("ServerStream under the default hedging entry = %v after %d attempts, want UNAVAILABLE after 1", err, srv.Count("ServerStream"))
	}

	logger, rec = withRecorder()
	newTestClient(t, logger, WithMethodConfig(
		serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}}, HedgingPolicy: hedge},
		serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService, Method: "ClientStream"}}, Timeout: 1}))
	const wantSvc = "interceptor: WithMethodConfig: entry 0: HedgingPolicy: service resilience.echo.v1.EchoService has streaming methods " +
		"(ServerStream, BidiStream), which are never hedged: under this entry they run one attempt, without retries"
	if got := rec.logged(); !slices.Equal(got, []string{wantSvc}) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), wantSvc)
	}
}

// TestDefaultHedgingEntryInAParsedConfigNamesItsJSONPath pins the
// warning's place for a parsed document, and for a resolver's config.
func TestDefaultHedgingEntryInAParsedConfigNamesItsJSONPath(t *testing.T) {
	const doc = `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Echo"}], "timeout": "1s"},
		{"name": [{}], "hedgingPolicy": {"maxAttempts": 2}}]}`
	logger, rec := withRecorder()
	c := newTestClient(t, logger, WithServiceConfig(mustParse(t, doc)))
	e := newResolverEnv(t, c, true)
	e.deliver(doc)
	for _, want := range []string{
		"interceptor: WithServiceConfig: methodConfig[1].hedgingPolicy: the default entry (name [{}]) covers streaming methods that no other entry names (",
		"interceptor: the resolver's service config: methodConfig[1].hedgingPolicy: the default entry (name [{}]) covers streaming methods that no other entry names (",
	} {
		if n := rec.count(want); n != 1 {
			t.Errorf("logged %q %d times, want once; logged:\n%s", want, n, strings.Join(rec.logged(), "\n"))
		}
	}
}

// TestHedgedStreamOfAnUnregisteredMethodIsLoggedAtItsFirstCall pins the
// stream a config check cannot see: a method no generated code registers
// (a hand-written grpc.ServiceDesc), under a hedging entry of its
// service. Its first stream call logs that it runs one attempt; later
// calls and unary calls of the service log nothing more.
func TestHedgedStreamOfAnUnregisteredMethodIsLoggedAtItsFirstCall(t *testing.T) {
	logger, rec := withRecorder()
	c := newTestClient(t, logger, WithMethodConfig(serviceconfig.MethodConfig{
		Name: []serviceconfig.Name{{Service: "zz.handwritten.Feed"}}, HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2}}))
	cc := testserver.Start(t, &testserver.Server{}, c.DialOptions()...)
	for range 2 {
		st, err := cc.NewStream(t.Context(), &grpc.StreamDesc{ServerStreams: true}, "/zz.handwritten.Feed/Watch")
		if err == nil {
			if err = st.SendMsg(&echov1.EchoRequest{}); err == nil {
				_ = st.CloseSend()
				err = st.RecvMsg(&echov1.EchoResponse{})
			}
		}
		if status.Code(err) != codes.Unimplemented {
			t.Fatalf("Watch = %v, want UNIMPLEMENTED from the echo server", err)
		}
		if err := cc.Invoke(t.Context(), "/zz.handwritten.Feed/Get", &echov1.EchoRequest{}, &echov1.EchoResponse{}); status.Code(err) != codes.Unimplemented {
			t.Fatalf("Get = %v, want UNIMPLEMENTED", err)
		}
	}
	want := []string{
		`interceptor: WithMethodConfig: entry 0: Name[0]: service "zz.handwritten.Feed" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`,
		"interceptor: /zz.handwritten.Feed/Watch: a stream under a hedgingPolicy, which never hedges a stream: it runs one attempt, " +
			"without retries (its method is not in protoregistry.GlobalFiles, so the config's check could not tell)",
	}
	if got := rec.logged(); !slices.Equal(got, want) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestFallbackForAServiceWithStreamsNamesTheStreams pins WithFallback
// given a service with streaming methods: a fallback answers unary calls
// only, and NewClient says so once, naming the streams it leaves alone.
func TestFallbackForAServiceWithStreamsNamesTheStreams(t *testing.T) {
	logger, rec := withRecorder()
	fallback := func(context.Context, string, any, any, error) error { return nil }
	newTestClient(t, logger, WithFallback(fallback, echoService))
	const want = `interceptor: WithFallback("resilience.echo.v1.EchoService"): service resilience.echo.v1.EchoService ` +
		`has streaming methods (ServerStream, ClientStream, BidiStream), which it does not answer: a fallback answers unary calls only ` +
		`(a stream's rejection is returned as it is)`
	if got := rec.logged(); !slices.Equal(got, []string{want}) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}
}
