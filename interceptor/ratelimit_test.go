package interceptor

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/internal/ratelimit"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// quotaServer is an echo server with a rate limit of its own: it admits
// one call per every (GCRA with a burst of 1) and refuses the others with
// RESOURCE_EXHAUSTED and a RetryInfo carrying the exact time until a call
// would be admitted (or hint, when set, whatever that time). It records
// when each call arrived, relative to start.
type quotaServer struct {
	echov1.UnimplementedEchoServiceServer
	every time.Duration
	hint  time.Duration
	start time.Time

	mu       sync.Mutex
	next     time.Time
	admitted []time.Duration // guarded by mu
	refused  []time.Duration // guarded by mu
}

func newQuotaServer(every time.Duration) *quotaServer {
	return &quotaServer{every: every, start: time.Now()}
}

func (s *quotaServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Before(s.next) {
		s.refused = append(s.refused, now.Sub(s.start))
		wait := s.next.Sub(now)
		if s.hint > 0 {
			wait = s.hint
		}
		st, _ := status.New(codes.ResourceExhausted, "over quota").WithDetails(
			&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)},
			&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "test", Description: "echo-quota"}}})
		return nil, st.Err()
	}
	s.next = now.Add(s.every)
	s.admitted = append(s.admitted, now.Sub(s.start))
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

func (s *quotaServer) counts() (admitted, refused []time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.admitted...), append([]time.Duration(nil), s.refused...)
}

// rateConfig gives Echo the rateLimit block rl, and the retry policy rp
// (nil: none).
func rateConfig(rl *serviceconfig.ClientRateLimit, rp *serviceconfig.RetryPolicy) ClientOption {
	return WithMethodConfig(serviceconfig.MethodConfig{
		Name:        []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
		RetryPolicy: rp,
		RateLimit:   rl,
	})
}

// quotaEcho starts srv and a client built with opts, in a synctest bubble.
func quotaEcho(t *testing.T, srv echov1.EchoServiceServer, opts ...ClientOption) (echov1.EchoServiceClient, *Client) {
	t.Helper()
	c := newTestClient(t, opts...)
	cc := testserver.Start(t, srv, c.DialOptions()...)
	return echov1.NewEchoServiceClient(cc), c
}

// TestRateLimitPacingSendsOneDoomedAttemptPerPushback pins the issue's
// promise: a server that admits one call per 100ms and answers the others
// with RetryInfo; four callers each calling every 20ms (a call every 5ms in
// all) for 2 s. Paced by the server's answer, the client sends at most one
// refused attempt per pushback period (here 20 over 2 s); the others fail
// at once, locally, with RESOURCE_EXHAUSTED and a RetryInfo. Without the
// block, every call is a refused attempt (380 of 400).
func TestRateLimitPacingSendsOneDoomedAttemptPerPushback(t *testing.T) {
	for _, tc := range []struct {
		name        string
		block       *serviceconfig.ClientRateLimit
		maxRefused  int
		wantLocal   bool
		minAdmitted int
	}{
		{name: "paced", block: &serviceconfig.ClientRateLimit{}, maxRefused: 21, wantLocal: true, minAdmitted: 19},
		{name: "plain", block: nil, maxRefused: 400, minAdmitted: 19},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := newQuotaServer(100 * time.Millisecond)
				stub, _ := quotaEcho(t, srv, rateConfig(tc.block, nil))
				var wg sync.WaitGroup
				var mu sync.Mutex
				local := 0
				for g := range 4 {
					wg.Go(func() {
						time.Sleep(time.Duration(g) * 5 * time.Millisecond)
						for range 100 {
							_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
							if errors.Is(err, ErrRateLimited) {
								if status.Code(err) != codes.ResourceExhausted || retryInfo(err) <= 0 {
									t.Errorf("local refusal %v: want RESOURCE_EXHAUSTED with a RetryInfo", err)
								}
								mu.Lock()
								local++
								mu.Unlock()
							}
							time.Sleep(20 * time.Millisecond)
						}
					})
				}
				wg.Wait()
				admitted, refused := srv.counts()
				t.Logf("%s: admitted %d, refused by the server %d, refused locally %d", tc.name, len(admitted), len(refused), local)
				if len(refused) > tc.maxRefused {
					t.Errorf("the server refused %d attempts, want at most %d (one per pushback period)", len(refused), tc.maxRefused)
				}
				if len(admitted) < tc.minAdmitted {
					t.Errorf("the server admitted %d calls, want at least %d: pacing must not starve the method", len(admitted), tc.minAdmitted)
				}
				if tc.wantLocal != (local > 0) {
					t.Errorf("refused locally: %d", local)
				}
				if tc.name == "plain" && len(refused) < 300 {
					t.Errorf("plain: the server refused %d, want most of 400: the comparison is void", len(refused))
				}
			})
		})
	}
}

// retryInfo returns the RetryInfo delay of err's status, or 0.
func retryInfo(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// TestRateLimitOwnRateWaitsWithinTheDeadline: a client limit of 10 per
// second with a burst of 1 and a maxWait of 1 s; five calls at once, each
// with a 250ms deadline: the first goes at once, the next two wait 100 and
// 200ms, and the last two, whose wait (300ms, 400ms) their deadline cannot
// cover, fail at once, locally, never starting a wait; the server sees
// three calls, 100ms apart.
func TestRateLimitOwnRateWaitsWithinTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		stub, c := quotaEcho(t, srv, rateConfig(&serviceconfig.ClientRateLimit{Rate: 10, Burst: 1, MaxWait: time.Second}, nil))
		type result struct {
			err  error
			took time.Duration
		}
		results := make(chan result, 5)
		for range 5 {
			go func() {
				ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
				defer cancel()
				start := time.Now()
				_, err := stub.Echo(ctx, &echov1.EchoRequest{})
				results <- result{err, time.Since(start)}
			}()
			synctest.Wait()
		}
		var ok, local int
		for range 5 {
			r := <-results
			switch {
			case r.err == nil:
				ok++
			case errors.Is(r.err, ErrRateLimited):
				local++
				if r.took != 0 {
					t.Errorf("a local refusal took %v, want at once", r.took)
				}
				if got := retryInfo(r.err); got != 300*time.Millisecond && got != 400*time.Millisecond {
					t.Errorf("local refusal's RetryInfo = %v, want 300ms or 400ms", got)
				}
			default:
				t.Errorf("Echo = %v", r.err)
			}
		}
		admitted, _ := srv.counts()
		want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond}
		if ok != 3 || local != 2 || !equalDurations(admitted, want) {
			t.Fatalf("ok %d, local %d, server saw %v; want 3, 2, %v", ok, local, admitted, want)
		}
		if s := c.Status(echoMethod).RateLimit; s == nil || s.Waiting != 0 {
			t.Fatalf("Status(Echo).RateLimit = %+v, want nothing waiting", s)
		}
	})
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestRateLimitCancelMidWaitHoldsNothing: fifty calls wait for their
// tokens (1 per second, maxWait 1 min); their callers all give up at
// 500ms. Every call ends at once with CANCELLED, nothing waits, no
// goroutine is left (goleak), and the tokens came back: the next call
// waits for the token after the first call's, at 1 s, not after fifty.
func TestRateLimitCancelMidWaitHoldsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		stub, c := quotaEcho(t, srv, rateConfig(&serviceconfig.ClientRateLimit{Rate: 1, Burst: 1, MaxWait: time.Minute}, nil))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		errs := make(chan error, 50)
		for range 50 {
			go func() { _, err := stub.Echo(ctx, &echov1.EchoRequest{}); errs <- err }()
		}
		synctest.Wait()
		if s := c.Status(echoMethod).RateLimit; s.Waiting != 50 {
			t.Fatalf("Waiting = %d, want 50", s.Waiting)
		}
		time.Sleep(500 * time.Millisecond)
		cancel()
		for range 50 {
			if err := <-errs; status.Code(err) != codes.Canceled {
				t.Errorf("Echo cancelled mid-wait = %v, want CANCELLED", err)
			}
		}
		if s := c.Status(echoMethod).RateLimit; s.Waiting != 0 {
			t.Fatalf("Waiting = %d after the cancellations, want 0", s.Waiting)
		}
		start := time.Now()
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 500*time.Millisecond {
			t.Fatalf("the next call waited %v, want 500ms (its token at 1 s)", d)
		}
		if admitted, _ := srv.counts(); len(admitted) != 2 {
			t.Fatalf("the server saw %d calls, want 2", len(admitted))
		}
	})
}

// TestRateLimitRetryWaitsItsSlot: a retry after a server's RetryInfo of
// 300ms goes exactly 300ms later, and a call of the method that comes
// meanwhile (willing to wait 1 s) is paced behind it, in the slot a period
// later, instead of sending a doomed attempt.
func TestRateLimitRetryWaitsItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		srv.next = srv.start.Add(300 * time.Millisecond) // over quota until 300ms
		stub, _ := quotaEcho(t, srv, rateConfig(&serviceconfig.ClientRateLimit{MaxWait: time.Second}, fastPolicy(3)))
		first := make(chan error, 1)
		go func() { _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); first <- err }()
		time.Sleep(100 * time.Millisecond)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("the paced call = %v", err)
		}
		if err := <-first; err != nil {
			t.Fatalf("the retried call = %v", err)
		}
		admitted, refused := srv.counts()
		if !equalDurations(refused, []time.Duration{0}) || !equalDurations(admitted, []time.Duration{300 * time.Millisecond, 600 * time.Millisecond}) {
			t.Fatalf("server refused at %v and admitted at %v; want [0] and [300ms 600ms]", refused, admitted)
		}
	})
}

// TestRateLimitPacedCallGoesInItsSlot: as above, but the server still
// refuses the retry at 300ms (over quota until 450ms; every RetryInfo says
// 300ms): the call waiting behind the retry goes in its slot at 600ms and
// is admitted, and the retry's next attempt goes in the slot after that,
// at 900ms, which it took when it decided to wait. Two refused attempts in
// all.
func TestRateLimitPacedCallGoesInItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		srv.next = srv.start.Add(450 * time.Millisecond)
		srv.hint = 300 * time.Millisecond
		stub, _ := quotaEcho(t, srv, rateConfig(&serviceconfig.ClientRateLimit{MaxWait: time.Second}, fastPolicy(3)))
		first := make(chan error, 1)
		go func() { _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); first <- err }()
		time.Sleep(100 * time.Millisecond)
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("the paced call = %v", err)
		}
		if err := <-first; err != nil {
			t.Fatalf("the retried call = %v", err)
		}
		admitted, refused := srv.counts()
		ms := time.Millisecond
		if !equalDurations(refused, []time.Duration{0, 300 * ms}) || !equalDurations(admitted, []time.Duration{600 * ms, 900 * ms}) {
			t.Fatalf("server refused at %v and admitted at %v", refused, admitted)
		}
	})
}

// TestRateLimitAbsurdServerHintIsCapped: a server that answers with a
// RetryInfo of 1,000 hours paces the method by WithMaxServerPushback (2 s)
// at most: the next call goes 2 s later; each admitted call then halves
// the spacing, until the pacing ends under a millisecond.
func TestRateLimitAbsurdServerHintIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		srv.hint = 1000 * time.Hour
		srv.next = srv.start.Add(time.Millisecond)
		stub, c := quotaEcho(t, srv, rateConfig(&serviceconfig.ClientRateLimit{MaxWait: 10 * time.Second}, nil), WithMaxServerPushback(2*time.Second))
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); status.Code(err) != codes.ResourceExhausted || errors.Is(err, ErrRateLimited) {
			t.Fatalf("first Echo = %v, want the server's RESOURCE_EXHAUSTED", err)
		}
		s := c.Status(echoMethod).RateLimit
		if s.Period != 2*time.Second || s.PacedUntil.Sub(srv.start) != 2*time.Second {
			t.Fatalf("after a hint of 1000h: %+v, want a period of 2s", s)
		}
		start := time.Now()
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Fatalf("the next call waited %v, want 2s", d)
		}
		if s := c.Status(echoMethod).RateLimit; s.Period != time.Second {
			t.Fatalf("after an admitted call: %+v, want the spacing halved to 1s", s)
		}
		start = time.Now()
		for c.Status(echoMethod).RateLimit.Period != 0 {
			if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
				t.Fatal(err)
			}
		}
		// 1s + 500ms + ... + 1.95ms: the slots the admitted calls took.
		if d := time.Since(start); d < 1990*time.Millisecond || d > 2*time.Second {
			t.Fatalf("back to full speed after %v, want about 2s (twice the capped pushback)", d)
		}
	})
}

// TestRateLimitConfigUpdateMidFlight: calls waiting for their token at a
// rate of 1 per second keep the token they took when an update raises the
// rate to 1,000 per second, and the new calls go at the new rate at once;
// an update removing the block leaves the waiters to end as they would,
// and nothing is held after.
func TestRateLimitConfigUpdateMidFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		slow := &serviceconfig.ClientRateLimit{Rate: 1, Burst: 1, MaxWait: time.Minute}
		stub, c := quotaEcho(t, srv, rateConfig(slow, nil))
		waiters := echoAsync(t, stub, 3) // at 0, 1 s and 2 s
		fast := &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name:      []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
			RateLimit: &serviceconfig.ClientRateLimit{Rate: 1000, Burst: 10},
		}}}
		if err := c.UpdateServiceConfig(fast); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range 10 {
			if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
				t.Fatalf("Echo under the new rate = %v", err)
			}
		}
		if time.Since(start) != 0 {
			t.Fatalf("new calls waited %v under a burst of 10", time.Since(start))
		}
		if err := c.UpdateServiceConfig(&serviceconfig.Config{}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := <-waiters; err != nil {
				t.Errorf("a waiter = %v", err)
			}
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("the waiters ended %v after the update, want 2s (their own tokens)", d)
		}
	})
}

// TestRateLimitRefusalIsNoBackendFailure: local rate-limit refusals never
// reach the server and never count against the method's breaker (one
// failure would open it).
func TestRateLimitRefusalIsNoBackendFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		stub, c := quotaEcho(t, srv, WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
			RateLimit:      &serviceconfig.ClientRateLimit{Rate: 1, Burst: 1},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1},
		}))
		for i := range 20 {
			_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
			if i > 0 && !errors.Is(err, ErrRateLimited) {
				t.Fatalf("call %d = %v, want ErrRateLimited", i, err)
			}
		}
		if b := c.Status(echoMethod).Breaker; b.State != BreakerClosed || b.Failures != 0 {
			t.Fatalf("breaker after 19 local refusals: %+v, want closed with no failure", b)
		}
		if admitted, refused := srv.counts(); len(admitted) != 1 || len(refused) != 0 {
			t.Fatalf("server saw %d + %d, want 1 call", len(admitted), len(refused))
		}
	})
}

// TestRateLimitCoversStreamsAndHedges: the gate applies on every path:
// a stream is refused locally as a unary call is, and a hedged call sends
// no copy beyond the rate.
func TestRateLimitCoversStreamsAndHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: 50 * time.Millisecond} })
		one := &serviceconfig.ClientRateLimit{Rate: 1, Burst: 1}
		c := newTestClient(t, WithMethodConfig(
			serviceconfig.MethodConfig{
				Name:      []serviceconfig.Name{{Service: echoService, Method: "ServerStream"}},
				RateLimit: one,
			},
			serviceconfig.MethodConfig{
				Name:          []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
				RateLimit:     one,
				HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 3, HedgingDelay: 10 * time.Millisecond},
			}))
		stub := echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))
		for i := range 2 {
			s, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "m", Count: 1})
			if err == nil {
				_, err = s.Recv()
			}
			if want := i == 1; errors.Is(err, ErrRateLimited) != want {
				t.Fatalf("stream %d = %v, want rate limited: %v", i, err, want)
			}
		}
		if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
			t.Fatalf("hedged Echo = %v", err)
		}
		if n := srv.Count("Echo"); n != 1 {
			t.Fatalf("the server saw %d copies of the hedged call, want 1 (the rate's burst)", n)
		}
	})
}

// TestRateLimitManyCallersRandomCancellations: 200 callers, a third of
// them giving up mid-wait, against a rate of 100 per second and a server
// that pushes back: every call ends, nothing waits after, and the server
// never saw more than the rate allows (burst + rate × time).
func TestRateLimitManyCallersRandomCancellations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(5 * time.Millisecond)
		stub, c := quotaEcho(t, srv, rateConfig(&serviceconfig.ClientRateLimit{Rate: 100, Burst: 5, MaxWait: 500 * time.Millisecond}, fastPolicy(3)))
		start := time.Now()
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Go(func() {
				ctx := t.Context()
				if i%3 == 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i)*time.Millisecond)
					defer cancel()
				}
				time.Sleep(time.Duration(i%7) * time.Millisecond)
				_, _ = stub.Echo(ctx, &echov1.EchoRequest{})
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		admitted, refused := srv.counts()
		if sent, most := len(admitted)+len(refused), 5+int(elapsed/(10*time.Millisecond))+1; sent > most {
			t.Fatalf("the server saw %d attempts in %v, over the client's rate (at most %d)", sent, elapsed, most)
		}
		if s := c.Status(echoMethod).RateLimit; s.Waiting != 0 {
			t.Fatalf("Waiting = %d, want 0", s.Waiting)
		}
	})
}

// TestRateLimitUnderTheRateAllocatesNothing: a method with a rateLimit
// block adds no allocation to a call under its rate, with or without a
// pushback having ended.
func TestRateLimitUnderTheRateAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are checked without -race")
	}
	c := newTestClient(t, rateConfig(&serviceconfig.ClientRateLimit{Rate: 1e8, Burst: 1 << 20, MaxWait: time.Second}, fastPolicy(3)))
	ic := c.UnaryClientInterceptor()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	_ = ic(ctx, echoMethod, req, reply, nil, okInvoker)
	if n := testing.AllocsPerRun(1000, func() { _ = ic(ctx, echoMethod, req, reply, nil, okInvoker) }); n != 0 {
		t.Errorf("allocs per call under the rate = %v, want 0", n)
	}
	var _ grpc.UnaryInvoker = okInvoker
}

// TestRateLimitRefusalMetricsAndStop: a local refusal counts in
// resilience.client.rejections with reason rate_limited, and a call under
// a retry policy stops with StopRateLimited, its error a *RejectedError.
func TestRateLimitRefusalMetricsAndStop(t *testing.T) {
	reader, mp := newMeterReader()
	var stops []StopReason
	c := newTestClient(t, WithMeterProvider(mp), WithOnStop(func(_ context.Context, e StopEvent) {
		stops = append(stops, e.Reason)
	}), rateConfig(&serviceconfig.ClientRateLimit{Rate: 1, Per: time.Hour, Burst: 1}, fastPolicy(3)))
	ic := c.UnaryClientInterceptor()
	req, reply := &echov1.EchoRequest{}, &echov1.EchoResponse{}
	if err := ic(context.Background(), echoMethod, req, reply, nil, okInvoker, grpc.StaticMethod()); err != nil {
		t.Fatal(err)
	}
	err := ic(context.Background(), echoMethod, req, reply, nil, okInvoker, grpc.StaticMethod())
	re, ok := errors.AsType[*RejectedError](err)
	if !ok || !errors.Is(err, ErrRateLimited) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second call = %v, want a *RejectedError with ErrRateLimited, RESOURCE_EXHAUSTED", err)
	}
	if re.RetryAfter < 59*time.Minute || retryInfo(err) != re.RetryAfter {
		t.Errorf("RetryAfter %v, RetryInfo %v: want about an hour, the same", re.RetryAfter, retryInfo(err))
	}
	if len(stops) != 1 || stops[0] != StopRateLimited {
		t.Errorf("stop reasons %v, want [%v]", stops, StopRateLimited)
	}
	got := collect(t, reader)
	got.Expect(t, metricRejections, "{attempt}", map[string]float64{echoMethodAttr + ",resilience.reason=rate_limited": 1})
}

// TestRateLimitStreamPacedByTrailer: a stream that the server refuses with
// RESOURCE_EXHAUSTED and the grpc-retry-pushback-ms trailer (no RetryInfo)
// paces the method: the next stream fails locally until the wait passed.
func TestRateLimitStreamPacedByTrailer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			if a.N == 1 {
				return testserver.Outcome{Err: status.Error(codes.ResourceExhausted, "over quota"),
					Trailer: map[string][]string{"grpc-retry-pushback-ms": {"250"}}}
			}
			return testserver.Outcome{}
		})
		c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
			Name:      []serviceconfig.Name{{Service: echoService, Method: "ServerStream"}},
			RateLimit: &serviceconfig.ClientRateLimit{},
		}))
		stub := echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))
		recv := func() error {
			s, err := stub.ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "m", Count: 1})
			if err != nil {
				return err
			}
			for {
				if _, err := s.Recv(); err != nil {
					if err.Error() == "EOF" {
						return nil
					}
					return err
				}
			}
		}
		if err := recv(); status.Code(err) != codes.ResourceExhausted || errors.Is(err, ErrRateLimited) {
			t.Fatalf("first stream = %v, want the server's RESOURCE_EXHAUSTED", err)
		}
		if err := recv(); !errors.Is(err, ErrRateLimited) || retryInfo(err) != 250*time.Millisecond {
			t.Fatalf("second stream = %v, want ErrRateLimited with a RetryInfo of 250ms", err)
		}
		time.Sleep(250 * time.Millisecond)
		if err := recv(); err != nil {
			t.Fatalf("stream after the wait = %v", err)
		}
		if n := srv.Count("ServerStream"); n != 2 {
			t.Fatalf("the server saw %d streams, want 2", n)
		}
	})
}

// TestRateLimitHedgeCopyRefusedInTheQueueGivesItsTokenBack pins the
// release on the hedged path: a copy that took its token at the gate and
// then waited in the bulkhead's queue, but was never sent (the queue's
// wait ended, or a sibling's answer ended the copies while it queued),
// gives its token back, as a plain attempt refused past the gate does.
// Before, it kept it: with a burst of 2, the next call was refused by the
// client's own rate though the server had seen one attempt.
func TestRateLimitHedgeCopyRefusedInTheQueueGivesItsTokenBack(t *testing.T) {
	for _, tc := range []struct {
		name      string
		queueWait time.Duration
	}{
		{"queue wait ends", 20 * time.Millisecond},
		{"sibling answers", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(testserver.Attempt) testserver.Outcome { return testserver.Outcome{Delay: 50 * time.Millisecond} })
				c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
					Name:          []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
					RateLimit:     &serviceconfig.ClientRateLimit{Rate: 1, Per: time.Hour, Burst: 2},
					HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 10 * time.Millisecond},
					Bulkhead:      &serviceconfig.Bulkhead{MaxConcurrent: 1, MaxQueue: 1, MaxQueueWait: tc.queueWait},
				}))
				stub := echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))
				if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
					t.Fatalf("hedged Echo = %v", err)
				}
				synctest.Wait() // the queued copy has settled
				if n := srv.Count("Echo"); n != 1 {
					t.Fatalf("the server saw %d copies, want 1 (the second never left the queue)", n)
				}
				if _, err := stub.Echo(t.Context(), &echov1.EchoRequest{}); err != nil {
					t.Fatalf("the next call = %v, want admitted on the token the unsent copy gave back", err)
				}
			})
		})
	}
}

// TestRateLimitRetryOutOfTimeAfterItsWaitGivesItsSlotBack pins the release
// of the pace's slot a retry takes when it decides to wait for the
// server's pushback (100ms): the retry fits the deadline when it decides
// (111ms left, 10ms of headroom), but an OnRetry hook that takes 2ms (a
// slow log sink; in real time, a timer that fires late does the same)
// leaves 9ms once the wait is over, less than the headroom, so no attempt
// is sent and the call ends with StopDeadline. The slot was never used:
// given back, the next free slot is now. It used to stay taken, so the
// method's next attempt waited a whole pushback period for no attempt at
// all.
func TestRateLimitRetryOutOfTimeAfterItsWaitGivesItsSlotBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const headroom = 10 * time.Millisecond
		srv := newQuotaServer(0)
		srv.next, srv.hint = srv.start.Add(time.Hour), 100*time.Millisecond
		var stop StopReason // the hooks run on the caller's goroutine
		stub, c := quotaEcho(t, srv, WithRetryBudget(nil), WithDeadlineHeadroom(headroom), WithAttemptEstimateFloor(0),
			WithOnRetry(func(context.Context, RetryEvent) { time.Sleep(2 * time.Millisecond) }),
			WithOnStop(func(_ context.Context, e StopEvent) { stop = e.Reason }),
			rateConfig(&serviceconfig.ClientRateLimit{}, &serviceconfig.RetryPolicy{MaxAttempts: 3,
				InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, BackoffMultiplier: 1,
				RetryableStatusCodes: []codes.Code{codes.ResourceExhausted}}))
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond+headroom+time.Millisecond)
		defer cancel()
		start := time.Now()
		if _, err := stub.Echo(ctx, &echov1.EchoRequest{}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Echo = %v, want the server's RESOURCE_EXHAUSTED", err)
		}
		if d := time.Since(start); d != 102*time.Millisecond {
			t.Fatalf("the call took %v, want the hook's 2ms and the retry's wait, 100ms", d)
		}
		if _, refused := srv.counts(); len(refused) != 1 || stop != StopDeadline {
			t.Fatalf("%d attempts, stopped by %v; want 1 attempt, then the retry out of time (StopDeadline)", len(refused), stop)
		}
		next, period := policyOf(c, echoMethod).g.rate.pace.Snapshot()
		if now := time.Now(); period != 100*time.Millisecond || next.After(now) {
			t.Errorf("pace: next free slot in %v (period %v), want now: the retry's unused slot given back", next.Sub(now), period)
		}
	})
}

// TestRateLimitRetryRefusedByTheBreakerGivesItsSlotBack pins the same
// release when the retry, its wait over, is refused past the gate: the
// server's RESOURCE_EXHAUSTED (100ms pushback) opens the breaker
// (consecutiveFailures 1), so the retry that waited for its slot is
// refused by the open breaker and never sent. Its slot is given back: the
// next free slot is now, not a pushback period later.
func TestRateLimitRetryRefusedByTheBreakerGivesItsSlotBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		srv.next, srv.hint = srv.start.Add(time.Hour), 100*time.Millisecond
		stub, c := quotaEcho(t, srv, WithRetryBudget(nil), WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
			RetryPolicy: &serviceconfig.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
				BackoffMultiplier: 1, RetryableStatusCodes: []codes.Code{codes.ResourceExhausted}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 1, OpenDuration: time.Hour,
				FailureStatusCodes: []codes.Code{codes.ResourceExhausted}},
			RateLimit: &serviceconfig.ClientRateLimit{},
		}))
		start := time.Now()
		_, err := stub.Echo(t.Context(), &echov1.EchoRequest{})
		if !errors.Is(err, ErrCircuitOpen) || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("Echo = %v after %v, want the open breaker's refusal of the retry, after its 100ms wait", err, time.Since(start))
		}
		if _, refused := srv.counts(); len(refused) != 1 {
			t.Fatalf("the server saw %d attempts, want 1", len(refused))
		}
		next, period := policyOf(c, echoMethod).g.rate.pace.Snapshot()
		if now := time.Now(); period != 100*time.Millisecond || next.After(now) {
			t.Errorf("pace: next free slot in %v (period %v), want now: the refused retry's slot given back", next.Sub(now), period)
		}
	})
}

// TestRateLimitRetryWhoseOnRetryHookPanicsGivesItsSlotBack pins the same
// release when the user's OnRetry hook panics after the retry took its
// slot of the pace (the server's 100ms pushback): the panic goes on up to
// the caller, as it did, and the retry is never sent, so its slot goes
// back. It used to stay taken: the method's next attempt waited a whole
// pushback period for an attempt that never ran.
func TestRateLimitRetryWhoseOnRetryHookPanicsGivesItsSlotBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := newQuotaServer(0)
		srv.next, srv.hint = srv.start.Add(time.Hour), 100*time.Millisecond
		stub, c := quotaEcho(t, srv, WithRetryBudget(nil),
			WithOnRetry(func(context.Context, RetryEvent) { panic("a hook's bug") }),
			rateConfig(&serviceconfig.ClientRateLimit{}, &serviceconfig.RetryPolicy{MaxAttempts: 3,
				InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, BackoffMultiplier: 1,
				RetryableStatusCodes: []codes.Code{codes.ResourceExhausted}}))
		func() {
			defer func() {
				if p := recover(); p != "a hook's bug" {
					t.Fatalf("Echo with a panicking OnRetry hook: recovered %v, want the hook's panic", p)
				}
			}()
			_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
		}()
		if _, refused := srv.counts(); len(refused) != 1 {
			t.Fatalf("the server saw %d attempts, want 1", len(refused))
		}
		// The server's answer paces the method from now: its next free
		// slot is a period away, the one the retry took and gave back.
		next, period := policyOf(c, echoMethod).g.rate.pace.Snapshot()
		if in := next.Sub(time.Now()); period != 100*time.Millisecond || in != period {
			t.Errorf("pace: next free slot in %v (period %v), want in one period: the unsent retry's slot given back", in, period)
		}
	})
}

// holdQuotaServer holds every call until its caller gives up, but the
// first "push", which it answers when released with RESOURCE_EXHAUSTED and
// a RetryInfo of a second.
type holdQuotaServer struct {
	echov1.UnimplementedEchoServiceServer
	release chan struct{}
	mu      sync.Mutex
	pushed  bool // guarded by mu
}

func (s *holdQuotaServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.mu.Lock()
	push := req.GetMessage() == "push" && !s.pushed
	s.pushed = s.pushed || push
	s.mu.Unlock()
	if !push {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	<-s.release
	st, _ := status.New(codes.ResourceExhausted, "over quota").WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)})
	return nil, st.Err()
}

// TestRateLimitQueuedAttemptRefusedAfterAPushbackKeepsThePushback: an
// attempt (or a hedged copy) passes the gate while nothing is paced, so it
// takes no slot of the pace, and waits in the bulkhead's queue; meanwhile
// the server pushes back for a second. Refused in the queue (its caller
// gave up), it gives back its token but no slot: before, it gave back a
// slot it never took, which moved the pushback's next free slot back a
// whole period, to now, and the method's next attempt went at once,
// inside the second the server asked for.
func TestRateLimitQueuedAttemptRefusedAfterAPushbackKeepsThePushback(t *testing.T) {
	for _, hedged := range []bool{false, true} {
		t.Run(map[bool]string{false: "attempt", true: "hedgedCopy"}[hedged], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &holdQuotaServer{release: make(chan struct{})}
				mc := serviceconfig.MethodConfig{
					Name:      []serviceconfig.Name{{Service: echoService, Method: "Echo"}},
					Bulkhead:  &serviceconfig.Bulkhead{MaxConcurrent: 2, MaxQueue: 4},
					RateLimit: &serviceconfig.ClientRateLimit{},
				}
				if hedged {
					mc.HedgingPolicy = &serviceconfig.HedgingPolicy{MaxAttempts: 2, HedgingDelay: 10 * time.Millisecond,
						NonFatalStatusCodes: []codes.Code{codes.ResourceExhausted}}
				}
				stub, c := quotaEcho(t, srv, WithRetryBudget(nil), WithMethodConfig(mc))
				ctx, cancel := context.WithCancel(t.Context())
				var wg sync.WaitGroup
				call := func(msg string) {
					wg.Add(1)
					go func() {
						defer wg.Done()
						stub.Echo(ctx, &echov1.EchoRequest{Message: msg})
					}()
					synctest.Wait()
				}
				call("hold") // the two slots, at the server
				call("push")
				if hedged {
					time.Sleep(10 * time.Millisecond) // both calls' second copies queue
				} else {
					call("hold") // two attempts queue
					call("hold")
				}
				synctest.Wait()
				close(srv.release) // the pushback: a second; one queued attempt takes the slot
				synctest.Wait()
				p := policyOf(c, echoMethod).g.rate.pace
				want, period := p.Snapshot()
				if period != time.Second || want.Sub(time.Now()) < 900*time.Millisecond {
					t.Fatalf("pace after the pushback: next free slot in %v (period %v), want about a second", want.Sub(time.Now()), period)
				}
				cancel() // the attempt still queued is refused there; the others end at the server
				wg.Wait()
				if next, _ := p.Snapshot(); !next.Equal(want) {
					t.Errorf("pace after the queued attempt was refused: next free slot in %v, want %v: it took no slot of it",
						next.Sub(time.Now()), want.Sub(time.Now()))
				}
			})
		})
	}
}

// TestRateLimitRetrysSlotOfAnEndedPacingTakesNoneOfTheNext: a retry took
// its slot of the pace for the wait after a server's pushback; during the
// wait the pacing ended (admitted attempts brought the spacing under a
// millisecond) and a new pushback of a second began. The retry's attempt
// holds no slot of the new pacing: it takes one, and waits for it, as any
// attempt does. Before, it passed the gate as holding one, and went at
// once, inside the second the server had just asked for.
func TestRateLimitRetrysSlotOfAnEndedPacingTakesNoneOfTheNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pace := new(ratelimit.Pace)
		q := newRateGate(&serviceconfig.ClientRateLimit{MaxWait: 2 * time.Second}, pace, time.Minute, time.Now())
		rej := newRejections(echoMethod)
		pace.Pushback(time.Now(), 100*time.Millisecond)
		_, held, ok := pace.Take(time.Now(), time.Second) // the retry's slot, as retrier.decide takes it
		if !ok || held == 0 {
			t.Fatalf("Take in a pushback = %v, %v", held, ok)
		}
		time.Sleep(100 * time.Millisecond)
		for pace.Active() {
			pace.Success()
		}
		pace.Pushback(time.Now(), time.Second)
		start := time.Now()
		at, tk, err := q.take(t.Context(), start, held, rej)
		if err != nil || at.Sub(start) != time.Second || tk == 0 {
			t.Fatalf("the retry's attempt at the gate: went after %v (slot %v, %v), want after the new pushback's second, in a slot of its own",
				at.Sub(start), tk, err)
		}
		// The slot of the pacing in force is held: no other taken.
		pace.Pushback(time.Now(), time.Second)
		_, cur, _ := pace.Take(time.Now(), time.Hour)
		next, _ := pace.Snapshot()
		if at, _, err := q.take(t.Context(), time.Now(), cur, rej); err != nil || !at.Equal(time.Now()) {
			t.Fatalf("an attempt holding a slot of the pacing in force waited until %v (%v), want none", at, err)
		}
		if n, _ := pace.Snapshot(); !n.Equal(next) {
			t.Fatalf("an attempt holding its slot took another: next free slot %v, want %v", n, next)
		}
	})
}
