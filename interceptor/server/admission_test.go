package server

import (
	"context"
	"maps"
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
				e, release, ran := countingHoldEcho()
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
				if got := ran(); got["gone"] != 0 || got["live"] != 1 {
					t.Errorf("handlers run: %v; want none for the caller that went, one for the live one", got)
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

// TestAdmissionEveryPathMeetsTheLimitAndShutdown walks each way a unary
// call reaches its handler (no key, a key on a KeyIgnored method, a key
// run plainly because the store failed and the server fails open, the
// owner of a key) through the same two gates: under a limit of 1 whose one
// slot is held and whose queue holds one call, the path's first call waits
// in the queue and its second is shed at once (RESOURCE_EXHAUSTED); then
// Shutdown takes the queued one out (UNAVAILABLE), and a call after it is
// refused before it runs. No handler of the path runs, and nothing is
// held but the slot of the call that holds it. Finding 3 of issue 33 was
// one path missing one guard; this keeps every path on every guard.
func TestAdmissionEveryPathMeetsTheLimitAndShutdown(t *testing.T) {
	mem := func(t *testing.T) idempotency.Store {
		s, err := idempotency.NewMemoryStore()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	paths := []struct {
		name string
		idem func(t *testing.T) Idempotency
		key  string
	}{
		{"NoKey", func(t *testing.T) Idempotency { return Idempotency{Store: mem(t)} }, ""},
		{"KeyIgnored", func(t *testing.T) Idempotency {
			return Idempotency{Store: mem(t), KeyPolicies: map[string]KeyPolicy{idemEchoMethod: KeyIgnored}}
		}, "k"},
		{"FailOpen", func(t *testing.T) Idempotency { return Idempotency{Store: idemDownStore{}, FailOpen: true} }, "k"},
		{"Owner", func(t *testing.T) Idempotency { return Idempotency{Store: mem(t)} }, "k"},
	}
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e, release, ran := countingHoldEcho()
				lim := WithLimits(limitsOf(serviceconfig.ConcurrencyLimit{InitialLimit: 1, MinLimit: 1, MaxLimit: 1,
					MaxQueue: 1, MaxQueueWait: time.Hour}))
				s, cc := idemStartServer(t, e, p.idem(t), lim)
				key := func(k string) string {
					if p.key == "" {
						return ""
					}
					return p.key + "-" + k
				}
				held := make(chan idemCall, 1)
				go func() { held <- idemDo(context.Background(), cc, "", "hold") }()
				synctest.Wait()
				queued := make(chan idemCall, 1)
				go func() { queued <- idemDo(context.Background(), cc, key("queued"), "queued") }()
				synctest.Wait()
				if st := s.LimitStatuses()[0]; st.InFlight != 1 || st.Queued != 1 {
					t.Fatalf("%d in flight, %d queued; want the held call, and the path's call in the queue", st.InFlight, st.Queued)
				}
				wantCode(t, "the path's call past a full queue", idemDo(context.Background(), cc, key("shed"), "shed").err,
					codes.ResourceExhausted, "")
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				if err := s.Shutdown(ctx); err != nil {
					t.Errorf("Shutdown = %v, want nil (no keyed handler runs)", err)
				}
				wantCode(t, "the path's queued call at Shutdown", (<-queued).err, codes.Unavailable, "shutting down")
				wantCode(t, "the path's call after Shutdown", idemDo(context.Background(), cc, key("late"), "late").err,
					codes.Unavailable, "shutting down")
				if st := s.LimitStatuses()[0]; st.InFlight != 1 || st.Queued != 0 {
					t.Errorf("after Shutdown: %d in flight, %d queued; want the held call's slot only", st.InFlight, st.Queued)
				}
				close(release)
				if r := <-held; r.err != nil {
					t.Fatal(r.err)
				}
				synctest.Wait()
				if got := ran(); len(got) != 1 || got["hold"] != 1 {
					t.Errorf("handlers run: %v; want the held call's only", got)
				}
				if st := s.LimitStatuses()[0]; st.InFlight != 0 || st.Queued != 0 {
					t.Errorf("at the end: %d in flight, %d queued; want nothing held", st.InFlight, st.Queued)
				}
			})
		})
	}
}

// countingHoldEcho returns an echo whose handler counts the runs of each
// message and holds the message "hold" until release is closed; ran
// returns a copy of the counts.
func countingHoldEcho() (e *idemEcho, release chan struct{}, ran func() map[string]int) {
	release = make(chan struct{})
	var mu sync.Mutex
	runs := map[string]int{}
	e = &idemEcho{fn: func(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
		mu.Lock()
		runs[req.GetMessage()]++
		mu.Unlock()
		if req.GetMessage() == "hold" {
			<-release
		}
		return &echov1.EchoResponse{Message: req.GetMessage()}, nil
	}}
	return e, release, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(runs)
	}
}
