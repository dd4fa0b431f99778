package interceptor

import (
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/endpoint"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// The adversarial review of issue 30's endpoint policy (round 2): each
// test pins a defect found by breaking the policy over real gRPC.

// TestStreamPerAttemptTimeoutOfASlowSenderEjectsNothing: a client or bidi
// stream whose caller takes longer than the per-attempt timeout to send
// its request is cut by the stream's timer, but the endpoint was waiting
// for the caller, not failing: a caller's pace must not eject healthy
// backends. Before: every such stream counted a failure against its
// endpoint (4 of 8 outcomes failed on each of 3 healthy backends), and a
// server stream read late (below) ejected one and had two more refused by
// maxEjectionPercent alone.
func TestStreamPerAttemptTimeoutOfASlowSenderEjectsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := fastPolicy(2)
		p.PerAttemptRecvTimeout = 50 * time.Millisecond
		c := newTestClient(t, WithRetryPolicy(p), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveFailures": 2, "baseEjectionTime": "600s"}`))...)
		rg.waitReady(3)
		for range 6 {
			st, err := rg.echo().ClientStream(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			_ = st.Send(&echov1.ClientStreamRequest{Message: "a"})
			time.Sleep(100 * time.Millisecond) // the caller's own pace
			_ = st.Send(&echov1.ClientStreamRequest{Message: "b"})
			_, _ = st.CloseAndRecv()
		}
		for range 6 {
			st, err := rg.echo().BidiStream(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the caller thinks before its first message
			_ = st.Send(&echov1.BidiStreamRequest{Message: "a"})
			_ = st.CloseSend()
			for {
				if _, err := st.Recv(); err != nil {
					break
				}
			}
		}
		if s := rg.snapshot(); failuresCounted(s) != 0 || s.Ejections != 0 || s.Overflow != 0 {
			t.Fatalf("a slow sender's streams ejected healthy backends:\n%s", s)
		}
	})
}

// TestStreamPerAttemptTimeoutOfASlowReaderEjectsNothing: a server stream
// whose backend answered at once, but whose caller reads its first message
// after the per-attempt timeout, is cut by the stream's timer (the stream
// commits on the caller's first read); the endpoint answered in time.
func TestStreamPerAttemptTimeoutOfASlowReaderEjectsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := fastPolicy(2)
		p.PerAttemptRecvTimeout = 50 * time.Millisecond
		c := newTestClient(t, WithRetryPolicy(p), WithRetryBudget(nil))
		rg := newRig(t, 3, append(c.DialOptions(), lbDial(`{"consecutiveFailures": 2, "baseEjectionTime": "600s"}`))...)
		rg.waitReady(3)
		for range 12 {
			st, err := rg.echo().ServerStream(t.Context(), &echov1.ServerStreamRequest{Message: "x", Count: 1})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the caller reads late
			_, _ = st.Recv()
		}
		if s := rg.snapshot(); failuresCounted(s) != 0 || s.Ejections != 0 || s.Overflow != 0 {
			t.Fatalf("a slow reader's streams ejected healthy backends:\n%s", s)
		}
	})
}

var _ = codes.OK

// failuresCounted returns the failures in the endpoints' windows.
func failuresCounted(s endpoint.Snapshot) int {
	n := 0
	for _, e := range s.Endpoints {
		n += e.Failures
	}
	return n
}
