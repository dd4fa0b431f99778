package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// TestHooksAndReadersConcurrently runs 16 goroutines through every hook of
// a Client's and a Server's source (refusals of six episodes, failed
// attempts, breaker transitions) while others read the view (Snapshot,
// Events, the page), churn a source's registration and follow the events
// with a watcher. Every refusal is counted in its episode (the clock stands
// still, so none ends), and the watcher, which started from the backlog,
// ends having seen every event's final count: it misses no change. Under
// -race it is the view's check of its locking.
func TestHooksAndReadersConcurrently(t *testing.T) {
	clk := newFakeClock()
	v := newView(t, WithNow(clk.now))
	cs, _ := v.Client("c")
	ss, _ := v.Server("s")
	ctx := context.Background()
	down := status.Error(codes.Unavailable, "backend down")
	full := status.Error(codes.ResourceExhausted, "bulkhead full")
	shed := status.Error(codes.ResourceExhausted, "over the limit")

	// The watcher: the latest count of each event it was sent.
	wctx, stopWatch := context.WithCancel(ctx)
	var (
		wmu     sync.Mutex
		watched = map[uint64]uint64{}
		wchange = make(chan struct{}, 1)
		watchWG sync.WaitGroup
	)
	var zero uint64
	watchWG.Go(func() {
		_ = v.watch(wctx, &zero, func(e *adminv1.Event) error {
			wmu.Lock()
			watched[e.GetSequence()] = e.GetCount()
			wmu.Unlock()
			select {
			case wchange <- struct{}{}:
			default:
			}
			return nil
		})
	})

	const writers, rounds = 16, 200
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range rounds {
				cs.OnStop(ctx, interceptor.StopEvent{FullMethod: echoMethod, Attempts: 1, Reason: interceptor.StopBulkheadFull, Err: full})
				cs.OnStop(ctx, interceptor.StopEvent{FullMethod: echoMethod, Attempts: 2, Reason: interceptor.StopBudget, Err: down})
				cs.OnRetry(ctx, interceptor.RetryEvent{FullMethod: echoMethod, Attempt: 1, Err: down})
				ss.OnRefusal(ctx, server.Refusal{FullMethod: echoMethod, Reason: server.RefusalLimit, Criticality: wire.Sheddable,
					Tenant: "t" + strconv.Itoa(g%2), Tenants: 2, OverShare: true, Err: shed})
				ss.OnRefusal(ctx, server.Refusal{FullMethod: echoMethod, Reason: server.RefusalStoreUnavailable, Err: down})
				ss.OnRefusal(ctx, server.Refusal{FullMethod: echoMethod, Reason: server.RefusalRateLimit, Limit: "per-key",
					RateLimits: []string{"per-key"}, Key: "k", Wait: time.Second, Err: shed})
				if i%40 == 0 {
					cs.OnStateChange(echoMethod, interceptor.BreakerClosed, interceptor.BreakerOpen)
				}
			}
		})
	}
	const refusalsPerRound = 5 // bulkhead, budget, limit, store, rate limit
	readers := []func(){
		func() { _ = v.Snapshot() },
		func() { _, _ = v.Events(0, 10) },
		func() {
			rec := httptest.NewRecorder()
			v.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			if rec.Code != http.StatusOK {
				t.Errorf("page: %d %s", rec.Code, rec.Body)
			}
		},
		func() { // a source of its own name comes and goes (its events are not counted below)
			if src, err := v.Client("churn"); err == nil {
				src.OnStop(ctx, interceptor.StopEvent{FullMethod: echoMethod, Attempts: 1, Reason: interceptor.StopBulkheadFull, Err: full})
				src.Close()
			}
		},
	}
	done := make(chan struct{})
	var rwg sync.WaitGroup
	for _, read := range readers {
		rwg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				read()
			}
		})
	}
	wg.Wait()
	close(done)
	rwg.Wait()

	events, dropped := v.Events(0, 0)
	var refused uint64
	for _, e := range events {
		if e.GetSource() == "c" || e.GetSource() == "s" {
			if k := e.GetKind(); k == adminv1.EventKind_EVENT_KIND_REFUSED || k == adminv1.EventKind_EVENT_KIND_STORE_FAILED {
				refused += e.GetCount()
			}
		}
	}
	if want := uint64(writers * rounds * refusalsPerRound); refused != want {
		t.Errorf("the refusals' episodes count %d refusals, want %d (%d events, %d dropped)", refused, want, len(events), dropped)
	}
	if fs := cs.fails.recent(echoMethod); len(fs) != failuresPerMethod {
		t.Errorf("%d failures kept, want the last %d", len(fs), failuresPerMethod)
	}

	// The watcher catches up with the log: every event kept, at its final
	// count. It is waited for by what it has seen, not by time.
	want := map[uint64]uint64{}
	for _, e := range events {
		want[e.GetSequence()] = e.GetCount()
	}
	caughtUp := func() bool {
		wmu.Lock()
		defer wmu.Unlock()
		for seq, n := range want {
			if watched[seq] != n {
				return false
			}
		}
		return true
	}
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for !caughtUp() {
		select {
		case <-wchange:
		case <-deadline.C:
			wmu.Lock()
			t.Fatalf("after a minute the watcher has %v, want %v", watched, want)
		}
	}
	stopWatch()
	watchWG.Wait()
}
