package server_test

import (
	"context"
	"fmt"
	"log"
	"testing"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/resiliencetest"
)

// panickyEcho panics on its first Echo and counts the runs of its handler.
type panickyEcho struct {
	echov1.UnimplementedEchoServiceServer
	runs int // written only by the handler; calls are sequential here
}

func (p *panickyEcho) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	p.runs++
	if p.runs == 1 {
		panic("first run fails")
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

// middlewareServerOptions is the server chain of the example and the test:
//
//	logging ─► recovery ─► selector(resilience: idempotency, headroom) ─► handler
//
// Logging is outermost, so it logs every call's final status, a recovered
// panic included. Recovery is outside resilience: the resilience
// interceptor releases an idempotency key's claim when the handler panics
// and lets the panic go on, and recovery turns it into INTERNAL, which is
// not stored, so a retry with the key runs the handler again (a recovery
// inside would store the INTERNAL and replay it). The selector scopes
// resilience to the services that want it (not health or reflection).
func middlewareServerOptions(srv *server.Server, logger logging.Logger, services ...string) grpc.ServerOption {
	scoped := selector.MatchFunc(func(_ context.Context, m interceptors.CallMeta) bool {
		for _, s := range services {
			if m.Service == s {
				return true
			}
		}
		return false
	})
	return grpc.ChainUnaryInterceptor(
		logging.UnaryServerInterceptor(logger, logging.WithLogOnEvents(logging.FinishCall)),
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(p any) error {
			return status.Errorf(codes.Internal, "recovered: %v", p)
		})),
		selector.UnaryServerInterceptor(srv.UnaryServerInterceptor(), scoped),
	)
}

// printCode logs each finished call's method and code.
var printCode = logging.LoggerFunc(func(_ context.Context, _ logging.Level, msg string, fields ...any) {
	var method, code any
	for i := 0; i+1 < len(fields); i += 2 {
		switch fields[i] {
		case "grpc.method":
			method = fields[i+1]
		case "grpc.code":
			code = fields[i+1]
		}
	}
	fmt.Println(msg, method, code)
})

// The server interceptor composed with go-grpc-middleware v2's logging,
// recovery and selector: a keyed call whose handler panics is retried and
// runs again; its success is then replayed.
func ExampleServer_UnaryServerInterceptor_goGRPCMiddleware() {
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(server.WithIdempotency(server.Idempotency{
		Store: store,
		// The example's callers are one principal; a real server scopes keys
		// by its authenticated caller (Scope: a function of the principal).
		Scope: server.SharedScope,
	}))
	if err != nil {
		log.Fatal(err)
	}
	impl := &panickyEcho{}
	conn, stop, err := resiliencetest.Serve(impl, nil, middlewareServerOptions(srv, printCode, "resilience.echo.v1.EchoService"))
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	ctx := metadata.AppendToOutgoingContext(context.Background(), wire.IdempotencyKeyHeader, "order-1")
	for range 3 { // the same keyed call, sent three times
		_, _ = echov1.NewEchoServiceClient(conn).Echo(ctx, &echov1.EchoRequest{Message: "hi"})
	}
	fmt.Println("handler runs:", impl.runs)
	// Output:
	// finished call Echo Internal
	// finished call Echo OK
	// finished call Echo OK
	// handler runs: 2
}

// TestServerComposesWithGoGRPCMiddleware pins the order explained on
// middlewareServerOptions: a recovered panic is not stored, a selected
// service is deduplicated, and a service outside the selector is not.
func TestServerComposesWithGoGRPCMiddleware(t *testing.T) {
	tests := []struct {
		name     string
		services []string
		wantRuns int // of three sends of one keyed call whose first run panics
	}{
		{"selected", []string{"resilience.echo.v1.EchoService"}, 2},
		{"not selected", []string{"other.Service"}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store, err := idempotency.NewMemoryStore()
			if err != nil {
				t.Fatal(err)
			}
			srv, err := server.New(server.WithIdempotency(server.Idempotency{Store: store, Scope: server.SharedScope}))
			if err != nil {
				t.Fatal(err)
			}
			var codesLogged []any
			logger := logging.LoggerFunc(func(_ context.Context, _ logging.Level, _ string, fields ...any) {
				for i := 0; i+1 < len(fields); i += 2 {
					if fields[i] == "grpc.code" {
						codesLogged = append(codesLogged, fields[i+1])
					}
				}
			})
			impl := &panickyEcho{}
			conn := resiliencetest.Start(t, impl, nil, middlewareServerOptions(srv, logger, tt.services...))
			ctx := metadata.AppendToOutgoingContext(t.Context(), wire.IdempotencyKeyHeader, "order-1")
			ec := echov1.NewEchoServiceClient(conn)
			_, err = ec.Echo(ctx, &echov1.EchoRequest{Message: "hi"})
			if status.Code(err) != codes.Internal {
				t.Fatalf("first Echo = %v, want INTERNAL from recovery", err)
			}
			for i := range 2 {
				if _, err := ec.Echo(ctx, &echov1.EchoRequest{Message: "hi"}); err != nil {
					t.Fatalf("Echo %d = %v, want success", i+2, err)
				}
			}
			if impl.runs != tt.wantRuns {
				t.Errorf("handler ran %d times, want %d", impl.runs, tt.wantRuns)
			}
			if want := []any{"Internal", "OK", "OK"}; fmt.Sprint(codesLogged) != fmt.Sprint(want) {
				t.Errorf("logging saw codes %v, want %v", codesLogged, want)
			}
		})
	}
}
