package server

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
)

// TestWarningsWithoutALoggerReachSlogDefault pins where a Server given no
// WithLogger writes its warnings: slog.Default(), with their key-value
// pairs. Before, grpclog's "resilience" component, whose default logger
// discards warnings ("the lease ended while the handler ran; a duplicate
// may run it too" was written nowhere), and which, when enabled, ran the
// pairs together as one string ("...: warningserver: ..."). Not parallel:
// it replaces slog's default logger.
func TestWarningsWithoutALoggerReachSlogDefault(t *testing.T) {
	log := new(idemLog)
	old := slog.Default()
	slog.SetDefault(log.logger())
	t.Cleanup(func() { slog.SetDefault(old) })
	store, err := idempotency.NewMemoryStore()
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(WithIdempotency(Idempotency{Store: store, Scope: SharedScope,
		KeyPolicies: map[string]KeyPolicy{"/zz.slogdefault.Unregistered/Pay": KeyRequired}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	const want = `level=WARN msg="idempotency: a key policy names a service no code linked into the program registers" ` +
		`warning="server: Idempotency.KeyPolicies[\"/zz.slogdefault.Unregistered/Pay\"]: service \"zz.slogdefault.Unregistered\" is not registered`
	if got := log.String(); strings.Count(got, want) != 1 {
		t.Errorf("slog.Default() got %q, want one line with %q", got, want)
	}
}
