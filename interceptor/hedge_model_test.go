package interceptor

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// A model check of hedging against the text of gRFC A6 (A6-client-retries.md,
// "Hedging Policy", "Pushback" and "When Retries are Valid"):
//
//	(a) "the original RPC is sent immediately ... After hedgingDelay has
//	    elapsed without a successful response, the second RPC will be
//	    issued. If neither RPC has received a response after hedgingDelay
//	    has elapsed again, a third RPC is sent, and so on, up to
//	    maxAttempts."
//	(b) "When a successful response is received (in response to any of the
//	    hedged requests), all outstanding hedged requests are canceled and
//	    the response is returned to the client application layer."
//	(c) "If an error response with a non-fatal status code ... is received
//	    from a hedged request, then the next hedged request in line is sent
//	    immediately, shortcutting its hedging delay."
//	(d) "If any other status code is received, all outstanding RPCs are
//	    canceled and the error is returned to the client application layer."
//	(e) "If all instances of a hedged RPC fail, there are no additional
//	    retry attempts." The call returns the last failure (this library's
//	    rule: a stopped call keeps the last attempt's status).
//	(f) Pushback "Retry in n ms": "Send next hedged request in n ms.
//	    Subsequent hedged requests will resume at n + hedgingDelay";
//	    pushback "Don't retry": "Don't send any more hedged requests."
//	(g) An RPC is committed when "The client receives Response-Headers";
//	    then "All other currently in-flight attempts will be immediately
//	    cancelled, and no subsequent attempts will be started."
//
// Times are in units of the hedging delay D; copy n is sent at (n-1)·D
// unless (c) or (f) moves it. Answers never tie with a copy's sending.

// modelCopy is the server's script for one copy: it answers after
// D·after, with code (OK: success), optionally sending headers first
// (a failure then commits) or a pushback trailer.
type modelCopy struct {
	after    float64
	code     codes.Code
	headers  bool
	pushback string // grpc-retry-pushback-ms, "" for none
}

func TestHedgingModelA6(t *testing.T) {
	const d = 10 * time.Millisecond
	never := modelCopy{after: 100} // longer than any case
	tests := []struct {
		name        string
		maxAttempts int
		copies      []modelCopy // by copy number; later copies never answer
		wantSent    int         // copies the server saw
		wantDecider int         // the copy whose outcome the call returns
		wantCode    codes.Code
		wantAt      float64 // when the call returns, in D
		wantReason  StopReason
	}{
		{"(a) the first answers within the delay", 3, []modelCopy{{after: 0.5}}, 1, 1, codes.OK, 0.5, StopNone},
		{"(a,b) a slow first: the second wins", 3, []modelCopy{{after: 2.5}, {after: 0.5}}, 2, 2, codes.OK, 1.5, StopNone},
		{"(a,b) all slow: maxAttempts copies, the first answer wins", 3,
			[]modelCopy{{after: 5.5}, {after: 3.5}, {after: 0.5}}, 3, 3, codes.OK, 2.5, StopNone},
		{"(a) no copy past maxAttempts", 2, []modelCopy{{after: 5.5}, {after: 4.6}}, 2, 1, codes.OK, 5.5, StopNone},
		{"(c) a non-fatal failure sends the next at once", 3,
			[]modelCopy{{after: 0.5, code: codes.Unavailable}, {after: 0.3}}, 2, 2, codes.OK, 0.8, StopNone},
		{"(b,c) an earlier copy succeeds after a later one failed", 3,
			[]modelCopy{{after: 2.5}, {after: 0.5, code: codes.Unavailable}, never}, 3, 1, codes.OK, 2.5, StopNone},
		{"(d) a fatal code ends the call", 3,
			[]modelCopy{{after: 1.5, code: codes.InvalidArgument}, never}, 2, 1, codes.InvalidArgument, 1.5, StopNonRetryable},
		{"(d) a later copy's fatal code ends the call", 3,
			[]modelCopy{never, {after: 0.5, code: codes.Internal}}, 2, 2, codes.Internal, 1.5, StopNonRetryable},
		{"(e) every copy fails: the last error", 3, []modelCopy{
			{after: 0.2, code: codes.Unavailable}, {after: 0.2, code: codes.Unavailable}, {after: 0.2, code: codes.Unavailable},
		}, 3, 3, codes.Unavailable, 0.6, StopExhausted},
		{"(f) a pushback delays the next copy", 3,
			[]modelCopy{{after: 0.5, code: codes.Unavailable, pushback: "25"}, {after: 0.5}}, 2, 2, codes.OK, 3.5, StopNone},
		{"(f) after a pushback, hedging resumes at n + hedgingDelay", 3, []modelCopy{
			{after: 0.5, code: codes.Unavailable, pushback: "25"}, never, {after: 0.5},
		}, 3, 3, codes.OK, 4.5, StopNone},
		{"(f) a pushback that says stop sends no more copies", 3,
			[]modelCopy{{after: 0.5, code: codes.Unavailable, pushback: "-1"}, never}, 1, 1, codes.Unavailable, 0.5, StopPushback},
		{"(f) stop while another copy runs: its answer is the last", 3, []modelCopy{
			{after: 3.5, code: codes.Unavailable}, {after: 0.5, code: codes.Unavailable, pushback: "-1"},
		}, 2, 1, codes.Unavailable, 3.5, StopPushback},
		{"(g) headers then a non-fatal failure: committed, final", 3,
			[]modelCopy{{after: 1.5, code: codes.Unavailable, headers: true}, never}, 2, 1, codes.Unavailable, 1.5, StopCommitted},
		{"(g) a trailers-only failure does not commit", 3,
			[]modelCopy{{after: 0.5, code: codes.Unavailable}, {after: 0.3}}, 2, 2, codes.OK, 0.8, StopNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testserver.Server{}
				srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
					mc := never
					if a.N <= len(tt.copies) {
						mc = tt.copies[a.N-1]
					}
					return modelOutcome(a.N, mc, d)
				})
				stub, _ := newEcho(t, srv, hedging(tt.maxAttempts, d, codes.Unavailable))
				start := time.Now()
				var header, trailer metadata.MD
				_, err := stub.Echo(t.Context(), &echov1.EchoRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
				elapsed := time.Since(start)
				decider := strings.Join(trailer.Get("copy"), ",")
				var re *RetryError
				reason := StopNone
				if errors.As(err, &re) {
					reason = re.Reason
				}
				want := time.Duration(tt.wantAt * float64(d))
				if got := status.Code(err); got != tt.wantCode || decider != strconv.Itoa(tt.wantDecider) || reason != tt.wantReason {
					t.Errorf("Echo() = %v from copy %q, stopped: %v; want %v from copy %d, stopped: %v", got, decider, reason, tt.wantCode, tt.wantDecider, tt.wantReason)
				}
				if elapsed != want || srv.Count("Echo") != tt.wantSent {
					t.Errorf("call took %v over %d copies, want %v and %d", elapsed, srv.Count("Echo"), want, tt.wantSent)
				}
			})
		})
	}
}

// modelOutcome is copy n's outcome under mc: its number as trailer "copy"
// (read back from the caller's grpc.Trailer: the copy the call returns).
func modelOutcome(n int, mc modelCopy, d time.Duration) testserver.Outcome {
	o := testserver.Outcome{Delay: time.Duration(mc.after * float64(d)), Trailer: metadata.Pairs("copy", strconv.Itoa(n))}
	if mc.code != codes.OK {
		o.Err = status.Error(mc.code, "copy "+strconv.Itoa(n))
	}
	if mc.headers {
		o.Header = metadata.Pairs("committed", "yes")
	}
	if mc.pushback != "" {
		o.Trailer.Set(pushbackKey, mc.pushback)
	}
	return o
}
