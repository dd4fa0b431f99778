package server

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

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

// serverHint reads a server's retry hint as the client does (the
// interceptor package's serverHint, whose copy this is: the server's tests
// check that what it sends reads as it means): the grpc-retry-pushback-ms
// trailer, or else a google.rpc.RetryInfo status detail. refuse is true
// when the server said not to retry: a negative, malformed or repeated
// value.
func serverHint(err error, trailer metadata.MD) (d time.Duration, ok, refuse bool) {
	if vals := trailer[rpcname.PushbackKey]; len(vals) > 0 {
		if len(vals) > 1 {
			return 0, false, true
		}
		ms, perr := strconv.ParseInt(vals[0], 10, 64)
		if perr != nil || ms < 0 {
			return 0, false, true
		}
		if ms > int64(time.Duration(1<<63-1)/time.Millisecond) {
			return time.Duration(1<<63 - 1), true, false
		}
		return time.Duration(ms) * time.Millisecond, true, false
	}
	if _, isStatus := err.(interface{ GRPCStatus() *status.Status }); !isStatus {
		return 0, false, false
	}
	found := 0
	for _, det := range status.Convert(err).Details() {
		ri, isRI := det.(*errdetails.RetryInfo)
		if !isRI || ri.GetRetryDelay() == nil {
			continue
		}
		found++
		dd := ri.GetRetryDelay()
		if dd.CheckValid() != nil || dd.AsDuration() < 0 {
			return 0, false, true
		}
		d = dd.AsDuration()
	}
	switch found {
	case 0:
		return 0, false, false
	case 1:
		return d, true, false
	}
	return 0, false, true
}

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
