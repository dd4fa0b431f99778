package server

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The one admission path (issue 33, finding 3): each way a call can go
// passes the same guards. Each test here is one guard that one path
// missed.

// TestAdmissionLimitShedOfKeyedCallIsNeverStored pins finding 3 against
// every store, joined mode included: with Idempotency.UnstoredCodes
// without RESOURCE_EXHAUSTED, the limit's shed of a keyed call must not be
// the key's outcome. Joined mode committed it (its settle knew nothing of
// the limit's shed), and every retry got RESOURCE_EXHAUSTED back for the
// record's TTL. Now a retry runs the handler once there is room.
func TestAdmissionLimitShedOfKeyedCallIsNeverStored(t *testing.T) {
	forEachStore(t, []idemCase{{"LimitFull", testAdmissionShedNotStored}})
}

func testAdmissionShedNotStored(t *testing.T, env *idemEnv) {
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var runs atomic.Int64
	e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		if req.GetMessage() == "hold" {
			started <- struct{}{}
			<-release
		} else {
			runs.Add(1)
		}
		return &echov1.EchoResponse{Message: req.GetMessage()}, nil
	}}
	lim := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1}))
	s, cc := idemStartServer(t, e, Idempotency{Store: env.store, UnstoredCodes: rescodes.Of(codes.Unavailable)}, lim)
	ctx := idemCtx(t)
	held := make(chan idemCall, 1)
	go func() { held <- idemDo(ctx, cc, "", "hold") }()
	<-started
	shed := idemDo(ctx, cc, "k", "pay")
	wantCode(t, "keyed call while the limit is full", shed.err, codes.ResourceExhausted, "concurrency limit")
	close(release)
	if r := <-held; r.err != nil {
		t.Fatal(r.err)
	}
	retry := idemDo(ctx, cc, "k", "pay")
	if retry.err != nil || runs.Load() != 1 || wire.IdempotencyReplayed(retry.header) {
		t.Errorf("retry once the limit has room: %v, handler ran %d times, replayed %v; want it run once, fresh",
			retry.err, runs.Load(), wire.IdempotencyReplayed(retry.header))
	}
	if st := s.LimitStatuses()[0]; st.InFlight != 0 || st.Queued != 0 {
		t.Errorf("after the calls: %d in flight, %d queued; want nothing held", st.InFlight, st.Queued)
	}
}

// TestAdmissionCPUShedOfKeyedCallIsNeverStored pins finding 3 for the
// CPU-aware shedder: its shed of a keyed call was stored as the key's
// outcome (with UnstoredCodes without RESOURCE_EXHAUSTED, its retry
// replayed "retry after 1ms" for 24h). Now it is the one path's shed.
func TestAdmissionCPUShedOfKeyedCallIsNeverStored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		var hot atomic.Bool
		cpu := &CPUShedding{CPU: func() float64 {
			if hot.Load() {
				return 1
			}
			return 0
		}}
		release := make(chan struct{})
		var runs atomic.Int64
		e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			switch req.GetMessage() {
			case "hold":
				<-release
			case "pay":
				runs.Add(1)
			}
			time.Sleep(10 * time.Millisecond)
			return &echov1.EchoResponse{Message: req.GetMessage()}, nil
		}}
		s, cc := idemStartServer(t, e, Idempotency{Store: store, UnstoredCodes: rescodes.Of(codes.Unavailable)},
			WithLimits(Limits{CPU: cpu}))
		ctx := context.Background()
		for range 150 { // 1.5s of calls one at a time: the shedder measures 50 per 500ms bucket, 10ms each
			if r := idemDo(ctx, cc, "", "warm"); r.err != nil {
				t.Fatal(r.err)
			}
		}
		hot.Store(true)
		held := make(chan idemCall, 1)
		go func() { held <- idemDo(ctx, cc, "", "hold") }()
		synctest.Wait() // one call in flight: the shedder's whole bandwidth-delay product (1)
		shed := idemDo(ctx, cc, "k", "pay")
		wantCode(t, "keyed call while the CPU is hot", shed.err, codes.ResourceExhausted, "")
		close(release)
		if r := <-held; r.err != nil {
			t.Fatal(r.err)
		}
		hot.Store(false)
		time.Sleep(2 * time.Second) // past the cool-off
		retry := idemDo(ctx, cc, "k", "pay")
		if retry.err != nil || runs.Load() != 1 || wire.IdempotencyReplayed(retry.header) {
			t.Errorf("retry once the CPU is cool: %v, handler ran %d times, replayed %v; want it run once, fresh",
				retry.err, runs.Load(), wire.IdempotencyReplayed(retry.header))
		}
		if st := s.LimitStatuses()[0]; st.InFlight != 0 {
			t.Errorf("after the calls: %d in flight, want 0", st.InFlight)
		}
	})
}

// TestAdmissionQueuedCallerGoneLeavesTheQueue pins finding 3: a queued
// keyed call waited on its handler's context, which is detached from the
// caller, so after its caller gave up it stayed queued, a live caller
// behind it was shed, and its handler later ran for nobody. Now every path
// waits on the caller's context: the gone caller leaves the queue at once,
// the live one takes the slot, and the gone caller's handler never runs.
func TestAdmissionQueuedCallerGoneLeavesTheQueue(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		name := map[bool]string{false: "NoKey", true: "Keyed"}[keyed]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store, err := idempotency.NewMemoryStore()
				if err != nil {
					t.Fatal(err)
				}
				release := make(chan struct{})
				var mu sync.Mutex
				ran := map[string]int{}
				e := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
					mu.Lock()
					ran[req.GetMessage()]++
					mu.Unlock()
					if req.GetMessage() == "hold" {
						<-release
					}
					return &echov1.EchoResponse{Message: req.GetMessage()}, nil
				}}
				lim := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1,
					MaxQueue: 1, MaxQueueWait: time.Hour}))
				s, cc := idemStartServer(t, e, Idempotency{Store: store}, lim)
				key := func(k string) string {
					if keyed {
						return k
					}
					return ""
				}
				held := make(chan idemCall, 1)
				go func() { held <- idemDo(context.Background(), cc, "", "hold") }()
				synctest.Wait()
				gone, cancel := context.WithCancel(context.Background())
				goneDone := make(chan idemCall, 1)
				go func() { goneDone <- idemDo(gone, cc, key("g"), "gone") }()
				synctest.Wait()
				if q := s.LimitStatuses()[0].Queued; q != 1 {
					t.Fatalf("%d queued, want the call that is about to go", q)
				}
				cancel()
				synctest.Wait()
				if q := s.LimitStatuses()[0].Queued; q != 0 {
					t.Errorf("after its caller went: %d queued, want 0 (it leaves at once)", q)
				}
				wantCode(t, "the call whose caller went", (<-goneDone).err, codes.Canceled, "")
				live := make(chan idemCall, 1)
				go func() { live <- idemDo(context.Background(), cc, key("l"), "live") }()
				synctest.Wait()
				close(release)
				if r := <-live; r.err != nil {
					t.Errorf("the live caller queued behind: %v, want it run", r.err)
				}
				if r := <-held; r.err != nil {
					t.Fatal(r.err)
				}
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				if ran["gone"] != 0 || ran["live"] != 1 {
					t.Errorf("handlers run: %v; want none for the caller that went, one for the live one", ran)
				}
				if st := s.LimitStatuses()[0]; st.InFlight != 0 || st.Queued != 0 {
					t.Errorf("after the calls: %d in flight, %d queued; want nothing held", st.InFlight, st.Queued)
				}
			})
		})
	}
}

// TestIdempotencyReplayMarkCannotBeForgedOnAnyPath pins finding 3: a
// handler that sets idempotency-replayed itself (a gateway passing a
// downstream server's header on) made a fresh answer read as a replay on
// the paths without the capture: a KeyIgnored method and the fail-open
// path. Now a keyed call's handler cannot set the mark on any path; only
// the interceptor sets it, on a replay.
func TestIdempotencyReplayMarkCannotBeForgedOnAnyPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		forger := &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
			_ = grpc.SetHeader(ctx, metadata.Pairs(wire.IdempotencyReplayedHeader, "true", "x-h", "1"))
			_ = grpc.SetTrailer(ctx, metadata.Pairs(wire.IdempotencyReplayedHeader, "true"))
			return &echov1.EchoResponse{Message: req.GetMessage()}, nil
		}}
		tests := []struct {
			name string
			idem Idempotency
		}{
			{"Owner", Idempotency{Store: store}},
			{"KeyIgnored", Idempotency{Store: store, KeyPolicies: map[string]KeyPolicy{idemEchoMethod: KeyIgnored}}},
			{"FailOpen", Idempotency{Store: idemDownStore{}, FailOpen: true}},
		}
		for _, tt := range tests {
			cc := idemStart(t, forger, tt.idem)
			c := idemDo(context.Background(), cc, "k-"+tt.name, "m")
			if c.err != nil {
				t.Fatalf("%s: %v", tt.name, c.err)
			}
			if wire.IdempotencyReplayed(c.header) || len(c.header.Get(wire.IdempotencyReplayedHeader)) != 0 ||
				len(c.trailer.Get(wire.IdempotencyReplayedHeader)) != 0 || len(c.header.Get("x-h")) != 1 {
				t.Errorf("%s: a fresh answer came with header %v, trailer %v; want the handler's x-h and no replay mark",
					tt.name, c.header, c.trailer)
			}
		}
	})
}
