package interceptor

// The soak: 64 goroutines mix unary calls, every stream kind, hedging,
// keyed calls (server idempotency on the memory store) and config updates,
// over loopback TCP, against a server that fails, stalls and aborts streams
// at seeded rates. At the end, goroutines, heap and open file descriptors
// are back to their baseline, every guard is released, and no call saw an
// impossible outcome: a keyed handler run twice, a stream message lost or
// delivered twice, a status the faults cannot explain.
//
//	go test -race -run Soak ./interceptor              # about 3 s
//	go test -race -run Soak ./interceptor -long        # 60 s, as CI's long mode
//	go test -race -run Soak ./interceptor -soak=10m    # locally, longer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// soakDuration is how long the soak runs: -soak when set, else 60 s with
// -long, else 3 s.
func soakDuration() time.Duration {
	switch {
	case *soakFor > 0:
		return *soakFor
	case *longMode:
		return time.Minute
	}
	return 3 * time.Second
}

// soakInjector decides the faults of the soak server from one seeded
// source: each decision is a draw under its lock.
type soakInjector struct {
	start time.Time // outages repeat every soakOutageEvery from start

	mu  sync.Mutex
	rng *rand.Rand
}

// Every soakOutageEvery the server fails everything for soakOutageFor: an
// outage long enough to open the breakers, whose probes then close them.
const (
	soakOutageEvery = 500 * time.Millisecond
	soakOutageFor   = 60 * time.Millisecond
)

// soakFault is what one attempt suffers.
type soakFault struct {
	fail  bool          // end with UNAVAILABLE (before any side effect)
	delay time.Duration // wait first, or until the attempt ends
	after int           // streams: fail after this many messages (fail set)
}

// draw returns the fault of one attempt: 15% UNAVAILABLE (all of them
// during an outage), a delay of up to 3 ms on one attempt in four; a
// failing stream fails after 0 to 3 messages.
func (f *soakInjector) draw() soakFault {
	outage := time.Since(f.start)%soakOutageEvery < soakOutageFor
	f.mu.Lock()
	defer f.mu.Unlock()
	var d soakFault
	d.fail = f.rng.Float64() < 0.15 || outage
	if f.rng.IntN(4) == 0 {
		d.delay = time.Duration(f.rng.Int64N(int64(3 * time.Millisecond)))
	}
	d.after = f.rng.IntN(4)
	return d
}

// wait applies the delay of d, or returns the attempt's error.
func (d soakFault) wait(ctx context.Context) error {
	if d.delay == 0 {
		return nil
	}
	t := time.NewTimer(d.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

var errSoakInjected = status.Error(codes.Unavailable, "soak: injected")

// soakServer is the fault-injecting echo service of the soak. Echo is the
// keyed method: it counts its successful executions per idempotency key.
type soakServer struct {
	echov1.UnimplementedEchoServiceServer
	faults *soakInjector

	mu    sync.Mutex
	execs map[string]int // idempotency key → successful executions
}

func (s *soakServer) Echo(ctx context.Context, req *echov1.EchoRequest) (*echov1.EchoResponse, error) {
	d := s.faults.draw()
	if err := d.wait(ctx); err != nil {
		return nil, err
	}
	if d.fail {
		return nil, errSoakInjected
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if k := md.Get(wire.IdempotencyKeyHeader); len(k) == 1 {
		s.mu.Lock()
		s.execs[k[0]]++
		s.mu.Unlock()
	}
	return &echov1.EchoResponse{Message: req.GetMessage()}, nil
}

func (s *soakServer) Lookup(ctx context.Context, req *echov1.LookupRequest) (*echov1.LookupResponse, error) {
	d := s.faults.draw()
	if err := d.wait(ctx); err != nil {
		return nil, err
	}
	if d.fail {
		return nil, errSoakInjected
	}
	return &echov1.LookupResponse{Message: req.GetMessage()}, nil
}

func (s *soakServer) ServerStream(req *echov1.ServerStreamRequest, stream grpc.ServerStreamingServer[echov1.ServerStreamResponse]) error {
	d := s.faults.draw()
	if err := d.wait(stream.Context()); err != nil {
		return err
	}
	for k := range int(req.GetCount()) {
		if d.fail && k == d.after {
			return errSoakInjected
		}
		if err := stream.Send(&echov1.ServerStreamResponse{Message: req.GetMessage(), Index: int32(k)}); err != nil {
			return err
		}
	}
	if d.fail {
		return errSoakInjected
	}
	return nil
}

func (s *soakServer) ClientStream(stream grpc.ClientStreamingServer[echov1.ClientStreamRequest, echov1.ClientStreamResponse]) error {
	d := s.faults.draw()
	var got []string
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		got = append(got, req.GetMessage())
		if d.fail && len(got) > d.after {
			return errSoakInjected
		}
	}
	if err := d.wait(stream.Context()); err != nil {
		return err
	}
	if d.fail {
		return errSoakInjected
	}
	return stream.SendAndClose(&echov1.ClientStreamResponse{Messages: got})
}

func (s *soakServer) BidiStream(stream grpc.BidiStreamingServer[echov1.BidiStreamRequest, echov1.BidiStreamResponse]) error {
	d := s.faults.draw()
	if err := d.wait(stream.Context()); err != nil {
		return err
	}
	for n := 0; ; n++ {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.fail && n == d.after {
			return errSoakInjected
		}
		if err := stream.Send(&echov1.BidiStreamResponse{Message: req.GetMessage()}); err != nil {
			return err
		}
	}
}

// soakConfigs are the two service configs the soak alternates between
// mid-flight: different attempts, bulkhead sizes and breaker thresholds.
func soakConfigs() [2]*serviceconfig.Config {
	const svc = "resilience.echo.v1.EchoService"
	mk := func(attempts, slots int, failures int) *serviceconfig.Config {
		retry := &serviceconfig.RetryPolicy{
			MaxAttempts: attempts, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
			BackoffMultiplier: 2, RetryableStatusCodes: []codes.Code{codes.Unavailable},
		}
		guard := func() (*serviceconfig.CircuitBreaker, *serviceconfig.Bulkhead) {
			return &serviceconfig.CircuitBreaker{ConsecutiveFailures: failures, OpenDuration: 20 * time.Millisecond, HalfOpenProbes: 2},
				&serviceconfig.Bulkhead{MaxConcurrent: slots, MaxQueue: 2 * slots, MaxQueueWait: 20 * time.Millisecond}
		}
		cb1, bh1 := guard()
		cb2, bh2 := guard()
		return &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{
			{Name: []serviceconfig.Name{{Service: svc}}, RetryPolicy: retry, CircuitBreaker: cb1, Bulkhead: bh1},
			{
				Name:           []serviceconfig.Name{{Service: svc, Method: "Lookup"}},
				HedgingPolicy:  &serviceconfig.HedgingPolicy{MaxAttempts: attempts, HedgingDelay: 2 * time.Millisecond, NonFatalStatusCodes: []codes.Code{codes.Unavailable}},
				CircuitBreaker: cb2, Bulkhead: bh2,
			},
		}}
	}
	return [2]*serviceconfig.Config{mk(4, 16, 10), mk(3, 8, 15)}
}

// soakTally counts the soak's calls by kind and outcome, and its
// violations.
type soakTally struct {
	calls    [5]atomic.Int64 // by kind: unary keyed, hedged, server, client, bidi stream
	codes    [17]atomic.Int64
	lost     atomic.Int64 // stream messages missing from a completed stream
	dups     atomic.Int64 // stream messages delivered twice
	updates  atomic.Int64
	rejected atomic.Int64 // calls failed fast by an open breaker
	failures atomic.Int64 // violations reported with t.Error
}

var soakKinds = [5]string{"unary keyed", "hedged", "server stream", "client stream", "bidi stream"}

// soakAllowed are the codes a call may end with: the injected UNAVAILABLE
// once retries are spent or a breaker is open, RESOURCE_EXHAUSTED from a
// full bulkhead, DEADLINE_EXCEEDED and CANCELLED from the caller's own
// deadlines and cancellations.
var soakAllowed = rescodes.Of(codes.OK, codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded, codes.Canceled)

func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: not in -short")
	}
	dur := soakDuration()
	const goroutines = 64

	fds0 := openFDs(t)
	g0 := runtime.NumGoroutine()
	heap0 := heapAfterGC()

	var tally soakTally
	srv := &soakServer{faults: &soakInjector{start: time.Now(), rng: rand.New(rand.NewPCG(1, 2))}, execs: make(map[string]int)}
	func() { // everything the soak builds is unreachable once this returns
		c, stop := startSoak(t, srv)
		defer stop()
		cfgs := soakConfigs()
		if err := c.client.UpdateServiceConfig(cfgs[0]); err != nil {
			t.Fatal(err)
		}
		// The soak runs for dur and until soakMinOK calls have succeeded, so
		// that the checks of what succeeded (replies, duplicates, stream
		// messages) have something to check on a busy machine too
		// (regression: on 2 loaded cores one 3s soak of 909 calls had 0
		// successes and failed as "did not run"; others had 4 to 137). Past
		// a minute more, it ends, and the check below fails.
		start := time.Now()
		running := func() bool {
			d := time.Since(start)
			return d < dur || tally.codes[codes.OK].Load() < soakMinOK && d < dur+time.Minute
		}
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				for i := 0; running(); i++ {
					if g == 0 {
						// One goroutine swaps the config under the others' calls.
						if err := c.client.UpdateServiceConfig(cfgs[i%2]); err != nil {
							t.Errorf("UpdateServiceConfig: %v", err)
						}
						tally.updates.Add(1)
						time.Sleep(5 * time.Millisecond) // pace the updates: they are not the load
						continue
					}
					c.one(t, &tally, rng, "g"+strconv.Itoa(g)+"-"+strconv.Itoa(i))
				}
			})
		}
		wg.Wait()
		if held := heldGuards(c.client); held != "" {
			// Releases off the caller's goroutine may lag; checkNothingHeld
			// waits for them at cleanup, this is only the summary's count.
			t.Logf("guards held right after the load (checked again at cleanup): %s", held)
		}
	}()

	srv.mu.Lock()
	keys, dupExecs := len(srv.execs), 0
	for k, n := range srv.execs {
		if n > 1 {
			dupExecs += n - 1
			t.Errorf("keyed call %s executed %d times", k, n)
		}
	}
	srv.execs = nil
	srv.mu.Unlock()

	// Back to baseline: goroutines (grpc's end asynchronously: poll), heap
	// after GC within 16 MiB, file descriptors.
	var g1 int
	for wait := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if g1 = runtime.NumGoroutine(); g1 <= g0 || time.Now().After(wait) {
			break
		}
	}
	if g1 > g0 {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before the soak, %d after\n%s", g0, g1, buf[:runtime.Stack(buf, true)])
	}
	heap1 := heapAfterGC()
	if heap1 > heap0+16<<20 {
		t.Errorf("heap after GC: %d KiB before the soak, %d KiB after", heap0>>10, heap1>>10)
	}
	var fds1 int
	for wait := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if fds1 = openFDs(t); fds1 <= fds0 || time.Now().After(wait) {
			break
		}
	}
	if fds1 > fds0 {
		t.Errorf("open file descriptors: %d before the soak, %d after", fds0, fds1)
	}

	var calls int64
	perKind := ""
	for k := range tally.calls {
		n := tally.calls[k].Load()
		calls += n
		perKind += fmt.Sprintf(" %s %d,", soakKinds[k], n)
	}
	perCode := ""
	for code := range tally.codes {
		if v := tally.codes[code].Load(); v > 0 {
			perCode += fmt.Sprintf(" %s %d,", codes.Code(code), v)
		}
	}
	t.Logf("soak %v, %d goroutines: calls %d (%s), outcomes (%s; breaker rejections %d), config updates %d, keyed calls executed %d, duplicates executed %d, lost stream messages %d, duplicated stream messages %d; goroutines %d→%d, heap %d→%d KiB, fds %d→%d",
		dur, goroutines, calls, perKind[1:len(perKind)-1], perCode[1:len(perCode)-1], tally.rejected.Load(), tally.updates.Load(), keys, dupExecs,
		tally.lost.Load(), tally.dups.Load(), g0, g1, heap0>>10, heap1>>10, fds0, fds1)
	if calls < goroutines || tally.codes[codes.OK].Load() < soakMinOK {
		t.Errorf("%d calls ran, %d succeeded (want at least %d): the soak did not run", calls, tally.codes[codes.OK].Load(), soakMinOK)
	}
}

// soakMinOK is the number of successful calls a soak runs until, past its
// duration.
const soakMinOK = 32

// soakClient is the soak's client side.
type soakClient struct {
	client *Client
	echo   echov1.EchoServiceClient
}

// startSoak serves srv on a loopback port and connects a Client to it; stop
// closes both and waits for the server to end.
func startSoak(t *testing.T, srv *soakServer) (*soakClient, func()) {
	// WaitForHandlers: stop returns once every handler has, so the tally
	// that follows reads srv.execs alone. A keyed handler runs detached
	// from its caller and may outlive the call and the connection
	// (regression: one still running when the tally set srv.execs to nil
	// panicked with "assignment to entry in nil map", 1 run in 2 of the
	// package on a loaded machine).
	gs := grpc.NewServer(grpc.WaitForHandlers(true), grpc.ChainUnaryInterceptor(memoryIdemServer(t).UnaryServerInterceptor()))
	echov1.RegisterEchoServiceServer(gs, srv)
	addr, stopServer := testserver.ServeLoopback(t, gs)
	c := newTestClient(t, WithIdempotencyKeys("/resilience.echo.v1.EchoService/Echo"))
	cc, err := grpc.NewClient("passthrough:///"+addr, append(c.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond}}),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	return &soakClient{client: c, echo: echov1.NewEchoServiceClient(cc)}, func() {
		_ = cc.Close()
		stopServer()
	}
}

// one makes one call of a random kind, with a deadline of 20 ms to 1 s (a
// few end at it, mid-retry or mid-stream) or, one call in 16, cancelled by
// the caller at a random point, and checks its outcome.
func (c *soakClient) one(t *testing.T, tally *soakTally, rng *rand.Rand, id string) {
	kind := rng.IntN(len(soakKinds))
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(20+rng.IntN(981))*time.Millisecond)
	defer cancel()
	if rng.IntN(16) == 0 {
		stop := time.AfterFunc(time.Duration(rng.IntN(20000))*time.Microsecond, cancel)
		defer stop.Stop()
	}
	n := 1 + rng.IntN(6)
	var err error
	switch kind {
	case 0:
		var r *echov1.EchoResponse
		r, err = c.echo.Echo(ContextWithIdempotencyKey(ctx, id), &echov1.EchoRequest{Message: id})
		if err == nil && r.GetMessage() != id {
			tally.fail(t, "Echo(%s) answered %q", id, r.GetMessage())
		}
	case 1:
		var r *echov1.LookupResponse
		r, err = c.echo.Lookup(ctx, &echov1.LookupRequest{Message: id})
		if err == nil && r.GetMessage() != id {
			tally.fail(t, "Lookup(%s) answered %q", id, r.GetMessage())
		}
	case 2:
		err = c.serverStream(ctx, t, tally, id, n)
	case 3:
		err = c.clientStream(ctx, t, tally, id, n)
	case 4:
		err = c.bidiStream(ctx, t, tally, id, n)
	}
	tally.calls[kind].Add(1)
	code := status.Code(err)
	tally.codes[code].Add(1)
	if !soakAllowed.Has(code) {
		tally.fail(t, "%s call %s ended with %v", soakKinds[kind], id, err)
	}
	if errors.Is(err, ErrCircuitOpen) {
		tally.rejected.Add(1)
		// A caller that meets an open breaker waits a little before its
		// next call, as it would honour the retry hint; without it the
		// soak would count mostly instant rejections.
		time.Sleep(time.Duration(1+rng.IntN(5)) * time.Millisecond)
	}
}

func (tally *soakTally) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	// Report the first violations in full; count the rest.
	if tally.failures.Add(1) <= 10 {
		t.Errorf(format, args...)
	} else {
		t.Fail()
	}
}

// serverStream reads n responses: in order, each once; a completed stream
// has them all.
func (c *soakClient) serverStream(ctx context.Context, t *testing.T, tally *soakTally, id string, n int) error {
	stream, err := c.echo.ServerStream(ctx, &echov1.ServerStreamRequest{Message: id, Count: int32(n)})
	if err != nil {
		return err
	}
	next := int32(0)
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if int(next) != n {
				tally.lost.Add(int64(n) - int64(next))
				tally.fail(t, "server stream %s completed with %d of %d responses", id, next, n)
			}
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case r.GetIndex() < next:
			tally.dups.Add(1)
			tally.fail(t, "server stream %s: response %d again after %d", id, r.GetIndex(), next-1)
		case r.GetIndex() > next:
			tally.lost.Add(int64(r.GetIndex() - next))
			tally.fail(t, "server stream %s: response %d after %d", id, r.GetIndex(), next-1)
		}
		next = r.GetIndex() + 1
	}
}

// clientStream sends n requests; a success must echo them all, in order,
// once: the replay after a failed attempt neither drops nor repeats any.
func (c *soakClient) clientStream(ctx context.Context, t *testing.T, tally *soakTally, id string, n int) error {
	stream, err := c.echo.ClientStream(ctx)
	if err != nil {
		return err
	}
	want := make([]string, n)
	for i := range n {
		want[i] = id + "/" + strconv.Itoa(i)
		if err := stream.Send(&echov1.ClientStreamRequest{Message: want[i]}); err != nil {
			_, err = stream.CloseAndRecv() // the real error
			return err
		}
	}
	r, err := stream.CloseAndRecv()
	if err == nil && !slices.Equal(r.GetMessages(), want) {
		tally.countMismatch(want, r.GetMessages())
		tally.fail(t, "client stream %s: server answered %v, want %v", id, r.GetMessages(), want)
	}
	return err
}

// bidiStream sends n requests, then half-closes, and reads the echoes: a
// prefix of what was sent, each once; all of it when the stream completes.
func (c *soakClient) bidiStream(ctx context.Context, t *testing.T, tally *soakTally, id string, n int) error {
	stream, err := c.echo.BidiStream(ctx)
	if err != nil {
		return err
	}
	want := make([]string, n)
	for i := range n {
		want[i] = id + "/" + strconv.Itoa(i)
		if err := stream.Send(&echov1.BidiStreamRequest{Message: want[i]}); err != nil {
			break // the stream ended; Recv reports how
		}
	}
	_ = stream.CloseSend()
	var got []string
	for {
		r, err := stream.Recv()
		if err != nil {
			if !slices.Equal(got, want[:min(len(got), n)]) || (errors.Is(err, io.EOF) && len(got) != n) {
				tally.countMismatch(want, got)
				tally.fail(t, "bidi stream %s: read %v (then %v), want a prefix of %v", id, got, err, want)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		got = append(got, r.GetMessage())
	}
}

// countMismatch adds to the lost and duplicated counts what got lacks or
// repeats of want.
func (tally *soakTally) countMismatch(want, got []string) {
	seen := make(map[string]int, len(got))
	for _, m := range got {
		seen[m]++
	}
	for _, m := range want {
		switch n := seen[m]; {
		case n == 0:
			tally.lost.Add(1)
		case n > 1:
			tally.dups.Add(int64(n - 1))
		}
	}
}

// heapAfterGC returns the live heap after two collections.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// openFDs counts this process's open file descriptors, or skips t where
// /proc/self/fd does not exist.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("soak needs /proc/self/fd to count file descriptors: %v", err)
	}
	return len(ents)
}
