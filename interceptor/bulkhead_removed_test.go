package interceptor

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
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
