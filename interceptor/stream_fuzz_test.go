package interceptor

import (
	"context"
	"errors"
	"io"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// FuzzStreamStateMachine drives one stream through the client over real
// grpc on bufconn, in a synctest bubble, with a fuzzed server script and a
// fuzzed sequence of the caller's operations, and checks it against a model.
//
// Real grpc rather than a fake grpc.ClientStream: what the state machine
// must get right is grpc's own behaviour at the edges (headers that commit,
// trailers-only ends, io.EOF from SendMsg once the status has arrived,
// buffered responses behind a cancellation), which a fake would have to
// imitate and could imitate wrongly. synctest makes it affordable and
// repeatable: every operation starts on its own goroutine, and
// synctest.Wait returns once the bubble is idle, so an input means the same
// interleaving each time it runs (a blocked Recv stays pending while later
// Sends go on, as a caller's receiving goroutine would).
//
// script gives attempt n the byte script[(n-1) % len(script)] (empty: echo):
// bits 0-1 pick the outcome (echo, UNAVAILABLE, INTERNAL, UNAVAILABLE),
// bits 2-3 the number k of messages before the failure, bit 4 headers sent
// first, bit 5 a stall past the attempt timeout (for bidi streams, at the
// first message). ops[0] picks the stream kind (server, client or bidi
// streaming); each later byte is an operation: its value mod 6 picks Send
// (payload of 8 × (b >> 5) bytes), Recv, CloseSend, cancel, Header or a
// 10 ms wait. Then the caller closes its side and receives until the end.
//
// The model: no response is seen twice or out of order (the caller's
// responses are a prefix of what it sent, for echoes); every server attempt
// received a prefix of what the caller sent (the replay, then new sends,
// never a duplicate or a gap); a stream that ends well answers every message
// whose Send returned nil; RecvMsg after the end returns the same error;
// and nothing is held once the stream has ended.
func FuzzStreamStateMachine(f *testing.F) {
	seeds := []struct{ script, ops []byte }{
		{nil, []byte{2, 0, 0, 1, 1, 2, 1}},                   // bidi, healthy
		{[]byte{1, 0}, []byte{2, 0, 0, 1, 2, 1, 1}},          // bidi, first attempt fails before answering: replay
		{[]byte{1 | 4, 0}, []byte{2, 0, 1, 0, 1, 0, 2}},      // bidi, fails after one answer: committed
		{[]byte{1 | 16, 0}, []byte{1, 0, 0, 0, 2, 1}},        // client, headers then failure: committed
		{[]byte{1, 1, 0}, []byte{1, 0, 5, 0, 5, 0, 2, 1}},    // client, two failures, waits between sends
		{[]byte{1 | 8}, []byte{1, 0x60, 0x60, 0x60, 2, 1}},   // client, sends past the replay bound
		{[]byte{1, 0}, []byte{0, 4, 1, 1, 1}},                // server, Header drives the retry
		{[]byte{2 | 4}, []byte{0, 1, 1, 1}},                  // server, non-retryable after one message
		{[]byte{32, 0}, []byte{2, 1, 0, 5, 5, 5, 0, 1}},      // bidi, a stall: the attempt timeout retries
		{[]byte{1, 0}, []byte{2, 1, 0, 3, 0, 1}},             // bidi, cancelled with a receive pending
		{[]byte{1, 1, 1, 1}, []byte{2, 0, 1, 0, 1, 4, 1, 1}}, // bidi, every attempt fails
		{[]byte{1 | 4, 0}, []byte{1, 0, 0, 5, 0, 0x40, 2, 1}},
	}
	for _, s := range seeds {
		f.Add(s.script, s.ops)
	}
	f.Fuzz(func(t *testing.T, script, ops []byte) {
		if len(ops) == 0 || len(ops) > 64 || len(script) > 16 {
			return
		}
		synctest.Test(t, func(t *testing.T) { runFuzzStream(t, script, ops) })
	})
}

// fuzzScript turns the fuzzer's script into the server's (see
// FuzzStreamStateMachine).
func fuzzScript(script []byte) testserver.Script {
	return func(a testserver.Attempt) testserver.Outcome {
		if len(script) == 0 {
			return testserver.Outcome{}
		}
		b := script[(a.N-1)%len(script)]
		var o testserver.Outcome
		switch b & 3 {
		case 1, 3:
			o.Err = status.Error(codes.Unavailable, "fuzz: unavailable")
		case 2:
			o.Err = status.Error(codes.Internal, "fuzz: internal")
		}
		o.After = int(b>>2) & 3
		if b&16 != 0 {
			o.Header = metadata.Pairs("x-fuzz", strconv.Itoa(a.N))
		}
		if b&32 != 0 {
			o.Delay = time.Second
		}
		if a.Method == bidiStreamMethod {
			// The bidi server asks after each message: fail after k, stall
			// at the first only.
			if o.Err != nil && len(a.Messages) <= o.After {
				o.Err = nil
			}
			if len(a.Messages) > 1 {
				o.Delay = 0
			}
		}
		return o
	}
}

// fuzzStream is the caller's side of one fuzzed stream.
type fuzzStream struct {
	t      *testing.T
	kind   byte // 0 server, 1 client, 2 bidi streaming
	cs     grpc.ClientStream
	cancel context.CancelFunc

	sent, sentOK []string // messages the caller tried to send; those Send accepted
	got          []string // responses the caller received, as the model's strings
	count        int      // server streaming: responses asked for
	final        error    // RecvMsg's error once the stream has ended
	closed       bool     // CloseSend was called
	sendFailed   bool     // a Send returned an error: no more sends

	sendDone, recvDone, headerDone chan error // pending operations; nil when none
	recvMsg                        any
}

// runFuzzStream runs one input in the bubble: a guarded, retried method, one
// stream, the ops, then the end and the model's checks.
func runFuzzStream(t *testing.T, script, ops []byte) {
	srv := &testserver.Server{}
	srv.SetScript(fuzzScript(script))
	retry := fastPolicy(3)
	retry.PerAttemptRecvTimeout = 200 * time.Millisecond
	c := newTestClient(t, WithMethodConfig(serviceconfig.MethodConfig{
		Name:           []serviceconfig.Name{{}},
		RetryPolicy:    retry,
		Bulkhead:       &serviceconfig.Bulkhead{MaxConcurrent: 1},
		CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 100, OpenDuration: time.Second},
	}), WithStreamReplayBuffer(100))
	stub := echov1.NewEchoServiceClient(testserver.Start(t, srv, c.DialOptions()...))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	fs := &fuzzStream{t: t, kind: ops[0] % 3, cancel: cancel}
	if !fs.open(ctx, stub) {
		return
	}
	for _, b := range ops[1:] {
		fs.do(b)
		synctest.Wait()
		fs.collect()
	}
	fs.finish()
	synctest.Wait()
	method := [...]string{serverStreamMethod, clientStreamMethod, bidiStreamMethod}[fs.kind]
	assertNothingHeld(t, c, method, "after the stream ended, uncancelled")
	fs.check(srv.Attempts())
}

// open starts the stream; it reports false when the interceptor refused it.
func (fs *fuzzStream) open(ctx context.Context, stub echov1.EchoServiceClient) bool {
	var err error
	switch fs.kind {
	case 0:
		fs.count = 3
		fs.cs, err = stub.ServerStream(ctx, &echov1.ServerStreamRequest{Message: "s", Count: int32(fs.count)})
		fs.closed = true
	case 1:
		fs.cs, err = stub.ClientStream(ctx)
	default:
		fs.cs, err = stub.BidiStream(ctx)
	}
	if err != nil {
		fs.t.Logf("the stream was refused: %v", err)
		return false
	}
	return true
}

// do starts operation b.
func (fs *fuzzStream) do(b byte) {
	switch b % 6 {
	case 0:
		fs.send(int(b>>5) * 8)
	case 1:
		fs.recv()
	case 2:
		if fs.sendDone == nil && !fs.closed {
			fs.closed = true
			_ = fs.cs.CloseSend()
		}
	case 3:
		fs.cancel()
	case 4:
		if fs.headerDone == nil {
			fs.headerDone = make(chan error, 1)
			go func() {
				_, err := fs.cs.Header()
				fs.headerDone <- err
			}()
		}
	case 5:
		time.Sleep(10 * time.Millisecond) // fake time
	}
}

// send starts a Send of the next message, unless one is pending or the
// caller may not send any more.
func (fs *fuzzStream) send(payload int) {
	if fs.kind == 0 || fs.closed || fs.sendFailed || fs.sendDone != nil {
		return
	}
	m := "m" + strconv.Itoa(len(fs.sent))
	fs.sent = append(fs.sent, m)
	var req any = &echov1.BidiStreamRequest{Message: m}
	if fs.kind == 1 {
		req = &echov1.ClientStreamRequest{Message: m, Payload: make([]byte, payload)}
	}
	fs.sendDone = make(chan error, 1)
	go func() { fs.sendDone <- fs.cs.SendMsg(req) }()
}

// recv starts a Recv, unless one is pending or the stream has ended.
func (fs *fuzzStream) recv() {
	if fs.recvDone != nil || fs.final != nil {
		return
	}
	switch fs.kind {
	case 0:
		fs.recvMsg = new(echov1.ServerStreamResponse)
	case 1:
		fs.recvMsg = new(echov1.ClientStreamResponse)
	default:
		fs.recvMsg = new(echov1.BidiStreamResponse)
	}
	fs.recvDone = make(chan error, 1)
	m := fs.recvMsg
	go func() { fs.recvDone <- fs.cs.RecvMsg(m) }()
}

// collect takes the results of the operations that have completed.
func (fs *fuzzStream) collect() {
	if fs.sendDone != nil {
		select {
		case err := <-fs.sendDone:
			fs.sendDone = nil
			if err == nil {
				fs.sentOK = append(fs.sentOK, fs.sent[len(fs.sent)-1])
			} else {
				fs.sendFailed = true
			}
		default:
		}
	}
	if fs.recvDone != nil {
		select {
		case err := <-fs.recvDone:
			fs.recvDone = nil
			fs.received(err)
		default:
		}
	}
	if fs.headerDone != nil {
		select {
		case <-fs.headerDone:
			fs.headerDone = nil
		default:
		}
	}
}

// received records what a RecvMsg returned.
func (fs *fuzzStream) received(err error) {
	if err != nil {
		fs.final = err
		return
	}
	switch m := fs.recvMsg.(type) {
	case *echov1.ServerStreamResponse:
		fs.got = append(fs.got, "m"+strconv.Itoa(int(m.GetIndex())))
	case *echov1.ClientStreamResponse:
		fs.got = append(fs.got, m.GetMessages()...)
		fs.final = io.EOF // the one response; the model treats it as the end
	case *echov1.BidiStreamResponse:
		fs.got = append(fs.got, m.GetMessage())
	}
}

// finish lets the pending operations complete, closes the sending side and
// receives until the end, moving fake time on while the stream waits (for
// backoff, a stalled server); a stream still stuck after that is a failure.
func (fs *fuzzStream) finish() {
	for step := 0; ; step++ {
		synctest.Wait()
		fs.collect()
		if fs.sendDone == nil && !fs.closed {
			fs.closed = true
			_ = fs.cs.CloseSend()
		}
		if fs.final == nil && fs.recvDone == nil {
			fs.recv()
			continue
		}
		if fs.final != nil && fs.sendDone == nil && fs.headerDone == nil {
			break
		}
		if step == 1000 {
			fs.t.Fatalf("the stream did not end in %d steps of 10 ms: sent %q, got %q", step, fs.sent, fs.got)
		}
		time.Sleep(10 * time.Millisecond) // fake time
	}
	if fs.kind == 1 && fs.final == io.EOF {
		return // the response ended a client stream; grpc reads no more
	}
	var again error
	if p := recovered(func() { again = fs.cs.RecvMsg(new(echov1.BidiStreamResponse)) }); p != nil {
		fs.t.Fatalf("RecvMsg after the end panicked: %v", p)
	}
	if again != fs.final && (errors.Is(fs.final, io.EOF) || status.Convert(again).Proto().String() != status.Convert(fs.final).Proto().String()) {
		fs.t.Errorf("RecvMsg after the end = %v, want %v again", again, fs.final)
	}
}

// check holds the stream and what the server saw against the model.
func (fs *fuzzStream) check(attempts []testserver.Attempt) {
	t := fs.t
	want := fs.sent
	if fs.kind == 0 {
		want = []string{"m0", "m1", "m2"}
	}
	if len(fs.got) > len(want) || !slices.Equal(fs.got, want[:len(fs.got)]) {
		t.Errorf("the caller received %q, want a prefix of %q: a response seen twice, lost or out of order", fs.got, want)
	}
	if errors.Is(fs.final, io.EOF) && fs.kind != 0 && !slices.Equal(fs.got, fs.sentOK) {
		t.Errorf("the stream ended well answering %q, want every accepted send %q", fs.got, fs.sentOK)
	}
	if errors.Is(fs.final, io.EOF) && fs.kind == 0 && len(fs.got) != fs.count {
		t.Errorf("the stream ended well after %q, want %d responses", fs.got, fs.count)
	}
	if fs.kind == 0 {
		return
	}
	for _, a := range attempts {
		if len(a.Messages) > len(fs.sent) || !slices.Equal(a.Messages, fs.sent[:len(a.Messages)]) {
			t.Errorf("server attempt %d received %q, want a prefix of %q: the replay lost, repeated or reordered a message", a.N, a.Messages, fs.sent)
		}
	}
}
