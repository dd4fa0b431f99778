package interceptor

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TenantFunc names the tenant of an incoming call for the fair shares of
// the Server's concurrency limits (WithTenantFairness). ctx is the call's
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

// srvFairness is WithTenantFairness's configuration.
type srvFairness struct {
	cfg    serviceconfig.TenantFairness
	tenant TenantFunc
}

// WithTenantFairness shares each of the Server's concurrency limits
// (WithConcurrencyLimit, WithMethodConcurrencyLimit) fairly among the
// tenants that tenant names (nil: TenantFromMetadata(cfg.MetadataKey)),
// so that a noisy tenant cannot make everyone shed at the rate it causes.
//
// Under pressure each active tenant (one with calls in flight or queued,
// or seen within cfg.IdleTimeout) has a fair share: its criticality's
// share of the limit divided by the active tenants. A tenant under its
// fair share may fill the limit; a tenant at or over it is shed once the
// calls in flight reach the limit less one slot kept free for each other
// tenant under its share (at most a tenth of the limit in all). So a
// tenant over its share is shed before any tenant under it, an idle tenant
// loses nothing, and a lone tenant may use the whole limit. A full queue
// (MaxQueue) gives a tenant's place to a call, as critical, of a tenant
// that holds and waits for fewer; a freed slot goes to the most critical
// waiter, then to the one whose tenant has fewest in flight. Calls in
// flight are never preempted: a tenant that arrives while another fills
// the limit gets its first slot when one frees.
//
// Tenants are bounded in memory: each limit remembers at most
// cfg.MaxTenants (default 1024) at once, and the names beyond share one
// tenant, as do names longer than 256 bytes (so a caller choosing long
// names cannot pin more than 256KB of them in a limit); a tenant with
// nothing in flight or queued is forgotten
// cfg.IdleTimeout (default 5s) after its last call. Without this option
// every call is one tenant. The CPU-aware shedder (WithCPUShedding) has no
// tenants.
func WithTenantFairness(cfg serviceconfig.TenantFairness, tenant TenantFunc) ServerOption {
	return srvOptionFunc(func(o *serverOptions) {
		if tenant == nil && cfg.MetadataKey == "" {
			o.errs = append(o.errs, errorf("WithTenantFairness: no tenant function and no metadataKey"))
			return
		}
		if err := cfg.Validate(); err != nil {
			o.errs = append(o.errs, errorf("WithTenantFairness: %v", err))
			return
		}
		if tenant == nil {
			tenant = TenantFromMetadata(cfg.MetadataKey)
		}
		o.fairness = &srvFairness{cfg: cfg, tenant: tenant}
	})
}
