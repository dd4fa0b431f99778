package overload

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Messages the capacity server answers specially.
const (
	msgFail = "fail" // INVALID_ARGUMENT at once, no token taken
)

// capacityServer is an echo server of fixed capacity: each Echo holds one
// of Tokens tokens for its service time, waiting for a token as long as its
// context lives; the work itself does not stop with the context, as real
// work rarely does. Lookup answers after its own delay, with no token.
type capacityServer struct {
	echov1.UnimplementedEchoServiceServer
	tokens  chan struct{}
	service time.Duration
	slow    time.Duration // Lookup's delay
	// refuse, when it returns a status, answers Echo with it at once.
	refuse func() error
	calls  atomic.Int64 // Echo calls that reached the handler

	// busy sums, in nanoseconds, the time tokens were held within
	// [from, to) since t0 (set before the load starts), so that a run can
	// tell a limit that left tokens idle from calls that were served
	// late.
	t0        time.Time
	from, to  time.Duration
	busy      atomic.Int64
	holds     atomic.Int64 // calls that took a token within the window
	holdNanos atomic.Int64 // their time holding it, nanoseconds
}

// window makes s sum the time its tokens are held within [from, to) since
// t0.
func (s *capacityServer) window(t0 time.Time, from, to time.Duration) {
	s.t0, s.from, s.to = t0, from, to
}

// held adds the part of [start, end) within the window to busy.
func (s *capacityServer) held(start, end time.Time) {
	if s.t0.IsZero() {
		return
	}
	a, b := max(start.Sub(s.t0), s.from), min(end.Sub(s.t0), s.to)
	if b > a {
		s.busy.Add(int64(b - a))
	}
	if at := start.Sub(s.t0); at >= s.from && at < s.to {
		s.holds.Add(1)
		s.holdNanos.Add(int64(end.Sub(start)))
	}
}

// meanHold is the mean time a call held its token, of the calls that took
// one within the window: the service time as the machine delivered it
// (a sleep overshoots on a busy machine, and the capacity with it).
func (s *capacityServer) meanHold() time.Duration {
	if n := s.holds.Load(); n > 0 {
		return time.Duration(s.holdNanos.Load() / n)
	}
	return 0
}

// utilization is the share of the tokens' time within the window that
// they were held.
func (s *capacityServer) utilization() float64 {
	return float64(s.busy.Load()) / (float64(cap(s.tokens)) * float64(s.to-s.from))
}

func newCapacityServer(tokens int, service time.Duration) *capacityServer {
	return &capacityServer{tokens: make(chan struct{}, tokens), service: service}
}

func (s *capacityServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	s.calls.Add(1)
	if s.refuse != nil {
		if err := s.refuse(); err != nil {
			return nil, err
		}
	}
	if req.GetMessage() == msgFail {
		return nil, status.Error(codes.InvalidArgument, "bad request")
	}
	if s.tokens == nil {
		return &echov1.EchoResponse{}, nil
	}
	select {
	case s.tokens <- struct{}{}:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	start := time.Now()
	time.Sleep(s.service)
	s.held(start, time.Now())
	<-s.tokens
	return &echov1.EchoResponse{}, nil
}

func (s *capacityServer) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	t := time.NewTimer(s.slow)
	defer t.Stop()
	select {
	case <-t.C:
		return &echov1.LookupResponse{Message: req.GetMessage()}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// served is a gRPC server on a loopback TCP port.
type served struct {
	addr string
	gs   *grpc.Server
	done chan struct{}
}

// serve serves impl on 127.0.0.1 behind the server options given.
func serve(impl echov1.EchoServiceServer, opts ...grpc.ServerOption) (*served, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &served{addr: lis.Addr().String(), gs: grpc.NewServer(opts...), done: make(chan struct{})}
	echov1.RegisterEchoServiceServer(s.gs, impl)
	go func() {
		defer close(s.done)
		_ = s.gs.Serve(lis)
	}()
	return s, nil
}

// dial returns a connection to s with the dial options given.
func (s *served) dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(s.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
}

// client dials s through a Client configured by mc; closing the
// connection is the caller's (cc.Close).
func (s *served) client(mc serviceconfig.MethodConfig) (echov1.EchoServiceClient, *grpc.ClientConn, error) {
	c, err := interceptor.NewClient(interceptor.WithMethodConfig(mc))
	if err != nil {
		return nil, nil, err
	}
	cc, err := s.dial(c.DialOptions()...)
	if err != nil {
		return nil, nil, err
	}
	return echov1.NewEchoServiceClient(cc), cc, nil
}

func (s *served) stop() {
	s.gs.Stop()
	<-s.done
}

// outcome is one call's.
type outcome struct {
	start time.Duration // since the run's start
	took  time.Duration
	code  codes.Code
	class int  // the caller's class, for reports (tenant, honest or hostile)
	ok    bool // succeeded within its deadline
}

// recorder collects outcomes from many goroutines.
type recorder struct {
	mu  sync.Mutex
	out []outcome
}

func (r *recorder) add(o outcome) {
	r.mu.Lock()
	r.out = append(r.out, o)
	r.mu.Unlock()
}

func (r *recorder) all() []outcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.out)
}

// phase is a stretch of open-loop arrivals at rate per second.
type phase struct {
	rate float64
	d    time.Duration
}

// openLoop starts call(i, start) at evenly spaced instants of the phases,
// from t0, whatever became of the calls before, each on its own goroutine,
// and waits for all of them.
func openLoop(t0 time.Time, phases []phase, call func(i int, start time.Duration)) {
	var wg sync.WaitGroup
	next, i := time.Duration(0), 0
	for _, ph := range phases {
		if ph.rate <= 0 {
			next += ph.d
			continue
		}
		gap := time.Duration(float64(time.Second) / ph.rate)
		for end := next + ph.d; next < end; next += gap {
			if d := next - time.Since(t0); d > 0 {
				time.Sleep(d)
			}
			wg.Go(func(i int, start time.Duration) func() {
				return func() { call(i, start) }
			}(i, next))
			i++
		}
	}
	wg.Wait()
}

// sampler calls f every 50ms until stopped, recording its values.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	at   []time.Duration
	v    []int
}

func sample(t0 time.Time, f func() int) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
				s.at = append(s.at, time.Since(t0))
				s.v = append(s.v, f())
			}
		}
	}()
	return s
}

// end stops the sampler; its values are then safe to read.
func (s *sampler) end() {
	close(s.stop)
	<-s.done
}

// median returns the median of the values sampled in [from, to); -1 when
// there is none.
func (s *sampler) median(from, to time.Duration) float64 {
	var v []int
	for i, at := range s.at {
		if at >= from && at < to {
			v = append(v, s.v[i])
		}
	}
	if len(v) == 0 {
		return -1
	}
	slices.Sort(v)
	return float64(v[len(v)/2])
}

// settled returns the time from `from` until every later sample up to `to`
// lies within 10% of want; -1 when the last one does not.
func (s *sampler) settled(from, to time.Duration, want float64) time.Duration {
	last := time.Duration(-1)
	for i := len(s.at) - 1; i >= 0; i-- {
		at := s.at[i]
		if at >= to || at < from {
			continue
		}
		if d := float64(s.v[i]) - want; d > want/10 || -d > want/10 {
			break
		}
		last = at - from
	}
	return last
}

// quantile returns the q-quantile of d; 0 when empty.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// select returns the outcomes of class c (-1: any) started in [from, to).
func pick(out []outcome, c int, from, to time.Duration) []outcome {
	var r []outcome
	for _, o := range out {
		if (c < 0 || o.class == c) && o.start >= from && o.start < to {
			r = append(r, o)
		}
	}
	return r
}

// good returns how many of out succeeded within their deadline, and their
// latencies.
func good(out []outcome) (n int, lat []time.Duration) {
	for _, o := range out {
		if o.ok {
			n++
			lat = append(lat, o.took)
		}
	}
	return n, lat
}

// success is the share of out that succeeded; NaN-free: 0 when empty.
func success(out []outcome) float64 {
	if len(out) == 0 {
		return 0
	}
	n, _ := good(out)
	return float64(n) / float64(len(out))
}
