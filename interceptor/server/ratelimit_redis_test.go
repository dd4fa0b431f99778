package server

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/ratelimit/redisquota"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// redisQuota returns a redisquota.Store on addr under prefix, closed (with
// its client) when the test ends.
func redisQuota(t *testing.T, addr, prefix string) *redisquota.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond, ContextTimeoutEnabled: true})
	q, err := redisquota.New(c, redisquota.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = q.Close()
		_ = c.Close()
	})
	return q
}

// TestRateLimitDistributedAcrossServers: two Servers (replicas) sharing a
// per-tenant limit through a real redis-server admit, together, no more
// than the tenant's burst (the rate is an hour's token); the calls beyond
// are refused on either replica with the limit named and a wait; another
// tenant has its own quota.
func TestRateLimitDistributedAcrossServers(t *testing.T) {
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	limit := serviceconfig.RateLimit{Name: "per-tenant", Rate: 1, Per: time.Hour, Burst: 6, Key: serviceconfig.KeyTenant, Distributed: true}
	var clients []echov1.EchoServiceClient
	var impls []*countEcho
	for range 2 {
		l := rateLimits(limit)
		l.Quota = redisQuota(t, addr, prefix)
		impl := &countEcho{}
		impls = append(impls, impl)
		clients = append(clients, echov1.NewEchoServiceClient(serveEcho(t, impl, newRateServer(t, l))))
	}
	ctx, cancel := context.WithTimeout(tenantCtx("a"), 10*time.Second)
	defer cancel()
	admitted := 0
	for i := range 30 {
		var trailer metadata.MD
		_, err := clients[i%2].Echo(ctx, &echov1.EchoRequest{}, grpc.Trailer(&trailer))
		switch r := refusalOf(err, trailer); {
		case err == nil:
			admitted++
		case r.code != codes.ResourceExhausted || len(r.violations) != 1 || r.violations[0] != "ratelimit:per-tenant" || r.retryInfo <= 0 || r.pushback <= 0:
			t.Fatalf("call %d: %v (%+v), want admitted or refused by per-tenant with a wait", i, err, r)
		}
	}
	if admitted == 0 || admitted > limit.Burst {
		t.Errorf("the two replicas admitted %d calls of tenant a, want 1 to the burst, %d", admitted, limit.Burst)
	}
	if runs := impls[0].runs.Load() + impls[1].runs.Load(); int(runs) != admitted {
		t.Errorf("handlers ran %d times for %d admitted", runs, admitted)
	}
	if _, err := clients[1].Echo(tenantCtx("b"), &echov1.EchoRequest{}); err != nil {
		t.Errorf("tenant b: %v, want admitted (its own quota)", err)
	}
}

// TestRateLimitDistributedFallbackWithoutRedis: with Redis
// unreachable, a limit whose fallback is closed refuses the calls its
// replica holds no token for, at once (no call waits past the lease
// timeout), telling the caller to come back; one whose fallback is open
// admits them.
func TestRateLimitDistributedFallbackWithoutRedis(t *testing.T) {
	addr := redistest.ClosedAddr(t)
	for _, fb := range []serviceconfig.RateLimitFallback{serviceconfig.FallbackClosed, serviceconfig.FallbackOpen} {
		t.Run(string(fb), func(t *testing.T) {
			l := rateLimits(serviceconfig.RateLimit{Name: "r", Rate: 100, Burst: 10, Key: serviceconfig.KeyTenant, Distributed: true, Fallback: fb})
			l.Quota = redisQuota(t, addr, "rl-test:")
			client := echov1.NewEchoServiceClient(serveEcho(t, &countEcho{}, newRateServer(t, l)))
			for i := range 3 {
				start := time.Now()
				ctx, cancel := context.WithTimeout(tenantCtx("a"), 5*time.Second)
				_, err := client.Echo(ctx, &echov1.EchoRequest{})
				cancel()
				if fb == serviceconfig.FallbackOpen && err != nil {
					t.Errorf("call %d: %v, want admitted (open)", i, err)
				}
				if fb == serviceconfig.FallbackClosed && status.Code(err) != codes.ResourceExhausted {
					t.Errorf("call %d: %v, want RESOURCE_EXHAUSTED (closed)", i, err)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("call %d took %v with Redis down", i, d)
				}
			}
		})
	}
}
