package interceptor

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/internal/bulkhead"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestBulkheadUpdatesWithHedgesAndStreamsHoldNothing updates the bulkhead
// blocks at random (changed, removed, added again, the whole config
// dropped) while hedged unary calls and server streams run, some
// cancelled, in real time: every call ends, and no bulkhead the client
// ever had, in force or dropped, holds or queues anything at the end.
func TestBulkheadUpdatesWithHedgesAndStreamsHoldNothing(t *testing.T) {
	const callers, calls = 16, 30
	blocks := []*serviceconfig.Bulkhead{
		nil,
		{MaxConcurrent: 1, MaxQueue: 2},
		{MaxConcurrent: 3},
		{MaxConcurrent: 2, MaxQueue: 4, MaxQueueWait: 200 * time.Microsecond},
	}
	cfg := func(r *rand.Rand) *serviceconfig.Config {
		if r.IntN(6) == 0 {
			return &serviceconfig.Config{}
		}
		return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name:          []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
			Bulkhead:      blocks[r.IntN(len(blocks))],
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 100 * time.Microsecond},
		}, {
			Name:     []serviceconfig.Name{{Service: echoService}},
			Bulkhead: blocks[r.IntN(len(blocks))],
		}}}
	}
	srv := &testserver.Server{}
	srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
		return testserver.Outcome{Delay: time.Duration(a.N%4) * 150 * time.Microsecond}
	})
	r0 := rand.New(rand.NewPCG(5, 6))
	stub, c := newEcho(t, srv, WithServiceConfig(cfg(r0)))
	var (
		mu   sync.Mutex
		seen = map[*bulkhead.Bulkhead]bool{}
	)
	collect := func() {
		mu.Lock()
		defer mu.Unlock()
		eachBulkhead(c, func(b *bulkhead.Bulkhead) { seen[b] = true })
	}
	collect()
	stop := make(chan struct{})
	var updater, wg sync.WaitGroup
	updater.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Microsecond):
			}
			if err := c.UpdateServiceConfig(cfg(r0)); err != nil {
				t.Error(err)
				return
			}
			collect()
		}
	})
	for g := range callers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 13))
			for range calls {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				if r.IntN(4) == 0 {
					time.AfterFunc(time.Duration(r.IntN(400))*time.Microsecond, cancel)
				}
				var err error
				if g%2 == 0 {
					_, err = stub.Echo(ctx, &echov1.EchoRequest{})
				} else {
					err = readStream(ctx, stub)
				}
				if ctx.Err() == context.DeadlineExceeded {
					t.Errorf("a call did not end within 10s: %v", err)
				}
				cancel()
				if err != nil && !errors.Is(err, ErrBulkheadFull) && status.Code(err) != codes.Canceled {
					t.Errorf("call = %v, want nil, ErrBulkheadFull or CANCELED", err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	updater.Wait()
	deadline := time.Now().Add(5 * time.Second)
	mu.Lock()
	defer mu.Unlock()
	for b := range seen {
		for s := b.Snapshot(); s != (bulkhead.Snapshot{}); s = b.Snapshot() {
			if time.Now().After(deadline) {
				t.Errorf("a bulkhead of the client holds %+v at the end, want nothing", s)
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	t.Logf("%d bulkheads over the updates", len(seen))
}

// readStream reads a server stream of 2 messages to its end.
func readStream(ctx context.Context, stub echov1.EchoServiceClient) error {
	st, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Count: 2})
	if err != nil {
		return err
	}
	for {
		if _, err := st.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}
