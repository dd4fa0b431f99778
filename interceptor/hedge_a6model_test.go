package interceptor_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The hedging half of issue 15's differential test: grpc-go has no hedging
// to compare with, so hedged calls are checked against a model of the
// gRFC A6 text, on fake time (testing/synctest), through the public API
// only. Delays are counts of hedgingDelay, never measured.

var a6Scenarios = flag.Int("hedge.scenarios", 200, "number of hedging scenarios checked against the A6 model")

// a6Unit is the hedgingDelay of the scenarios. Copies take an odd number
// of tenths of it plus a per-copy hundredth, so no answer arrives at the
// instant a copy is sent, and no two answers arrive together.
const a6Unit = 100 * time.Millisecond

// a6Copy is what the server does with one copy: answer code after took.
type a6Copy struct {
	code codes.Code
	took time.Duration
}

// a6Scenario is one hedged call.
type a6Scenario struct {
	seed        uint64
	maxAttempts int
	nonFatal    rescodes.Set
	copies      []a6Copy // the server's script, by arrival order
}

// a6Result is what a hedged call did.
type a6Result struct {
	sent int        // copies the server saw
	code codes.Code // the call's
}

// model runs the A6 text on s: the first copy at once; another after each
// hedgingDelay without an answer, and at once after a non-fatal failure
// ("the next hedged request in line is sent immediately, shortcutting its
// hedging delay"), up to MaxAttempts copies; the first OK wins; a fatal
// code ends the call; when every copy failed non-fatally, the last
// failure's code. ok is false when two events coincide, where the text does
// not say which comes first.
//
// The text can be read two ways after a shortcut: the next copy is due
// hedgingDelay after the copy sent early (afterShortcut: "if neither RPC
// has received a response after hedgingDelay has elapsed again"), or at
// its place in the original schedule (inLine). extraCopy is neither: the
// schedule keeps sending a copy every hedgingDelay from the first, and a
// non-fatal failure sends one more besides.
func (s *a6Scenario) model(sched schedule) (r a6Result, ok bool) {
	type running struct {
		end  time.Duration
		code codes.Code
	}
	var (
		now    time.Duration
		nextAt time.Duration // when the next copy is due
		ticks  int           // extraCopy: the schedule's sends so far
		out    []running
		last   codes.Code
	)
	send := func() {
		c := s.copies[r.sent]
		r.sent++
		out = append(out, running{end: now + c.took, code: c.code})
		switch sched {
		case afterShortcut:
			nextAt = now + a6Unit
		case inLine:
			nextAt = time.Duration(r.sent) * a6Unit
		case extraCopy:
			ticks++
			nextAt = time.Duration(ticks) * a6Unit
		}
	}
	send()
	for {
		// The next event: a copy's answer, or the next copy's send.
		first := -1
		for i, o := range out {
			if first < 0 || o.end < out[first].end {
				first = i
			}
		}
		canSend := r.sent < s.maxAttempts
		if first < 0 && !canSend {
			return a6Result{sent: r.sent, code: last}, true
		}
		if canSend && (first < 0 || nextAt < out[first].end) {
			now = nextAt
			send()
			continue
		}
		if canSend && nextAt == out[first].end {
			return r, false
		}
		for i, o := range out {
			if i != first && o.end == out[first].end {
				return r, false
			}
		}
		o := out[first]
		now = o.end
		out = append(out[:first], out[first+1:]...)
		switch {
		case o.code == codes.OK:
			return a6Result{sent: r.sent, code: codes.OK}, true
		case !s.nonFatal.Has(o.code):
			return a6Result{sent: r.sent, code: o.code}, true
		}
		last = o.code
		if r.sent < s.maxAttempts {
			if sched == extraCopy {
				ticks-- // a copy besides the schedule's
			}
			send()
		}
	}
}

// schedule is a reading of A6's schedule of copies after a shortcut.
type schedule int

const (
	afterShortcut schedule = iota // the next copy hedgingDelay after the early one
	inLine                        // the next copy at its place in the schedule
	extraCopy                     // the schedule unchanged, the early copy besides it
)

// newA6Scenario returns the scenario of seed.
func newA6Scenario(seed uint64) *a6Scenario {
	r := rand.New(rand.NewPCG(seed, 15))
	s := &a6Scenario{seed: seed, maxAttempts: 2 + r.IntN(4)}
	for _, c := range []codes.Code{codes.Unavailable, codes.Aborted, codes.Internal} {
		if r.IntN(2) == 0 {
			s.nonFatal = s.nonFatal.With(c)
		}
	}
	pick := []codes.Code{codes.OK, codes.OK, codes.Unavailable, codes.Aborted, codes.Internal, codes.InvalidArgument}
	for i := range s.maxAttempts {
		tenths := 1 + 2*r.IntN(20) // 0.1 to 3.9 delays
		took := time.Duration(tenths)*a6Unit/10 + time.Duration(i+1)*a6Unit/1000
		s.copies = append(s.copies, a6Copy{code: pick[r.IntN(len(pick))], took: took})
	}
	return s
}

// run makes the hedged call of s through a Client on fake time.
func (s *a6Scenario) run(t *testing.T) a6Result {
	var got a6Result
	synctest.Test(t, func(t *testing.T) {
		srv := &testserver.Server{}
		srv.SetScript(func(a testserver.Attempt) testserver.Outcome {
			c := s.copies[a.N-1]
			o := testserver.Outcome{Delay: c.took}
			if c.code != codes.OK {
				o.Err = status.Error(c.code, "scripted")
			}
			return o
		})
		c, err := interceptor.NewClient(interceptor.WithRetryBudget(nil), interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoService"}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{
				MaxAttempts: s.maxAttempts, HedgingDelay: a6Unit, NonFatalStatusCodes: s.nonFatal.Codes(),
			},
		}))
		if err != nil {
			t.Fatal(err)
		}
		cc := testserver.Start(t, srv, c.DialOptions()...)
		_, err = echov1.NewEchoServiceClient(cc).Echo(t.Context(), &echov1.EchoRequest{Message: "hedge"})
		// Copies that lost run on until cancelled; let them end.
		synctest.Wait()
		got = a6Result{sent: srv.Count("Echo"), code: status.Code(err)}
	})
	return got
}

// TestHedgingFollowsTheA6Model checks hedged calls against the model of
// the A6 text: how many copies reach the server, and the call's code.
// After a non-fatal failure sends the next copy early, either reading of
// the schedule passes: the copy after it hedgingDelay later
// (afterShortcut, the client's), or at its place in the original schedule
// (inLine). A copy besides the schedule (extraCopy), which the client sent
// before the hedging rewrite, has more copies out than A6 allows and fails.
func TestHedgingFollowsTheA6Model(t *testing.T) {
	checked := 0
	for i := range *a6Scenarios {
		s := newA6Scenario(uint64(i + 1))
		want, ok1 := s.model(afterShortcut)
		alt, ok2 := s.model(inLine)
		if !ok1 || !ok2 {
			continue
		}
		checked++
		if got := s.run(t); got != want && got != alt {
			extra, _ := s.model(extraCopy)
			t.Errorf("seed %d: maxAttempts %d, nonFatal %v, copies%s: got %d copies sent, %v; the A6 model says %d, %v (a copy besides the schedule: %v)",
				s.seed, s.maxAttempts, s.nonFatal, s.describe(), got.sent, got.code, want.sent, want.code, got == extra)
		}
	}
	t.Logf("%d hedging scenarios checked against the A6 model", checked)
}

// describe lists the scripted copies as code@delays.
func (s *a6Scenario) describe() string {
	var out string
	for _, c := range s.copies {
		out += fmt.Sprintf(" %v@%.2f", c.code, float64(c.took)/float64(a6Unit))
	}
	return out
}
