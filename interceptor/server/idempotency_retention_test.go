package server

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// TestIdempotencyFloodFromOneScopeNeverRerunsAnother pins finding 1 of
// issue 14: tenant B's flood of keyed calls, cheap (twice the store's
// entries) or with large replies (enough to fill its bytes twice), used to
// evict tenant A's young record, so A's retry ran the handler a second time.
// Now records younger than the minimum retention are never evicted: B is
// refused with RESOURCE_EXHAUSTED and a RetryInfo hint, and A's retry is a
// replay. With a scope quota, B is refused at its quota and A can still
// claim new keys.
func TestIdempotencyFloodFromOneScopeNeverRerunsAnother(t *testing.T) {
	const shards = 16
	tests := []struct {
		name       string
		opts       []idempotency.MemoryOption
		flood      int // B's keyed calls
		replyBytes int
		aNewKey    bool // A claims a new key after the flood
	}{
		// Without a scope quota B can fill the whole store, A's shard
		// with it: only A's record's youth keeps it.
		{"cheap calls, twice the entries", []idempotency.MemoryOption{idempotency.WithMaxEntries(100 * shards), idempotency.WithScopeQuota(0, 0)}, 200 * shards, 0, false},
		// Replies of 60 KiB hold 64 KiB of heap: 4 fill a shard's 256 KiB.
		{"large replies, twice the bytes", []idempotency.MemoryOption{idempotency.WithMaxRecordBytes(128 << 10), idempotency.WithMaxBytes(shards * 256 << 10), idempotency.WithScopeQuota(0, 0)},
			2 * shards * 4, 60 << 10, false},
		{"110,000 cheap calls, the default store", nil, 110_000, 0, false},
		{"cheap calls, scope quota", []idempotency.MemoryOption{idempotency.WithMaxEntries(100 * shards), idempotency.WithScopeQuota(50*shards, 0)},
			110 * shards, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.flood > 10_000 && (testing.Short() || raceEnabled) && *stressFor == 0 {
				t.Skip("a flood of the issue's size takes 20s with -race or -short; -stress=1s runs it")
			}
			// The store's clock stands still while B floods it: what this
			// pins is eviction for room, not for age. On the wall clock a
			// busy machine takes longer than the minimum retention (1
			// minute) for the 110,000 calls, and then A's record and B's
			// first ones are old enough to be evicted for room, rightly:
			// A's retry ran its handler again and Evicted was not 0.
			base := time.Now()
			var clock atomic.Int64 // the store's time since base
			now := func() time.Time { return base.Add(time.Duration(clock.Load())) }
			store, err := idempotency.NewMemoryStore(append([]idempotency.MemoryOption{idempotency.WithShards(shards), idempotency.WithNow(now)}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			var aRuns atomic.Int64
			e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
				if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-tenant")) == 1 && md.Get("x-tenant")[0] == "a" {
					aRuns.Add(1)
				}
				return &echov1.EchoResponse{Message: req.Message, Payload: make([]byte, tt.replyBytes)}, nil
			}}
			cc := idemStart(t, e, Idempotency{Store: store, Scope: idemTenantScope})
			ctx := idemCtx(t)
			if r := idemDo(ctx, cc, "a-order-1", "charge", "x-tenant", "a"); r.err != nil {
				t.Fatalf("A's first call: %v", r.err)
			}

			var refused, other atomic.Int64
			var hinted atomic.Bool
			var wg sync.WaitGroup
			next := atomic.Int64{}
			for range 16 {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(tt.flood); i = next.Add(1) {
						r := idemDo(ctx, cc, "b-"+strconv.FormatInt(i, 10), "b", "x-tenant", "b")
						switch status.Code(r.err) {
						case codes.OK:
						case codes.ResourceExhausted:
							refused.Add(1)
							for _, d := range status.Convert(r.err).Details() {
								if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().AsDuration() > 0 {
									hinted.Store(true)
								}
							}
						default:
							other.Add(1)
						}
					}
				})
			}
			wg.Wait()

			if r := idemDo(ctx, cc, "a-order-1", "charge", "x-tenant", "a"); r.err != nil {
				t.Fatalf("A's retry: %v", r.err)
			}
			if got := aRuns.Load(); got != 1 {
				t.Errorf("A's handler ran %d times after B's flood of %d calls, want 1", got, tt.flood)
			}
			if refused.Load() == 0 || !hinted.Load() || other.Load() != 0 {
				t.Errorf("B's flood: %d refused (hint seen %v), %d other errors; want some RESOURCE_EXHAUSTED with RetryInfo, no other error",
					refused.Load(), hinted.Load(), other.Load())
			}
			if tt.aNewKey {
				if r := idemDo(ctx, cc, "a-order-2", "charge", "x-tenant", "a"); r.err != nil {
					t.Errorf("A's new key after B's flood: %v, want success (B is bounded by its quota)", r.err)
				}
			}
			st := store.Stats()
			t.Logf("flood %d: B refused %d; store %+v", tt.flood, refused.Load(), st)
			if st.Evicted != 0 {
				t.Errorf("Stats().Evicted = %d, want 0: every record is younger than the minimum retention", st.Evicted)
			}
		})
	}
}
