package server

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TenantFunc names the tenant of an incoming call for the fair shares of
// the Server's concurrency limits (Limits.Tenant, with
// Limits.Config.TenantFairness). ctx is the call's
// context, with what the interceptors before the Server's put there (the
// peer, verified credentials). "" is the default tenant, which every call
// that names none shares. It runs on every call under a concurrency limit,
// synchronously, and must be cheap and safe for concurrent use.
type TenantFunc func(ctx context.Context) string

// TenantFromMetadata returns a TenantFunc that reads the first value of
// the incoming metadata key (lower case): "" when the call has none. A
// caller can send any value, so use a key that an authenticating proxy sets
// and strips from what callers send; a caller free to choose it can claim
// another tenant's share, or spread over many names to take many shares (up
// to MaxTenants; the names beyond share one). It costs the call the copy
// of the values grpc makes.
func TenantFromMetadata(key string) TenantFunc {
	return func(ctx context.Context) string {
		if v := metadata.ValueFromIncomingContext(ctx, key); len(v) > 0 {
			return v[0]
		}
		return ""
	}
}

// srvFairness is the tenant fairness of Limits: its config and the
// function that names a call's tenant.
type srvFairness struct {
	cfg    serviceconfig.TenantFairness
	tenant TenantFunc
}
