package server

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// costEcho answers Echo after echoTook (fake time) and Lookup at once: an
// expensive method and a cheap one on one server.
type costEcho struct {
	echov1.UnimplementedEchoServiceServer
	echoTook atomic.Int64 // a time.Duration
}

func newCostEcho(echoTook time.Duration) *costEcho {
	e := &costEcho{}
	e.echoTook.Store(int64(echoTook))
	return e
}

func (e *costEcho) Echo(_ context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	time.Sleep(time.Duration(e.echoTook.Load()))
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

func (e *costEcho) Lookup(_ context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

// TestLimitCheapMethodDoesNotShedAnExpensiveOne pins finding 1 of issue
// 33: every OK call fed one shared base RTT, so a method that answers in
// microseconds became the base and every 10ms call looked queued. 16
// callers of a steady 10ms method (the service has room for all of them:
// nothing queues), beside a cheap method: with AIMD and one cheap call
// every 50ms (about 1% of the calls), the limit fell to 1 and 77-80% of
// the 10ms calls were shed; with Vegas and one cheap call every
// millisecond, it fell to 5, 58-67% were shed, and it stayed there. Any
// caller could do it. Now each method has a base RTT and a door of its own
// (a cost class): the limit stays above the 16 callers and sheds none of
// them.
func TestLimitCheapMethodDoesNotShedAnExpensiveOne(t *testing.T) {
	tests := []struct {
		algorithm  string
		cheapEvery time.Duration
	}{
		{"aimd", 50 * time.Millisecond},
		{"vegas", time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.algorithm, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newLimitServer(t, limitsOf(serviceconfig.ConcurrencyLimit{Algorithm: tt.algorithm}))
				client := serveLimited(t, newCostEcho(10*time.Millisecond), srv)
				const run = 5 * time.Second
				end := time.Now().Add(run)
				var calls, shed, cheap atomic.Int64
				var wg sync.WaitGroup
				for range 16 {
					wg.Go(func() {
						for time.Now().Before(end) {
							_, err := client.Echo(context.Background(), &echov1.EchoRequest{})
							calls.Add(1)
							switch status.Code(err) {
							case codes.OK:
							case codes.ResourceExhausted:
								shed.Add(1)
								time.Sleep(10 * time.Millisecond) // a shed takes no time: come back later
							default:
								t.Errorf("Echo: %v", err)
								return
							}
						}
					})
				}
				wg.Go(func() {
					for time.Now().Before(end) {
						if _, err := client.Lookup(context.Background(), &echov1.LookupRequest{}); err == nil {
							cheap.Add(1)
						}
						time.Sleep(tt.cheapEvery)
					}
				})
				wg.Wait()
				st := srv.LimitStatuses()[0]
				t.Logf("%s: %d calls of 10ms, %d shed; %d cheap calls; %+v", tt.algorithm, calls.Load(), shed.Load(), cheap.Load(), st)
				if shed.Load() > 0 || st.Limit < 16 || st.InFlight != 0 {
					t.Errorf("%s: %d of %d calls of the 10ms method shed, limit %d, %d in flight; "+
						"want none shed, a limit of 16 or more, nothing held", tt.algorithm, shed.Load(), calls.Load(), st.Limit, st.InFlight)
				}
			})
		})
	}
}

// TestLimitDoorReopensWithinAServiceTime pins the door's recovery (issue
// 33, finding 4): after a slow phase of 400ms calls, an idle server whose
// service is fast again (5ms) gets calls with 150ms deadlines, one every
// 10ms. The door refused them for 8 smoothed latencies (3.2s) and let one
// through every 64: 557-577 were refused, the first served 3.21s after the
// service was fast. Now the door lets one through per service time it
// holds, whose fast answer reopens it: the first is served within about one
// (slow) service time.
func TestLimitDoorReopensWithinAServiceTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		impl := newCostEcho(400 * time.Millisecond)
		srv := newLimitServer(t, limitsOf(serviceconfig.ConcurrencyLimit{}))
		client := serveLimited(t, impl, srv)
		for range 20 {
			if err := echoWithin(client, 0, "slow"); err != nil {
				t.Fatal(err)
			}
		}
		// A short call during the slow phase: refused at the door, or let
		// through to test it (and cut by its deadline).
		for range 5 {
			if err := echoWithin(client, 150*time.Millisecond, "m"); err == nil {
				t.Fatalf("150ms call while the service takes 400ms succeeded")
			}
		}
		impl.echoTook.Store(int64(5 * time.Millisecond))
		fast := time.Now()
		refused := 0
		var firstOK time.Duration = -1
		for range 300 { // 3s
			start := time.Now()
			err := echoWithin(client, 150*time.Millisecond, "m")
			switch {
			case err == nil && firstOK < 0:
				firstOK = start.Sub(fast)
			case isDoorReject(err):
				refused++
			}
			time.Sleep(10*time.Millisecond - time.Since(start))
		}
		t.Logf("after the service was fast again: first served at %v, %d refused at the door; %+v", firstOK, refused, srv.LimitStatuses())
		if firstOK < 0 || firstOK > 450*time.Millisecond || refused > 45 {
			t.Errorf("first 150ms call served %v after the service was fast again, %d refused at the door; "+
				"want within about one service time (450ms), at most 45 refused", firstOK, refused)
		}
	})
}

// TestLimitProbesWhileShedding pins the probe of a limit that sheds
// (issue 33, REVIEW class 1) over gRPC: an AIMD limit, a server of 20
// tokens × 100ms under twice its capacity, whose service becomes three
// times slower for good. AIMD has no probe on one latency, and its base RTT
// stayed at 100ms while every latency was 300ms or more: it shed at its
// minimum (one call at a time, a twentieth of the tokens) for as long as
// the base's windows took to age out. Now a limit that keeps calling for a
// lower one while it sheds drains to half of itself, and relearns its base
// RTT from the calls admitted after: the tokens are busy again.
func TestLimitProbesWhileShedding(t *testing.T) {
	const dur, last = 20 * time.Second, 3 * time.Second
	var res *loadResult
	var st []LimitStatus
	synctest.Test(t, func(t *testing.T) {
		srv := newLimitServer(t, limitsOf(serviceconfig.ConcurrencyLimit{Algorithm: "aimd"}))
		ce := newCapacityEcho(ovTokens, ovService)
		cc := serveEcho(t, ce, srv)
		load{gap: ovGap(2), dur: 2 * time.Second, deadline: ovDeadline}.run(cc)
		ce.slower.Store(int64(2 * ovService))
		res = load{gap: ovGap(2), dur: dur, deadline: ovDeadline, measureFrom: dur - last}.run(cc)
		synctest.Wait()
		ce.active.Wait()
		st = srv.LimitStatuses()
	})
	// In the last 3s the capacity is 20 tokens × 300ms: 200 calls.
	served := float64(res.good[0]) / (float64(ovTokens) * float64(last) / float64(3*ovService))
	t.Logf("last %v after the slowdown: %d calls served (%.1f%% of the capacity), codes %v; %+v", last, res.good[0], 100*served, res.codes, st)
	if served < 0.9 {
		t.Errorf("served %.3f of the capacity after a lasting slowdown under overload, want ≥ 0.9", served)
	}
}
