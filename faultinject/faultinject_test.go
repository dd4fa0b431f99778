package faultinject_test

import (
	"context"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/faultinject"
	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func newInjector(t *testing.T, cfg faultinject.Config, opts ...faultinject.Option) *faultinject.Injector {
	t.Helper()
	inj, err := faultinject.New(cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return inj
}

// serve starts the fake echo service behind the injector's server
// interceptors and returns its client.
func serve(t *testing.T, inj *faultinject.Injector, srv *resiliencetest.Server, dial ...grpc.DialOption) echov1.EchoServiceClient {
	t.Helper()
	conn := resiliencetest.Start(t, srv, dial,
		grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(inj.StreamServerInterceptor()))
	return echov1.NewEchoServiceClient(conn)
}

// codesOf calls Echo n times and returns the codes.
func codesOf(t *testing.T, ec echov1.EchoServiceClient, n int) []codes.Code {
	t.Helper()
	out := make([]codes.Code, n)
	for i := range out {
		_, err := ec.Echo(t.Context(), &echov1.EchoRequest{Message: "x"})
		out[i] = status.Code(err)
	}
	return out
}

func TestAbortRateIsSeededAndRepeatable(t *testing.T) {
	cfg := faultinject.Config{Seed: 42, Faults: []faultinject.Fault{{
		Methods: []string{"resilience.echo.v1.EchoService"},
		Abort:   &faultinject.Abort{Code: codes.Unavailable, Rate: 0.3},
	}}}
	first := codesOf(t, serve(t, newInjector(t, cfg), resiliencetest.NewServer()), 400)
	second := codesOf(t, serve(t, newInjector(t, cfg), resiliencetest.NewServer()), 400)
	failed := 0
	for i := range first {
		if first[i] != second[i] {
			t.Fatalf("call %d: %v with one injector, %v with another of the same seed", i, first[i], second[i])
		}
		if first[i] == codes.Unavailable {
			failed++
		}
	}
	// 400 draws at 0.3: mean 120, sd 9.2; the seed is fixed, so this only
	// guards against a rate that is ignored or inverted.
	if failed < 80 || failed > 160 {
		t.Errorf("%d of 400 calls aborted at rate 0.3", failed)
	}
}

func TestFaultsApplyToTheirMethodsOnly(t *testing.T) {
	inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{
		Methods: []string{"/resilience.echo.v1.EchoService/Lookup"},
		Abort:   &faultinject.Abort{Code: codes.Internal},
	}}})
	srv := resiliencetest.NewServer()
	ec := serve(t, inj, srv)
	if _, err := ec.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
		t.Errorf("Echo = %v, want no fault", err)
	}
	if _, err := ec.Lookup(t.Context(), &echov1.LookupRequest{}); status.Code(err) != codes.Internal {
		t.Errorf("Lookup = %v, want INTERNAL", err)
	}
	resiliencetest.RequireAttempts(t, srv, resiliencetest.LookupMethod, 1) // it arrived...
	if a := srv.Attempts(resiliencetest.LookupMethod); a[0].Handled {
		t.Error("the aborted Lookup reached the handler") // ...and the handler did not run
	}
	if got := inj.Counts(); got != (faultinject.Counts{Aborts: 1}) {
		t.Errorf("Counts = %+v, want one abort", got)
	}
}

// A negative pushback tells the client not to retry: the resilience client
// makes one attempt although UNAVAILABLE is retryable.
func TestPushbackReachesTheRetryPolicy(t *testing.T) {
	tests := []struct {
		name     string
		pushback time.Duration
		want     int // attempts the server saw reach the injector
	}{
		{"refuse", -time.Millisecond, 1},
		{"refuse below a millisecond", -time.Microsecond, 1},
		{"retry after", time.Millisecond, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{
				Abort: &faultinject.Abort{Code: codes.Unavailable, Pushback: tt.pushback},
			}}})
			client, err := interceptor.NewClient(interceptor.WithRetryPolicy(&serviceconfig.RetryPolicy{
				MaxAttempts: 3, InitialBackoff: time.Millisecond, RetryableStatusCodes: []codes.Code{codes.Unavailable},
			}))
			if err != nil {
				t.Fatal(err)
			}
			ec := serve(t, inj, resiliencetest.NewServer(), client.DialOptions()...)
			_, err = ec.Echo(t.Context(), &echov1.EchoRequest{})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("Echo = %v, want UNAVAILABLE", err)
			}
			if got := inj.Counts().Aborts; got != int64(tt.want) {
				t.Errorf("attempts aborted = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestRetryInfoDetail(t *testing.T) {
	inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{
		Abort: &faultinject.Abort{Code: codes.ResourceExhausted, RetryDelay: 1500 * time.Millisecond},
	}}})
	_, err := serve(t, inj, resiliencetest.NewServer()).Echo(t.Context(), &echov1.EchoRequest{})
	var ri *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if ri == nil || ri.GetRetryDelay().AsDuration() != 1500*time.Millisecond {
		t.Errorf("Echo = %v with RetryInfo %v, want a retry delay of 1.5s", err, ri)
	}
}

// The server side counts the request as a message: afterMessages 3 lets the
// request and two responses pass.
func TestStreamAbortAfterMessagesServerSide(t *testing.T) {
	inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{
		StreamAbort: &faultinject.StreamAbort{AfterMessages: 3, Code: codes.Unavailable},
	}}})
	got, err := readStream(t, serve(t, inj, resiliencetest.NewServer()))
	if got != 2 || status.Code(err) != codes.Unavailable {
		t.Errorf("ServerStream: %d responses then %v, want 2 then UNAVAILABLE", got, err)
	}
	if c := inj.Counts(); c.StreamAborts != 1 {
		t.Errorf("Counts = %+v, want one stream abort", c)
	}
}

// The client side counts what the caller sends and receives: afterMessages
// 3 lets the request and two responses pass, then cancels the stream.
func TestStreamAbortAfterMessagesClientSide(t *testing.T) {
	inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{
		StreamAbort: &faultinject.StreamAbort{AfterMessages: 3, Code: codes.Aborted},
	}}})
	conn := resiliencetest.Start(t, resiliencetest.NewServer(),
		[]grpc.DialOption{grpc.WithChainStreamInterceptor(inj.StreamClientInterceptor())})
	got, err := readStream(t, echov1.NewEchoServiceClient(conn))
	if got != 2 || status.Code(err) != codes.Aborted {
		t.Errorf("ServerStream: %d responses then %v, want 2 then ABORTED", got, err)
	}
}

func readStream(t *testing.T, ec echov1.EchoServiceClient) (int, error) {
	t.Helper()
	st, err := ec.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "m", Count: 5})
	if err != nil {
		return 0, err
	}
	n := 0
	for {
		if _, err := st.Recv(); err != nil {
			if err == io.EOF {
				err = nil
			}
			return n, err
		}
		n++
	}
}

// The client interceptor aborts before the call leaves and writes the
// pushback where grpc.Trailer asks for it.
func TestClientAbortSetsTheTrailer(t *testing.T) {
	inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{
		Abort: &faultinject.Abort{Code: codes.Unavailable, Pushback: 250 * time.Millisecond},
	}}})
	srv := resiliencetest.NewServer()
	conn := resiliencetest.Start(t, srv, []grpc.DialOption{grpc.WithChainUnaryInterceptor(inj.UnaryClientInterceptor())})
	var trailer metadata.MD
	_, err := echov1.NewEchoServiceClient(conn).Echo(t.Context(), &echov1.EchoRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || len(trailer.Get("grpc-retry-pushback-ms")) != 1 || trailer.Get("grpc-retry-pushback-ms")[0] != "250" {
		t.Errorf("Echo = %v with trailer %v, want UNAVAILABLE with grpc-retry-pushback-ms 250", err, trailer)
	}
	resiliencetest.RequireAttempts(t, srv, resiliencetest.EchoMethod, 0)
}

func TestMetadataFaultsAreOptIn(t *testing.T) {
	ask := metadata.Pairs(faultinject.MetadataAbort, "DATA_LOSS")
	tests := []struct {
		name string
		opts []faultinject.Option
		md   metadata.MD
		want codes.Code
	}{
		{"ignored without the option", nil, ask, codes.OK},
		{"honoured with it", []faultinject.Option{faultinject.WithMetadataFaults()}, ask, codes.DataLoss},
		{"percentage 0", []faultinject.Option{faultinject.WithMetadataFaults()},
			metadata.Pairs(faultinject.MetadataAbort, "DATA_LOSS", faultinject.MetadataAbortPercentage, "0"), codes.OK},
		{"bad value", []faultinject.Option{faultinject.WithMetadataFaults()},
			metadata.Pairs(faultinject.MetadataDelayMs, "soon"), codes.InvalidArgument},
		{"OK is no fault", []faultinject.Option{faultinject.WithMetadataFaults()},
			metadata.Pairs(faultinject.MetadataAbort, "OK"), codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ec := serve(t, newInjector(t, faultinject.Config{}, tt.opts...), resiliencetest.NewServer())
			_, err := ec.Echo(metadata.NewOutgoingContext(t.Context(), tt.md), &echov1.EchoRequest{})
			if status.Code(err) != tt.want {
				t.Errorf("Echo with %v = %v, want %v", tt.md, err, tt.want)
			}
		})
	}
}

func TestMetadataStreamAbort(t *testing.T) {
	ec := serve(t, newInjector(t, faultinject.Config{}, faultinject.WithMetadataFaults()), resiliencetest.NewServer())
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		faultinject.MetadataStreamAbortAfter, "2", faultinject.MetadataStreamAbortCode, "internal")
	st, err := ec.ServerStream(ctx, &echov1.ServerStreamRequest{Count: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("first Recv = %v", err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Internal {
		t.Errorf("second Recv = %v, want INTERNAL", err)
	}
}

// A delay runs on the clock of the caller's bubble, and ends with the
// caller's deadline.
func TestDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{Delay: &faultinject.Delay{Fixed: 5 * time.Second}}}})
		ec := serve(t, inj, resiliencetest.NewServer())
		start := time.Now()
		if _, err := ec.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 5*time.Second {
			t.Errorf("Echo took %v, want 5s", got)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := ec.Echo(ctx, &echov1.EchoRequest{}); status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("Echo with a 1s deadline = %v, want DEADLINE_EXCEEDED", err)
		}
		if got := inj.Counts().Delays; got != 2 {
			t.Errorf("delays = %d, want 2", got)
		}
	})
}

// An outage fails every call in the first Duration of each period, from
// the injector's creation, on the clock of WithNow.
func TestOutageWindows(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	inj := newInjector(t, faultinject.Config{Faults: []faultinject.Fault{{
		Outage: &faultinject.Outage{Every: 10 * time.Second, Duration: 2 * time.Second, Code: codes.Unavailable},
	}}}, faultinject.WithNow(func() time.Time { return now }))
	ec := serve(t, inj, resiliencetest.NewServer())
	start := now
	tests := []struct {
		at   time.Duration
		want codes.Code
	}{
		{0, codes.Unavailable},
		{2*time.Second - 1, codes.Unavailable},
		{2 * time.Second, codes.OK},
		{9*time.Second + 999*time.Millisecond, codes.OK},
		{10 * time.Second, codes.Unavailable},
		{11 * time.Second, codes.Unavailable},
		{12 * time.Second, codes.OK},
	}
	for _, tt := range tests {
		now = start.Add(tt.at) // calls are sequential: the server reads now after this write
		if got := codesOf(t, ec, 1)[0]; got != tt.want {
			t.Errorf("Echo at %v = %v, want %v", tt.at, got, tt.want)
		}
	}
}
