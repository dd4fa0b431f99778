package overload

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/interceptor/wire"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// Hostile callers, beside honest CRITICAL ones.
const (
	FastFailures   = "fast failures"
	ShortDeadline  = "short deadlines, never cancelled"
	SheddableFlood = "SHEDDABLE flood"
)

// HostileKinds lists the hostile callers in report order.
var HostileKinds = []string{FastFailures, ShortDeadline, SheddableFlood}

// hostileLoad is what a kind of hostile caller sends, in multiples of the
// capacity, beside honest callers at honest×.
func hostileLoad(kind string) (honest, hostile float64) {
	switch kind {
	case FastFailures:
		return 0.7, 1 // a failure takes no token: the server is at 70%
	case ShortDeadline:
		return 0.6, 0.3 // their calls take tokens: 90% in all
	default:
		return 0.7, 3 // 3.7× in all: an overload of SHEDDABLE calls
	}
}

// HostileResult is one hostile run: what the honest callers saw, and the
// limit against the honest baselines.
type HostileResult struct {
	Kind string
	// HonestSuccess is the share of the honest calls that succeeded within
	// their deadline, once the hostile caller started.
	HonestSuccess float64
	// Limit is the median limit while the hostile caller runs; Alone the
	// same with the honest callers alone; AllHonest the same with the
	// hostile caller's arrivals sent as honest CRITICAL calls instead (the
	// same load on the server, by honest callers; not for fast failures,
	// whose honest counterpart would be load they do not make).
	Limit, Alone, AllHonest float64
	// HostileCalls counts the hostile caller's calls.
	HostileCalls int
	// Failed counts the honest calls that failed, by code (a call that
	// came back after its deadline with OK counts as DEADLINE_EXCEEDED).
	Failed map[codes.Code]int
}

// Drift is Limit/Alone − 1.
func (r HostileResult) Drift() float64 { return r.Limit/r.Alone - 1 }

// hostileFor is the length of a hostile run, its first second honest only.
const hostileFor = 5 * time.Second

// RunHostile runs kind against grpc-resilience's limit (defaults) on the
// server of cfg: honest CRITICAL callers for 5s, the hostile caller from
// 1s on; then the honest callers alone, and (but for fast failures) the
// same arrivals all honest.
func RunHostile(cfg Config, kind string) (HostileResult, error) {
	cfg = cfg.withDefaults()
	honest, hostile := hostileLoad(kind)
	r := HostileResult{Kind: kind}
	var err error
	if r.HonestSuccess, r.Limit, r.HostileCalls, r.Failed, err = runHostile(cfg, kind, honest, hostile); err != nil {
		return r, err
	}
	if _, r.Alone, _, _, err = runHostile(cfg, kind, honest, 0); err != nil {
		return r, err
	}
	if kind != FastFailures {
		if _, r.AllHonest, _, _, err = runHostile(cfg, "", honest, hostile); err != nil {
			return r, err
		}
	}
	return r, nil
}

// runHostile runs honest callers at honest× the capacity and hostile
// callers of kind ("" for honest ones) at hostile×, and returns the honest
// callers' success and the median limit after 2s.
func runHostile(cfg Config, kind string, honest, hostile float64) (ok, limit float64, hostileCalls int, failed map[codes.Code]int, err error) {
	s, err := server.New(server.WithLimits(ourLimits()))
	if err != nil {
		return 0, 0, 0, nil, err
	}
	srv, err := serve(newCapacityServer(cfg.Tokens, cfg.Service), grpc.ChainUnaryInterceptor(s.UnaryServerInterceptor()))
	if err != nil {
		return 0, 0, 0, nil, err
	}
	defer srv.stop()
	cc, err := srv.dial()
	if err != nil {
		return 0, 0, 0, nil, err
	}
	defer cc.Close()
	client := echov1.NewEchoServiceClient(cc)
	raw := newRawClient(srv.addr)
	defer raw.close()
	capacity := cfg.capacity()
	var rec recorder
	t0 := time.Now()
	lim := sample(t0, func() int { return s.LimitStatuses()[0].Limit })
	done := make(chan int)
	go func() {
		n := 0
		if hostile > 0 {
			openLoop(t0, []phase{{0, time.Second}, {hostile * capacity, hostileFor - time.Second}}, func(int, time.Duration) {
				hostileCall(cfg, kind, client, raw)
			})
			n = int(hostile * capacity * (hostileFor - time.Second).Seconds())
		}
		done <- n
	}()
	openLoop(t0, []phase{{honest * capacity, hostileFor}}, func(_ int, start time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
		defer cancel()
		began := time.Now()
		_, err := client.Echo(ctx, &echov1.EchoRequest{})
		took := time.Since(began)
		rec.add(outcome{start: start, took: took, code: status.Code(err), ok: err == nil && took <= cfg.Deadline})
	})
	hostileCalls = <-done
	lim.end()
	measured := pick(rec.all(), -1, time.Second, hostileFor)
	failed = map[codes.Code]int{}
	for _, o := range measured {
		switch {
		case o.ok:
		case o.code == codes.OK:
			failed[codes.DeadlineExceeded]++
		default:
			failed[o.code]++
		}
	}
	return success(measured), lim.median(2*time.Second, hostileFor), hostileCalls, failed, nil
}

// hostileCall makes one call of a hostile caller of kind ("": an honest
// one).
func hostileCall(cfg Config, kind string, client echov1.EchoServiceClient, raw *rawClient) {
	switch kind {
	case ShortDeadline:
		// 1.2 service times: past the door, shorter than the latency once
		// the call waits for a token; the server's timer ends it.
		_, _ = raw.echo("", cfg.Service*6/5)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Deadline)
	defer cancel()
	msg := ""
	switch kind {
	case FastFailures:
		msg = msgFail
	case SheddableFlood:
		ctx = wire.ContextWithCriticality(ctx, wire.Sheddable)
	}
	_, _ = client.Echo(ctx, &echov1.EchoRequest{Message: msg})
}

// Row renders r for a report.
func (r HostileResult) String() string {
	return fmt.Sprintf("%s: honest success %.2f%% (failed: %v), limit %.0f (alone %.0f, drift %+.0f%%; all honest %.0f)",
		r.Kind, 100*r.HonestSuccess, r.Failed, r.Limit, r.Alone, 100*r.Drift(), r.AllHonest)
}
