package server

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyKeyPolicyOnStreamingMethodRefusedByNew pins item 12b
// of issue 9: a key policy naming a streaming method that the protobuf
// registry knows is refused by New, with an error naming the field and
// the method, instead of being accepted and never enforced (a keyless
// client stream ran; the same key twice ran twice). Ignored, which is what a
// stream gets anyway, is accepted; so are service-wide policies, which apply
// to the service's unary methods.
func TestIdempotencyKeyPolicyOnStreamingMethodRefusedByNew(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	const svc = "/resilience.echo.v1.EchoService/"
	tests := []struct {
		method string
		policy KeyPolicy
		want   string // "" for no error
	}{
		{svc + "ClientStream", KeyRequired, `Idempotency.KeyPolicies["` + svc + `ClientStream"]: a client-streaming method`},
		{svc + "ServerStream", KeyRequired, `Idempotency.KeyPolicies["` + svc + `ServerStream"]: a server-streaming method`},
		{svc + "BidiStream", KeyOptional, `Idempotency.KeyPolicies["` + svc + `BidiStream"]: a bidirectional-streaming method`},
		{svc + "BidiStream", KeyIgnored, ""},
		{svc + "Echo", KeyRequired, ""},
		{"resilience.echo.v1.EchoService", KeyRequired, ""},
		{"/not.Registered/Stream", KeyRequired, ""}, // checked per call instead
	}
	for _, tt := range tests {
		_, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope, KeyPolicies: map[string]KeyPolicy{tt.method: tt.policy}}))
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("New(WithIdempotency(Idempotency{KeyPolicies: map[string]KeyPolicy{%q: %v}})) error = %v, want none", tt.method, tt.policy, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("New(WithIdempotency(Idempotency{KeyPolicies: map[string]KeyPolicy{%q: %v}})) error = %v, want one containing %q", tt.method, tt.policy, err, tt.want)
		}
	}
}

// TestIdempotencyKeyPolicyNamesAreCheckedAgainstTheRegistry pins issue
// 29, item 4: a key policy whose name matches nothing the program serves
// with generated code. A method its registered service lacks, a method's
// name given as a service and a message's name cannot be right: New
// refuses them, naming the policy (before, KeyRequired on a misspelt
// method was accepted, and the real method stayed KeyOptional). A service
// no code linked into the program registers may be served with a
// hand-written grpc.ServiceDesc: New accepts it and logs it once, naming
// the policy.
func TestIdempotencyKeyPolicyNamesAreCheckedAgainstTheRegistry(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		policy  string
		wantErr string
		wantLog string
	}{
		{"misspelt method", "/resilience.echo.v1.EchoService/Ecko",
			`server: Idempotency.KeyPolicies["/resilience.echo.v1.EchoService/Ecko"]: service resilience.echo.v1.EchoService has no method "Ecko" (did you mean "Echo"?)`, ""},
		{"a method's name as a service", "Echo",
			`server: Idempotency.KeyPolicies["Echo"]: "Echo" is not a registered service but the name of a method: "/resilience.echo.v1.EchoService/Echo"`, ""},
		{"a message as a service", "resilience.echo.v1.EchoRequest",
			`server: Idempotency.KeyPolicies["resilience.echo.v1.EchoRequest"]: "resilience.echo.v1.EchoRequest" is not a service but a message`, ""},
		{"unregistered service", "/shop.Orders/Pay", "",
			`server: Idempotency.KeyPolicies[\"/shop.Orders/Pay\"]: service \"shop.Orders\" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`},
		{"misspelt service", "resilience.echo.v1.EchoServic", "",
			`(did you mean \"resilience.echo.v1.EchoService\"?)`},
		{"registered method", "/resilience.echo.v1.EchoService/Lookup", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := new(idemLog)
			_, err := New(WithLogger(log.logger()), WithIdempotency(Idempotency{Store: store, Scope: SharedScope,
				KeyPolicies: map[string]KeyPolicy{tt.policy: KeyRequired, "": KeyOptional}}))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("New() = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New() = %v, want no error", err)
			}
			got := log.String()
			if tt.wantLog == "" && got != "" || strings.Count(got, tt.wantLog) != 1 || strings.Count(got, "\n") > 1 {
				t.Errorf("New() logged %q, want one line with %q", got, tt.wantLog)
			}
		})
	}
}

// rawUploadMethod is a client-streaming method that no protobuf descriptor
// describes, as a service registered with a hand-written grpc.ServiceDesc.
const rawUploadMethod = "/resilience.test.Raw/Upload"

// serveRawUpload serves rawUploadMethod behind srv's stream interceptor over
// bufconn and returns a connection to it and the count of handler runs.
func serveRawUpload(t *testing.T, srv *Server) (*grpc.ClientConn, *atomic.Int64) {
	t.Helper()
	var runs atomic.Int64
	desc := grpc.ServiceDesc{
		ServiceName: "resilience.test.Raw",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Upload", ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				runs.Add(1)
				return ss.SendMsg(&[]byte{})
			}}},
	}
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ChainStreamInterceptor(srv.StreamServerInterceptor()), grpc.ForceServerCodec(idemRawCodecV2{}))
	gs.RegisterService(&desc, struct{}{})
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close(); gs.Stop(); <-done })
	return cc, &runs
}

// idemRawCodecV2 passes *[]byte messages through as they are.
type idemRawCodecV2 struct{}

func (idemRawCodecV2) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (idemRawCodecV2) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (idemRawCodecV2) Name() string { return "proto" }

// TestIdempotencyKeyPolicyOnUnregisteredStreamFailsEachCall pins item 12b of
// issue 9 for streaming methods New cannot recognise: the stream
// interceptor fails each call of a method that a key policy names with
// FAILED_PRECONDITION naming the misconfiguration, and the handler does not
// run; before, a keyless stream ran and a keyed one ran every time.
func TestIdempotencyKeyPolicyOnUnregisteredStreamFailsEachCall(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []KeyPolicy{KeyRequired, KeyOptional, KeyIgnored} {
		srv, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope, KeyPolicies: map[string]KeyPolicy{rawUploadMethod: p}}))
		if err != nil {
			t.Fatalf("New(WithIdempotency(Idempotency{KeyPolicies: map[string]KeyPolicy{%q: %v}})) error = %v", rawUploadMethod, p, err)
		}
		cc, runs := serveRawUpload(t, srv)
		for _, key := range []string{"", "k", "k"} {
			ctx := idemCtx(t)
			if key != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, wire.IdempotencyKeyHeader, key)
			}
			err := func() error {
				cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, rawUploadMethod, grpc.ForceCodec(idemRawCodecV2{}))
				if err != nil {
					return err
				}
				if err := cs.CloseSend(); err != nil {
					return err
				}
				var reply []byte
				return cs.RecvMsg(&reply)
			}()
			if p == KeyIgnored {
				if err != nil {
					t.Errorf("policy %v, key %q: stream error = %v, want it to run", p, key, err)
				}
				continue
			}
			wantCode(t, fmt.Sprintf("policy %v, key %q", p, key), err, codes.FailedPrecondition, "Idempotency.KeyPolicies")
		}
		want := int64(0)
		if p == KeyIgnored {
			want = 3
		}
		if got := runs.Load(); got != want {
			t.Errorf("policy %v: stream handler ran %d times, want %d", p, got, want)
		}
	}
}

// TestKeyRequiredForAServiceWithStreamsNamesTheStreams pins issue 29's
// settings that do nothing on streams, on the server: KeyRequired for a
// service (or for "", every method) covers its unary methods only, so its
// streams run plainly, with a key or without one. New says so once,
// naming the streams the registry describes that no other policy names;
// before, nothing said that a keyless stream of a KeyRequired service
// runs. Over gRPC: a keyless Echo is refused, a keyless ServerStream runs.
func TestKeyRequiredForAServiceWithStreamsNamesTheStreams(t *testing.T) {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	const svc = "resilience.echo.v1.EchoService"
	tests := []struct {
		name     string
		policies map[string]KeyPolicy
		want     string // "" for no line
	}{
		{"service", map[string]KeyPolicy{svc: KeyRequired},
			`server: Idempotency.KeyPolicies[\"resilience.echo.v1.EchoService\"]: KeyRequired covers the unary methods of the service only: ` +
				`its streaming methods (ServerStream, ClientStream, BidiStream) run plainly, with a key or without one (idempotency keys apply to unary methods only)`},
		{"service with a stream named", map[string]KeyPolicy{svc: KeyRequired, "/" + svc + "/BidiStream": KeyIgnored},
			`its streaming methods (ServerStream, ClientStream) run plainly`},
		{"every method", map[string]KeyPolicy{"": KeyRequired},
			`server: Idempotency.KeyPolicies[\"\"]: KeyRequired covers unary methods only: the streaming methods that no other policy names (` +
				`/resilience.echo.v1.EchoService/BidiStream, /resilience.echo.v1.EchoService/ClientStream, /resilience.echo.v1.EchoService/ServerStream) run plainly`},
		{"every method, the service optional", map[string]KeyPolicy{"": KeyRequired, svc: KeyOptional}, ""},
		{"optional", map[string]KeyPolicy{svc: KeyOptional}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := new(idemLog)
			srv, err := New(WithLogger(log.logger()), WithIdempotency(Idempotency{Store: store, Scope: SharedScope, KeyPolicies: tt.policies}))
			if err != nil {
				t.Fatal(err)
			}
			got := log.String()
			if tt.want == "" && got != "" || strings.Count(got, tt.want) != 1 || strings.Count(got, "\n") > 1 {
				t.Fatalf("New() logged %q, want one line with %q", got, tt.want)
			}
			if tt.want == "" {
				return
			}
			ts := &testserver.Server{}
			cc := testserver.StartWith(t, ts, []grpc.ServerOption{
				grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()),
				grpc.ChainStreamInterceptor(srv.StreamServerInterceptor())})
			stub := echov1.NewEchoServiceClient(cc)
			_, err = stub.Echo(idemCtx(t), &echov1.EchoRequest{})
			wantCode(t, "a keyless Echo", err, codes.InvalidArgument, "idempotency")
			st, err := stub.ServerStream(idemCtx(t), &echov1.ServerStreamRequest{Count: 1})
			if err == nil {
				_, err = st.Recv()
			}
			if err != nil || ts.Count("ServerStream") != 1 {
				t.Errorf("a keyless ServerStream = %v after %d runs, want it to run once, as the warning says", err, ts.Count("ServerStream"))
			}
		})
	}
}
