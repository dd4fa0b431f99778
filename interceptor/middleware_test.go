package interceptor

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestComposesWithGoGRPCMiddleware chains the client behind
// go-grpc-middleware's selector (retry only Lookup) and in front of its
// logging interceptor, which then logs every attempt.
func TestComposesWithGoGRPCMiddleware(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(failFirst(1, codes.Unavailable))
		c := newTestClient(t, WithRetryPolicy(fastPolicy(3)))
		var mu sync.Mutex
		var logged []string
		logger := logging.LoggerFunc(func(_ context.Context, _ logging.Level, msg string, fields ...any) {
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(msg, "finished") {
				logged = append(logged, msg)
			}
		})
		onlyLookup := selector.MatchFunc(func(_ context.Context, m interceptors.CallMeta) bool {
			return m.Method == "Lookup"
		})
		cc := testserver.Start(t, srv, grpc.WithDisableRetry(), grpc.WithChainUnaryInterceptor(
			selector.UnaryClientInterceptor(c.UnaryClientInterceptor(), onlyLookup),
			logging.UnaryClientInterceptor(logger),
		))
		stub := echov1.NewEchoServiceClient(cc)
		if _, err := stub.Lookup(t.Context(), &echov1.LookupRequest{}); err != nil {
			t.Errorf("Lookup() error = %v, want success after a retry", err)
		}
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err == nil {
			t.Error("Echo() succeeded, want its first attempt's error: the selector leaves it unretried")
		}
		if got := srv.Count("Lookup"); got != 2 {
			t.Errorf("server saw %d Lookup attempts, want 2", got)
		}
		if got := srv.Count("Echo"); got != 1 {
			t.Errorf("server saw %d Echo attempts, want 1", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(logged) != 3 {
			t.Errorf("logging interceptor logged %d finished calls, want 3 (one per attempt)", len(logged))
		}
	})
}
