package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// callTimeout is every failure scenario's per-call deadline.
const callTimeout = 2 * time.Second

// failureCallers is the number of closed-loop callers of the failure scenarios.
const failureCallers = 8

// errUnavailable is the server's transient failure.
var errUnavailable = status.Error(codes.Unavailable, "bench: transient failure")

// loadRun is one peer's run of a failure workload.
type loadRun struct {
	load
	attempts int64     // attempts the server saw
	failed   int64     // attempts that failed on the server
	start    time.Time // when the first call started
}

// workload drives a load against a server whose behaviour is set.
type workload func(ctx context.Context, l *load, start time.Time, call func(ctx context.Context, i int) error)

// runPeer starts a fresh server with b, a fresh client of p, and runs w.
func runPeer(ctx context.Context, p peer, pol Policy, n need, b func(start time.Time) Behavior, w workload) (*loadRun, string, error) {
	opts, cannot, err := p.setup(pol, n)
	if err != nil || cannot != "" {
		return nil, cannot, err
	}
	ts, err := StartServer(Bufconn)
	if err != nil {
		return nil, "", err
	}
	defer ts.Stop()
	cc, err := ts.Dial(opts...)
	if err != nil {
		return nil, "", err
	}
	defer cc.Close()
	if err := waitReady(ctx, cc); err != nil {
		return nil, "", err
	}
	c := echov1.NewEchoServiceClient(cc)
	call := func(ctx context.Context, i int) error {
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		_, err := c.Echo(ctx, &echov1.EchoRequest{Message: "c" + strconv.Itoa(i)})
		return err
	}
	r := &loadRun{start: time.Now()}
	ts.SetBehavior(b(r.start))
	w(ctx, &r.load, r.start, call)
	r.attempts, r.failed = ts.Attempts(), ts.Failed()
	return r, "", nil
}

// waitReady waits for cc's connection, so that a phase measured from the
// run's start is not spent connecting (a loaded machine took longer than
// the tiny size's 100 ms phase, and no call started in the healthy one).
func waitReady(ctx context.Context, cc *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("bench: the connection is %s after 10s, not READY", s)
		}
	}
	return nil
}

// failureTable runs w through every retry peer and builds a table whose
// cells cells computes from each run and the bare run (the first peer's).
func failureTable(ctx context.Context, title string, header []string, b func(start time.Time) Behavior, w workload, cells func(r, bare *loadRun) []string) (Table, error) {
	peers := retryPeers()
	t := Table{Title: title, Header: append([]string{"peer"}, header...)}
	var bare *loadRun
	for _, p := range peers {
		r, cannot, err := runPeer(ctx, p, DefaultPolicy, needUnary, b, w)
		if err != nil {
			return Table{}, fmt.Errorf("%s: %w", p.name, err)
		}
		row := []string{p.name}
		if cannot != "" {
			for range header {
				row = append(row, "("+cannot+")")
			}
		} else {
			if bare == nil {
				bare = r
			}
			row = append(row, cells(r, bare)...)
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

func (r *loadRun) attemptsPerCall() float64 {
	if len(r.outcomes) == 0 {
		return 0
	}
	return float64(r.attempts) / float64(len(r.outcomes))
}

func (r *loadRun) success() float64 {
	if len(r.outcomes) == 0 {
		return 0
	}
	return float64(r.successes()) / float64(len(r.outcomes))
}

func closedCalls(callers, n int) workload {
	return func(ctx context.Context, l *load, start time.Time, call func(context.Context, int) error) {
		l.closedLoop(ctx, callers, n, time.Time{}, call)
	}
}

func closedFor(callers int, d time.Duration) workload {
	return func(ctx context.Context, l *load, start time.Time, call func(context.Context, int) error) {
		l.closedLoop(ctx, callers, 0, start.Add(d), call)
	}
}

func openFor(rate float64, d time.Duration) workload {
	return func(ctx context.Context, l *load, start time.Time, call func(context.Context, int) error) {
		l.openLoop(ctx, rate, start.Add(d), call)
	}
}

func constant(b Behavior) func(time.Time) Behavior { return func(time.Time) Behavior { return b } }

// transientCallers is 1: with concurrent callers the attempts of different
// calls interleave, 2 of every 3 attempts fail, and a breaker that opens
// after 5 consecutive failures opens, which is right, but it is then the
// breaker that is measured, not the retry. The concurrent cases are the
// outage and random-failure scenarios.
const transientCallers = 1

// Transient: every call fails twice, then succeeds.
func Transient() Scenario {
	return Scenario{
		Name: "transient failures",
		Workload: fmt.Sprintf("Every logical call's first 2 attempts fail with UNAVAILABLE, the third succeeds. "+
			"One caller, sequential calls (so the breakers see at most 2 consecutive failures), Size.Calls/4 calls, "+
			"%v deadline per call, DefaultPolicy (4 attempts, backoff 10 ms to 100 ms). "+
			"Attempts per call are counted on the server (bare: 1).", callTimeout),
		Run: func(ctx context.Context, sz Size) ([]Table, error) {
			b := constant(func(_, _ string, attempt int) (time.Duration, error) {
				if attempt <= 2 {
					return 0, errUnavailable
				}
				return 0, nil
			})
			t, err := failureTable(ctx, "", []string{"success", "attempts/call"}, b, closedCalls(transientCallers, max(sz.Calls/4, 1)),
				func(r, _ *loadRun) []string { return []string{pct(r.success()), perCall(r.attemptsPerCall())} })
			if err != nil {
				return nil, err
			}
			t.Notes = append([]string{"Retry budgets and A6 throttling let retries reach a share of calls (ours: 20% of calls plus 10 per second); " +
				"a workload in which every call needs 2 retries exceeds that by design, and they stop retrying: the price of bounded amplification in an outage."}, t.Notes...)
			return []Table{t}, nil
		},
	}
}

// Outage: every attempt fails.
func Outage() Scenario {
	return Scenario{
		Name: "full outage",
		Workload: fmt.Sprintf("Every attempt fails with UNAVAILABLE. %d closed-loop callers for Size.Phase, DefaultPolicy. "+
			"attempts/call is the load each call adds to a server that is down (bare: 1); server attempts vs bare compares the "+
			"total load on the server in the same time (closed-loop bare callers hammer it back to back, retrying peers wait in "+
			"backoff, and a caller whose breaker is open fails at once without reaching the server, so its calls are many and cheap).", failureCallers),
		Run: func(ctx context.Context, sz Size) ([]Table, error) {
			b := constant(func(string, string, int) (time.Duration, error) { return 0, errUnavailable })
			t, err := failureTable(ctx, "", []string{"attempts/call", "server attempts vs bare", "success"}, b, closedFor(failureCallers, sz.Phase),
				func(r, bare *loadRun) []string {
					return []string{perCall(r.attemptsPerCall()), ratio(float64(r.attempts) / float64(bare.attempts)), pct(r.success())}
				})
			return []Table{t}, err
		},
	}
}

// OutageRecovery: an outage of one phase, then a healthy phase.
func OutageRecovery() Scenario {
	return Scenario{
		Name: "outage then recovery",
		Workload: "Every attempt fails with UNAVAILABLE for Size.Phase, then every attempt succeeds for Size.Phase. " +
			"DefaultPolicy (breakers open after 5 consecutive failures for 500 ms). " +
			"Closed loop: 16 callers back to back; a caller whose breaker is open fails at once and calls again, so call counts " +
			"and success shares mean little, and the columns are the load on the failing server (its failed attempts) and the " +
			"good work after recovery (successful calls), both against bare. Open loop: calls arrive at Size.Rate per second " +
			"whatever happens to earlier ones; success of all calls and of calls started after the recovery, server attempts per call. " +
			"Time to recover: from the recovery to the end of the last failed call that started after it (set by the breakers' " +
			"open time, not by the machine's speed; \"not within the phase\" when the run's last call still failed).",
		Run: func(ctx context.Context, sz Size) ([]Table, error) {
			b := func(start time.Time) Behavior {
				healthy := start.Add(sz.Phase)
				return func(string, string, int) (time.Duration, error) {
					if time.Now().Before(healthy) {
						return 0, errUnavailable
					}
					return 0, nil
				}
			}
			recovery := func(r *loadRun) string {
				if d, ok := r.recoveryTime(r.start.Add(sz.Phase)); ok {
					return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
				}
				return "not within the phase"
			}
			closedCells := func(r, bare *loadRun) []string {
				ok := func(l *loadRun) float64 {
					healthy := l.start.Add(sz.Phase)
					rate, n := l.successRate(healthy, healthy.Add(sz.Phase))
					return rate * float64(n)
				}
				return []string{ratio(float64(r.failed) / float64(bare.failed)), ratio(ok(r) / ok(bare)), recovery(r)}
			}
			openCells := func(r, _ *loadRun) []string {
				healthy := r.start.Add(sz.Phase)
				after, _ := r.successRate(healthy, healthy.Add(sz.Phase))
				return []string{pct(r.success()), pct(after), perCall(r.attemptsPerCall()), recovery(r)}
			}
			closed, err := failureTable(ctx, "Closed loop (16 callers)",
				[]string{"server attempts in the outage vs bare", "successful calls after recovery vs bare", "time to recover"},
				b, closedFor(16, 2*sz.Phase), closedCells)
			if err != nil {
				return nil, err
			}
			open, err := failureTable(ctx, fmt.Sprintf("Open loop (%.0f calls/s)", sz.Rate),
				[]string{"success", "success after recovery", "attempts/call", "time to recover"},
				b, openFor(sz.Rate, 2*sz.Phase), openCells)
			if err != nil {
				return nil, err
			}
			closed.Notes = nil
			return []Table{closed, open}, nil
		},
	}
}

// randomSeed seeds the scenarios' deterministic per-attempt draws.
const randomSeed = 20261124

// RandomFailures: each attempt fails with probability 20%.
func RandomFailures() Scenario {
	return Scenario{
		Name: "20% random failures",
		Workload: fmt.Sprintf("Each attempt fails with UNAVAILABLE with probability 0.2, drawn deterministically from "+
			"(seed %d, call, attempt), so every peer meets the same failures. %d closed-loop callers, Size.Calls calls, DefaultPolicy. "+
			"attempts/call is the amplification (bare: 1).", randomSeed, failureCallers),
		Run: func(ctx context.Context, sz Size) ([]Table, error) {
			b := constant(func(_, msg string, attempt int) (time.Duration, error) {
				if chance(randomSeed, msg, attempt) < 0.2 {
					return 0, errUnavailable
				}
				return 0, nil
			})
			t, err := failureTable(ctx, "", []string{"success", "attempts/call"}, b, closedCalls(failureCallers, sz.Calls),
				func(r, _ *loadRun) []string { return []string{pct(r.success()), perCall(r.attemptsPerCall())} })
			return []Table{t}, err
		},
	}
}
