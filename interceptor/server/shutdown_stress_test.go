package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestShutdownRacingCallsHoldsNothing races Shutdown (twice, with a short
// context and with none) and Close against 16 callers of keyed and plain
// calls through a limit with a queue, whose handlers are fast, slow,
// failing or panicking and whose callers give up at random: at the end no
// slot or queue entry is held, every call after Shutdown began is refused
// before it runs, and no key is left claimed (a retry on another Server
// runs or replays it at once, never waiting for a lease).
func TestShutdownRacingCallsHoldsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			var took time.Duration
			switch req.GetMessage() {
			case "panic":
				panic("handler")
			case "fail":
				return nil, status.Error(codes.InvalidArgument, "bad")
			case "slow":
				took = 20 * time.Millisecond
			case "stuck":
				took = time.Hour
			}
			select {
			case <-time.After(took):
				return &echov1.EchoResponse{Message: req.GetMessage()}, nil
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}}
		lim := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 4, MinLimit: 4, MaxLimit: 4,
			MaxQueue: 8, MaxQueueWait: 50 * time.Millisecond}))
		s, cc := idemStartServer(t, e, Idempotency{Store: store}, lim)
		msgs := []string{"fast", "slow", "fail", "panic", "stuck", "slow"}
		var keysMu sync.Mutex
		keys := map[string]bool{}
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Go(func() {
				rnd := rand.New(rand.NewPCG(uint64(g), 33))
				for i := range 40 {
					key := ""
					if rnd.IntN(3) > 0 {
						key = fmt.Sprintf("k%d", rnd.IntN(40))
						keysMu.Lock()
						keys[key] = true
						keysMu.Unlock()
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rnd.IntN(40))*time.Millisecond)
					_ = idemDo(ctx, cc, key, msgs[rnd.IntN(len(msgs))])
					cancel()
					if i%7 == 0 {
						time.Sleep(time.Duration(rnd.IntN(5)) * time.Millisecond)
					}
				}
			})
		}
		time.Sleep(100 * time.Millisecond)
		var sw sync.WaitGroup
		sw.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			defer cancel()
			_ = s.Shutdown(ctx)
		})
		sw.Go(func() { _ = s.Close() })
		sw.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_ = s.Shutdown(ctx)
		})
		wg.Wait()
		sw.Wait()
		wantCode(t, "a call after Shutdown", idemDo(context.Background(), cc, "k-after", "fast").err, codes.Unavailable, "shutting down")
		if err := s.Shutdown(context.Background()); err != nil {
			t.Errorf("a last Shutdown = %v, want nil (every detached handler was cancelled)", err)
		}
		synctest.Wait()
		for _, st := range s.LimitStatuses() {
			if st.InFlight != 0 || st.Queued != 0 {
				t.Errorf("limit %q holds %d in flight, %d queued after Shutdown; want nothing held", st.Name, st.InFlight, st.Queued)
			}
		}
		_, cc2 := idemStartServer(t, e, Idempotency{Store: store})
		for k := range keys {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_ = idemDo(ctx, cc2, k, "fast")
			cancel()
			if took := time.Since(start); took > 0 {
				t.Errorf("key %s on another Server took %v: a claim was left held", k, took)
			}
		}
	})
}
