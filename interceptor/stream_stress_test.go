package interceptor

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The stream stress tests run many callers at once through one client over
// two connections, one of which is closed under load, against a server that
// fails, stalls, sends headers and pushes back at random; callers cancel at
// random and a stream interceptor below the client's panics at random. Each
// round checks a model of every call and ends with nothing held. With
// -stress=d rounds follow one another for d of wall time, per stream kind;
// give go test a -timeout above three times d (or -timeout=0):
//
//	go test -race -run 'TestStreamStress$' -stress=10m -timeout=0 ./interceptor

const (
	streamStressWorkers = 16
	streamStressOps     = 12 // calls per worker and round
	opKey               = "x-test-op"
)

// streamStressOp runs one call of its stream kind as caller w, on ctx, which it
// may cancel at any point (the caller abandoning the call). It returns
// whether the call reached an end that grpc documents as releasing the
// stream without a cancellation; when it did not, it has cancelled ctx.
type streamStressOp func(w *streamStressWorker, stub echov1.EchoServiceClient, ctx context.Context, cancel context.CancelFunc) bool

// TestStreamStress runs streamStressRound for each stream kind: once, or for
// -stress of wall time.
func TestStreamStress(t *testing.T) {
	kinds := []struct {
		name string
		op   streamStressOp
	}{
		{"server-streaming", stressServerStream},
		{"client-streaming", stressClientStream},
		{"bidi", stressBidiStream},
	}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			until := time.Now().Add(*stressFor)
			rounds := 0
			for {
				seed := rand.Uint64()
				synctest.Test(t, func(t *testing.T) { streamStressRound(t, seed, k.op) })
				rounds++
				if t.Failed() {
					return
				}
				if !time.Now().Before(until) {
					break
				}
			}
			t.Logf("%d rounds of %d callers × %d calls", rounds, streamStressWorkers, streamStressOps)
		})
	}
}

// streamStressConfig retries every method, briefly, with an attempt timeout, and
// guards it with a small bulkhead and an easily tripped breaker.
func streamStressConfig() serviceconfig.MethodConfig {
	return serviceconfig.MethodConfig{
		Name: []serviceconfig.Name{{}},
		RetryPolicy: &serviceconfig.RetryPolicy{
			MaxAttempts: 4, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond,
			BackoffMultiplier: 2, PerAttemptRecvTimeout: 30 * time.Millisecond,
		},
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 8, MaxQueue: 16, MaxQueueWait: 5 * time.Millisecond},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 20, OpenDuration: 10 * time.Millisecond, HalfOpenProbes: 2},
	}
}

// streamStressScript decides each attempt from seed and the attempt's number
// alone, so it answers the same when asked again about one attempt: succeed,
// fail retryably or not after k messages, fail after sending headers, push
// back, or stall past the attempt timeout.
func streamStressScript(seed uint64) testserver.Script {
	return func(a testserver.Attempt) testserver.Outcome {
		r := rand.New(rand.NewPCG(seed, uint64(a.N)<<8|uint64(len(a.Method))))
		var o testserver.Outcome
		k := r.IntN(3)
		switch r.IntN(20) {
		case 10, 11, 12:
			o.Err = status.Error(codes.Unavailable, "stress: unavailable")
		case 13:
			o.Err = status.Error(codes.Internal, "stress: internal")
		case 14:
			o.Delay = 50 * time.Millisecond
		case 15:
			o.Header = metadata.Pairs("x-stress", "1")
			o.Err = status.Error(codes.Unavailable, "stress: after headers")
		case 16:
			o.Trailer = metadata.Pairs(pushbackKey, "2")
			o.Err = status.Error(codes.Unavailable, "stress: pushback")
		case 17:
			o.Header = metadata.Pairs("x-stress", "1")
		}
		if o.Err != nil && a.Method == bidiStreamMethod && len(a.Messages) <= k {
			o.Err = nil // the bidi server asks after each message: fail after k
		}
		o.After = k
		return o
	}
}

// streamStressRound runs one round in a synctest bubble.
func streamStressRound(t *testing.T, seed uint64, op streamStressOp) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the round with seed %d failed (scheduling varies: a seed narrows a failure down, it does not replay it)", seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 0))
	srv := &testserver.Server{}
	srv.SetScript(streamStressScript(seed))
	c := newTestClient(t, WithMethodConfig(streamStressConfig()), WithStreamReplayBuffer(200))
	stub1, _ := startWithFaults(t, srv, c)
	stub2, cc2 := startWithFaults(t, srv, c)
	root, cancelRoot := context.WithCancel(t.Context())
	defer cancelRoot()
	var wg sync.WaitGroup
	closeAfter := time.Duration(rng.IntN(40)) * time.Millisecond
	wg.Go(func() {
		time.Sleep(closeAfter) // fake time: the second connection closes under load
		_ = cc2.Close()
	})
	var mu sync.Mutex
	sent := make(map[string][]string) // op id → every message it tried to send
	var later []context.CancelFunc
	ends := &streamStressEnds{n: make(map[string]int)}
	for g := range streamStressWorkers {
		w := &streamStressWorker{t: t, ends: ends, g: g, rng: rand.New(rand.NewPCG(seed, uint64(g)+1))}
		wg.Go(func() {
			for i := range streamStressOps {
				time.Sleep(time.Duration(w.rng.IntN(3)) * time.Millisecond) // fake time: think
				stub := stub1
				if w.rng.IntN(3) == 0 {
					stub = stub2
				}
				w.id = "w" + strconv.Itoa(g) + "o" + strconv.Itoa(i)
				w.sent = nil
				ctx, cancel := w.callContext(root)
				if w.run(op, stub, ctx, cancel) {
					mu.Lock()
					later = append(later, cancel) // cancelled after the check below
					mu.Unlock()
				}
				mu.Lock()
				sent[w.id] = w.sent
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	synctest.Wait()
	// Every call ended as grpc documents, or was cancelled: nothing is held
	// although the calls that ended are not cancelled yet.
	for _, m := range []string{serverStreamMethod, clientStreamMethod, bidiStreamMethod} {
		assertNothingHeld(t, c, m, "after every call ended")
	}
	for _, cancel := range later {
		cancel()
	}
	checkServerSawPrefixes(t, srv, sent)
	if testing.Verbose() && *stressFor == 0 {
		t.Logf("seed %d: the server saw %d attempts; calls ended %v", seed, srv.Count(""), ends.n)
	}
}

// checkServerSawPrefixes fails t unless every attempt the server saw
// received a prefix of what its call sent: replays never reorder, duplicate
// or invent a message.
func checkServerSawPrefixes(t *testing.T, srv *testserver.Server, sent map[string][]string) {
	t.Helper()
	for _, a := range srv.Attempts() {
		if a.Method == serverStreamMethod {
			continue
		}
		ids := a.MD.Get(opKey)
		if len(ids) != 1 {
			t.Errorf("attempt %+v carries no op id", a)
			continue
		}
		want := sent[ids[0]]
		if len(a.Messages) > len(want) || !slices.Equal(a.Messages, want[:len(a.Messages)]) {
			t.Errorf("%s attempt %d of %s received %q, want a prefix of %q", a.Method, a.N, ids[0], a.Messages, want)
		}
	}
}

// streamStressWorker is one caller of a round.
type streamStressWorker struct {
	t    *testing.T
	ends *streamStressEnds
	g    int
	rng  *rand.Rand // used by the worker's goroutine only, never by a bidi receiver
	id   string     // the current call's id, sent as opKey metadata
	sent []string   // the messages the current call tried to send
}

// callContext returns the context of the next call: with its id, now and
// then a fault for the interceptor below, and now and then cancelled after
// a random time.
func (w *streamStressWorker) callContext(root context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(root, opKey, w.id))
	switch w.rng.IntN(8) {
	case 0:
		faults := []string{faultPanicStreamer, faultPanicStreamerRetry, faultPanicSend, faultPanicRecv, faultPanicHeader, faultErrHeader}
		ctx = withFault(ctx, faults[w.rng.IntN(len(faults))])
	case 1, 2:
		ctx = metadata.AppendToOutgoingContext(withFault(ctx, faultPanicRandom), faultSeedKey, strconv.FormatUint(w.rng.Uint64(), 10))
	}
	if w.rng.IntN(6) == 0 {
		time.AfterFunc(time.Duration(w.rng.IntN(60))*time.Millisecond, cancel)
	}
	return ctx, cancel
}

// run runs op, recovering an injected panic as a caller above the client
// would; a call that panicked has ended.
func (w *streamStressWorker) run(op streamStressOp, stub echov1.EchoServiceClient, ctx context.Context, cancel context.CancelFunc) (ended bool) {
	p := recovered(func() { ended = op(w, stub, ctx, cancel) })
	switch p {
	case nil:
		return ended
	case errInjected:
		return true
	}
	panic(p)
}

// streamStressEnds counts how the calls of a round ended, by status code (OK for
// io.EOF), for the verbose log: a round whose calls all fail fast tests
// little.
type streamStressEnds struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *streamStressEnds) add(err error) {
	code := status.Code(err).String()
	if errors.Is(err, io.EOF) {
		code = "OK"
	}
	e.mu.Lock()
	e.n[code]++
	e.mu.Unlock()
}

// abandon reports, now and then, that the caller gives up on its call.
func (w *streamStressWorker) abandon() bool { return w.rng.IntN(25) == 0 }

// msg returns the j-th message of the current call and records it as sent.
func (w *streamStressWorker) msg(j int) string {
	m := w.id + "m" + strconv.Itoa(j)
	w.sent = append(w.sent, m)
	return m
}

// stressServerStream asks for 1 to 4 responses, sometimes reads the headers
// first, and checks that it receives indexes 0, 1, 2... each once.
func stressServerStream(w *streamStressWorker, stub echov1.EchoServiceClient, ctx context.Context, cancel context.CancelFunc) bool {
	count := 1 + w.rng.IntN(4)
	stream, err := stub.ServerStream(ctx, &echov1.ServerStreamRequest{Message: w.id, Count: int32(count)})
	if err != nil {
		w.ends.add(err)
		return true // the interceptor returned an error: nothing was held
	}
	if w.rng.IntN(3) == 0 {
		_, _ = stream.Header()
	}
	for next := 0; ; next++ {
		if w.abandon() {
			cancel()
			return false
		}
		resp, err := stream.Recv()
		if err != nil {
			w.ends.add(err)
		}
		switch {
		case errors.Is(err, io.EOF):
			if next != count {
				w.t.Errorf("%s: io.EOF after %d of %d messages", w.id, next, count)
			}
			return true
		case err != nil:
			return true
		case resp.GetIndex() != int32(next) || resp.GetMessage() != w.id:
			w.t.Errorf("%s: message %d is %q #%d: one seen twice, lost or foreign", w.id, next, resp.GetMessage(), resp.GetIndex())
		}
	}
}

// stressClientStream sends 1 to 5 messages and checks that a response
// answers exactly the sends that returned nil.
func stressClientStream(w *streamStressWorker, stub echov1.EchoServiceClient, ctx context.Context, cancel context.CancelFunc) bool {
	stream, err := stub.ClientStream(ctx)
	if err != nil {
		w.ends.add(err)
		return true
	}
	var ok []string // sends that returned nil
	for j := range 1 + w.rng.IntN(5) {
		if w.abandon() {
			cancel()
			return false
		}
		m := w.msg(j)
		err := stream.Send(&echov1.ClientStreamRequest{Message: m, Payload: make([]byte, w.rng.IntN(80))})
		if errors.Is(err, io.EOF) {
			break // the stream ended: CloseAndRecv has its status
		}
		if err != nil {
			return true // an error from SendMsg ends the stream
		}
		ok = append(ok, m)
	}
	resp, err := stream.CloseAndRecv()
	if err == nil {
		w.ends.add(io.EOF)
	} else {
		w.ends.add(err)
	}
	if err == nil && !slices.Equal(resp.GetMessages(), ok) {
		w.t.Errorf("%s: server answered %q, want %q: a sent message lost or repeated", w.id, resp.GetMessages(), ok)
	}
	return true
}

// bidiResult is what the receiving goroutine of a bidi call saw.
type bidiResult struct {
	got []string
	err error // nil after a panic below
}

// stressBidiStream sends 1 to 5 messages while another goroutine receives,
// and checks that the echoes are a prefix of what it sent, all of it when
// the stream ends well.
func stressBidiStream(w *streamStressWorker, stub echov1.EchoServiceClient, ctx context.Context, cancel context.CancelFunc) bool {
	stream, err := stub.BidiStream(ctx)
	if err != nil {
		w.ends.add(err)
		return true
	}
	done := make(chan bidiResult, 1)
	go func() {
		var res bidiResult
		if p := recovered(func() {
			for {
				resp, err := stream.Recv()
				if err != nil {
					res.err = err
					return
				}
				res.got = append(res.got, resp.GetMessage())
			}
		}); p != nil && p != errInjected {
			panic(p)
		}
		done <- res
	}()
	var ok []string
	sendEnded := false
	for j := range 1 + w.rng.IntN(5) {
		if w.abandon() {
			cancel()
			<-done
			return false
		}
		m := w.msg(j)
		err := stream.Send(&echov1.BidiStreamRequest{Message: m})
		if err != nil {
			sendEnded = !errors.Is(err, io.EOF)
			break
		}
		ok = append(ok, m)
	}
	if !sendEnded {
		_ = stream.CloseSend()
	}
	res := <-done
	w.ends.add(res.err)
	if len(res.got) > len(w.sent) || !slices.Equal(res.got, w.sent[:len(res.got)]) {
		w.t.Errorf("%s: received %q, want a prefix of %q: a message seen twice or out of order", w.id, res.got, w.sent)
	}
	if errors.Is(res.err, io.EOF) && !slices.Equal(res.got, ok) {
		w.t.Errorf("%s: ended well having echoed %q, want %q", w.id, res.got, ok)
	}
	return true
}
