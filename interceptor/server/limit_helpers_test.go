package server

import (
	"strings"
	"testing"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/internal/rpcname"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Helpers of the overload-protection tests: Limits built from the values
// the tests used to give one option each.

// limitsOf is the Limits of one server-wide concurrency limit cfg.
func limitsOf(cfg serviceconfig.ConcurrencyLimit) Limits {
	return Limits{Config: serviceconfig.ServerConfig{ConcurrencyLimit: &cfg}}
}

// fairLimitsOf is limitsOf(cfg) shared fairly among tenants as tf says, the
// tenant named by tenant (nil: by tf.MetadataKey).
func fairLimitsOf(cfg serviceconfig.ConcurrencyLimit, tf serviceconfig.TenantFairness, tenant TenantFunc) Limits {
	l := limitsOf(cfg)
	l.Config.TenantFairness, l.Tenant = &tf, tenant
	return l
}

// methodLimitOf is the methodConfig entry that gives name, a full method
// ("/pkg.S/M") or a service ("pkg.S"), a limit of its own.
func methodLimitOf(t testing.TB, name string, cfg serviceconfig.ConcurrencyLimit) serviceconfig.ServerMethodConfig {
	t.Helper()
	n, err := rpcname.Parse(name)
	if err != nil {
		t.Fatalf("rpcname.Parse(%q): %v", name, err)
	}
	return serviceconfig.ServerMethodConfig{Name: []serviceconfig.Name{n}, ConcurrencyLimit: &cfg}
}

// sharedIdempotency turns idempotency on with store, every caller sharing
// one scope.
func sharedIdempotency(store idempotency.Store) Option {
	return WithIdempotency(Idempotency{Store: store, Scope: SharedScope})
}

// previousAttemptsKey is the header in which grpc (and our client) count
// the attempts of a call before this one.
const previousAttemptsKey = "grpc-previous-rpc-attempts"

// wantLimitsError fails t unless l.Validate and New(WithLimits(l)) both
// return an error that contains want.
func wantLimitsError(t *testing.T, l Limits, want string) {
	t.Helper()
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Limits.Validate() = %v, want an error containing %q", err, want)
	}
	if _, err := New(WithLimits(l)); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("New(WithLimits()) = %v, want an error containing %q", err, want)
	}
}
