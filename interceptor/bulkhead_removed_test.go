package interceptor

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A bulkhead block removed left the calls queued in the dropped bulkhead
// waiting for its holders: with one slot held by a 10s call and two calls
// queued (no maxQueueWait), an update removing the block (so that new
// calls go unbounded) still held the queued two for 10s, behind a limit no
// longer configured. They are now let in at the update, as a new call
// would be.
func TestBulkheadRemovedLetsTheQueuedCallsInAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name    string
		removed *serviceconfig.Config
	}{
		{"block removed", echoBulkheadConfig(nil)},
		{"entry removed", &serviceconfig.Config{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
					if a.N == 1 {
						return testserver.Outcome{Delay: 10 * time.Second}
					}
					return testserver.Outcome{}
				})
				stub, c := newEcho(t, srv, WithServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 4})))
				holder := echoAsync(t, stub, 1)
				queued := echoAsync(t, stub, 2)
				wantBulkhead(t, c, 1, 2)
				start := time.Now()
				if err := c.UpdateServiceConfig(tc.removed); err != nil {
					t.Fatal(err)
				}
				for range 2 {
					if err := <-queued; err != nil {
						t.Errorf("Echo queued when the block was removed = %v, want nil", err)
					}
				}
				if d := time.Since(start); d != 0 {
					t.Errorf("the queued calls ended %v after the block was removed, want at once", d)
				}
				if err := <-holder; err != nil {
					t.Errorf("Echo in flight when the block was removed = %v, want nil", err)
				}
			})
		})
	}
}

// A bulkhead block removed and added again started a new, empty bulkhead:
// a call in flight since before the removal (a long call or stream) was
// not counted, so a cap of 1 re-added admitted a second call at once, as
// the lowered cap of an edited block did before bulkhead.Resize. The
// bulkhead dropped is now kept by the method's policy and takes the
// re-added block's limits.
func TestBulkheadAddedAgainCountsTheCallsInFlightSinceBefore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: 10 * time.Second} })
		one := &serviceconfig.Bulkhead{MaxConcurrent: 1}
		stub, c := newEcho(t, srv, WithServiceConfig(echoBulkheadConfig(one)))
		before := echoAsync(t, stub, 1)
		for _, cfg := range []*serviceconfig.Config{echoBulkheadConfig(nil), {}, echoBulkheadConfig(one)} {
			if err := c.UpdateServiceConfig(cfg); err != nil {
				t.Fatal(err)
			}
		}
		wantBulkhead(t, c, 1, 0)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); !errors.Is(err, ErrBulkheadFull) {
			t.Errorf("Echo with a call in flight since before the cap of 1 was removed and added again = %v, want ErrBulkheadFull", err)
		}
		if err := <-before; err != nil {
			t.Errorf("Echo in flight across the updates = %v, want nil", err)
		}
		wantBulkhead(t, c, 0, 0)
	})
}

// A method let go by an update (its exact name dropped, no stub calls it,
// and the entry that now applies gives it no state) lost the bulkhead its
// calls in flight still hold: a cap of 1 added again built an empty
// bulkhead, which admitted a second call beside the call begun before the
// removal. A method whose dropped bulkhead still holds attempts is kept.
func TestBulkheadOfAMethodLetGoCountsTheCallsInFlightWhenAddedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: 10 * time.Second} })
		one := &serviceconfig.Bulkhead{MaxConcurrent: 1}
		c := newTestClient(t, WithServiceConfig(echoBulkheadConfig(one)))
		cc := testserver.Start(t, srv, c.DialOptions()...)
		invoke := func() error { // as a proxy would: no grpc.StaticMethod
			return cc.Invoke(t.Context(), echoMethod, &echov1.EchoRequest{}, &echov1.EchoResponse{})
		}
		before := make(chan error, 1)
		go func() { before <- invoke() }()
		synctest.Wait()
		for _, cfg := range []*serviceconfig.Config{{}, echoBulkheadConfig(one)} {
			if err := c.UpdateServiceConfig(cfg); err != nil {
				t.Fatal(err)
			}
		}
		wantBulkhead(t, c, 1, 0)
		if err := invoke(); !errors.Is(err, ErrBulkheadFull) {
			t.Errorf("Echo with a call in flight since before its entry was removed and added again = %v, want ErrBulkheadFull", err)
		}
		if err := <-before; err != nil {
			t.Errorf("Echo in flight across the updates = %v, want nil", err)
		}
		wantBulkhead(t, c, 0, 0)
	})
}

// The same for a method no generated stub calls, whose entry an update
// removes while one call holds its slot and two are queued: the queued two
// go at once, the method is kept while its holder runs (so a cap added
// again counts it), and nothing is held at the end.
func TestBulkheadOfAMethodLetGoLetsItsQueuedCallsIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Delay: 10 * time.Second}
			}
			return testserver.Outcome{}
		})
		c := newTestClient(t, WithServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 4})))
		cc := testserver.Start(t, srv, c.DialOptions()...)
		done := make(chan error, 3)
		for range 3 {
			go func() {
				done <- cc.Invoke(t.Context(), echoMethod, &echov1.EchoRequest{}, &echov1.EchoResponse{})
			}()
			synctest.Wait()
		}
		wantBulkhead(t, c, 1, 2)
		start := time.Now()
		if err := c.UpdateServiceConfig(&serviceconfig.Config{}); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Echo queued when its entry was removed = %v, want nil", err)
			}
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("the queued calls ended %v after the entry was removed, want at once", d)
		}
		if err := c.UpdateServiceConfig(echoBulkheadConfig(&serviceconfig.Bulkhead{MaxConcurrent: 1})); err != nil {
			t.Fatal(err)
		}
		wantBulkhead(t, c, 1, 0)
		if err := <-done; err != nil {
			t.Errorf("Echo in flight when its entry was removed = %v, want nil", err)
		}
		wantBulkhead(t, c, 0, 0)
	})
}
