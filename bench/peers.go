package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"github.com/sony/gobreaker/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Policy is the one resilience policy every peer is configured with, as
// closely as each can express it. Durations are exact; see each peer's note
// for what it rounds or cannot express.
type Policy struct {
	// MaxAttempts counts every attempt, the first call included.
	MaxAttempts int
	// InitialBackoff and MaxBackoff bound the exponential backoff
	// (multiplier 2, ±20% jitter where the peer has jitter).
	InitialBackoff, MaxBackoff time.Duration
	// BreakerFailures consecutive failures open a breaker for BreakerOpen.
	BreakerFailures int
	BreakerOpen     time.Duration
	// BulkheadMax limits concurrent calls per method (ours) or per
	// interceptor (failsafe-go); BulkheadWait bounds the wait for a slot.
	BulkheadMax  int
	BulkheadWait time.Duration
	// SlowBulkhead, when positive, gives ours a bulkhead of this size on
	// the slow method (Lookup) only: the per-method isolation scenario.
	SlowBulkhead int
	// HedgeDelay is the fixed hedging delay of the hedging peers (two
	// attempts at most).
	HedgeDelay time.Duration
	// OursHedgeConfig, when not empty, replaces the hedgingPolicy block that
	// ours gets in the hedging rows: a JSON object, e.g.
	// `{"maxAttempts": 2, "hedgingDelayQuantile": 0.95}`.
	OursHedgeConfig string
}

// DefaultPolicy is the policy of the failure scenarios.
var DefaultPolicy = Policy{
	MaxAttempts:     4,
	InitialBackoff:  10 * time.Millisecond,
	MaxBackoff:      100 * time.Millisecond,
	BreakerFailures: 5,
	BreakerOpen:     500 * time.Millisecond,
	BulkheadMax:     64,
	BulkheadWait:    time.Second,
	HedgeDelay:      5 * time.Millisecond,
}

// need is what a scenario asks of a peer.
type need int

const (
	needUnary  need = iota // unary calls with the peer's retry policy
	needStream             // server-streaming calls with the peer's retry policy
	needHedge              // unary calls with hedging
)

// peer is one library (or one configuration of it) under comparison.
type peer struct {
	name string
	// note is printed under the tables: what the peer is configured with
	// and what it cannot express.
	note string
	// setup returns the peer's dial options for n, or a reason it cannot
	// do n (then the row says so instead of a number).
	setup func(p Policy, n need) (opts []grpc.DialOption, cannot string, err error)
}

// Peer names, as rows show them.
const (
	peerBare          = "bare (no interceptor)"
	peerGRPC          = "grpc-go retry"
	peerGRPCThrottle  = "grpc-go retry + retryThrottling"
	peerGGM           = "go-grpc-middleware v2 retry"
	peerFailsafe      = "failsafe-go retry"
	peerFailsafeCBBH  = "failsafe-go retry + breaker + bulkhead"
	peerFailsafeHedge = "failsafe-go hedge (fixed delay)"
	// peerFailsafeHedgeQuant is failsafe-go hedging at an observed quantile.
	peerFailsafeHedgeQuant = "failsafe-go hedge (delay quantile)"
	peerGobreakerGGM       = "sony/gobreaker v2 around ggm retry"
	peerOurs               = "ours (retry, budget, breaker, bulkhead)"
	peerOursHedge          = "ours hedging (fixed hedgingDelay)"
	peerOursHedgeQuant     = "ours hedging (config passed in: hedgingDelayQuantile)"
)

func bare() peer {
	return peer{
		name: peerBare,
		note: "grpc.WithDisableRetry(); every ratio is against it. In the paired timing tables its own row times a second bare connection against the first: the noise floor.",
		setup: func(Policy, need) ([]grpc.DialOption, string, error) {
			return []grpc.DialOption{grpc.WithDisableRetry()}, "", nil
		},
	}
}

// retryPeers are the rows of the retry scenarios, bare first.
func retryPeers() []peer {
	return []peer{bare(), grpcRetry(false), grpcRetry(true), ggmRetry(), failsafeRetry(false),
		failsafeRetry(true), gobreakerGGM(), ours()}
}

// allPeers are every row of every scenario, for the report's notes.
func allPeers() []peer {
	return append(retryPeers(), failsafeHedge(), failsafeHedgeQuantile(shiftQuant, shiftAge, shiftSamples),
		oursHedge(peerOursHedge, ""),
		oursHedge(peerOursHedgeQuant, "bench.AdaptiveHedgeConfig: "+AdaptiveHedgeConfig+"; in the slow tail that triples, bench.ShiftHedgeConfig: "+ShiftHedgeConfig))
}

// hedgePeers are the rows of the hedging scenario, bare first.
func hedgePeers(p Policy) []peer {
	ps := []peer{bare(), grpcRetry(false), ggmRetry(), failsafeHedge(), oursHedge(peerOursHedge, "")}
	if p.OursHedgeConfig != "" {
		ps = append(ps, oursHedge(peerOursHedgeQuant, p.OursHedgeConfig))
	}
	return ps
}

func grpcRetry(throttle bool) peer {
	name, note := peerGRPC, "service config retryPolicy via grpc.WithDefaultServiceConfig; streams retried until committed. No breaker, bulkhead or hedging (grpc-go parses no hedgingPolicy)."
	if throttle {
		name, note = peerGRPCThrottle, "as grpc-go retry, plus A6 retryThrottling {maxTokens 10, tokenRatio 0.1}."
	}
	return peer{name: name, note: note, setup: func(p Policy, n need) ([]grpc.DialOption, string, error) {
		if n == needHedge {
			return nil, "no hedging in grpc-go", nil
		}
		sc := fmt.Sprintf(`{"methodConfig":[{"name":[{"service":%q}],"retryPolicy":{"maxAttempts":%d,`+
			`"initialBackoff":"%gs","maxBackoff":"%gs","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]`,
			echoService, p.MaxAttempts, p.InitialBackoff.Seconds(), p.MaxBackoff.Seconds())
		if throttle {
			sc += `,"retryThrottling":{"maxTokens":10,"tokenRatio":0.1}`
		}
		return []grpc.DialOption{grpc.WithDefaultServiceConfig(sc + "}")}, "", nil
	}}
}

func ggmCallOptions(p Policy) []retry.CallOption {
	return []retry.CallOption{
		retry.WithMax(uint(p.MaxAttempts)), // ggm's WithMax counts attempts, the first included
		retry.WithBackoff(retry.BackoffExponentialWithJitterBounded(p.InitialBackoff, 0.2, p.MaxBackoff)),
		retry.WithCodes(codes.Unavailable),
	}
}

func ggmRetry() peer {
	return peer{
		name: peerGGM,
		note: "retry.UnaryClientInterceptor and StreamClientInterceptor, WithMax(attempts), bounded exponential backoff with jitter, WithCodes(UNAVAILABLE). No breaker, bulkhead, budget or hedging.",
		setup: func(p Policy, n need) ([]grpc.DialOption, string, error) {
			if n == needHedge {
				return nil, "no hedging in go-grpc-middleware", nil
			}
			o := ggmCallOptions(p)
			return []grpc.DialOption{grpc.WithDisableRetry(),
				grpc.WithChainUnaryInterceptor(retry.UnaryClientInterceptor(o...)),
				grpc.WithChainStreamInterceptor(retry.StreamClientInterceptor(o...))}, "", nil
		},
	}
}

func failsafeRetryPolicy(p Policy) failsafe.Policy[any] {
	return failsafegrpc.NewRetryPolicyBuilder[any]().
		WithMaxAttempts(p.MaxAttempts).
		WithBackoff(p.InitialBackoff, p.MaxBackoff).
		WithJitterFactor(0.2).
		ReturnLastFailure().
		Build()
}

// failsafeFailure is what failsafe-go's breaker counts as a failure: the
// codes ours and gobreaker count too.
func failsafeFailure(_ any, err error) bool { return isFailure(err) }

func failsafeRetry(guards bool) peer {
	name, note := peerFailsafe, "failsafegrpc.NewUnaryClientInterceptor with failsafegrpc.NewRetryPolicyBuilder (it also retries DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED), WithBackoff, WithJitterFactor(0.2). Unary only: failsafegrpc has no client stream interceptor."
	if guards {
		name, note = peerFailsafeCBBH, "failsafe.With(retry, circuit breaker, bulkhead): the breaker and bulkhead sit inside the retry, per attempt; both are per interceptor, so every method shares them (no per-method state without routing code of one's own)."
	}
	return peer{name: name, note: note, setup: func(p Policy, n need) ([]grpc.DialOption, string, error) {
		switch n {
		case needStream:
			return nil, "no stream interceptor in failsafegrpc", nil
		case needHedge:
			return nil, "see the failsafe-go hedge row", nil
		}
		policies := []failsafe.Policy[any]{failsafeRetryPolicy(p)}
		if guards {
			policies = append(policies,
				circuitbreaker.NewBuilder[any]().HandleIf(failsafeFailure).
					WithFailureThreshold(uint(p.BreakerFailures)).WithDelay(p.BreakerOpen).Build(),
				bulkhead.NewBuilder[any](uint(p.BulkheadMax)).WithMaxWaitTime(p.BulkheadWait).Build())
		}
		return []grpc.DialOption{grpc.WithDisableRetry(),
			grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor(policies...))}, "", nil
	}}
}

func failsafeHedge() peer {
	return peer{
		name: peerFailsafeHedge,
		note: "hedgepolicy.NewBuilderWithDelay(delay), one hedge at most, through failsafegrpc.NewUnaryClientInterceptor. " +
			"Every attempt decodes into the caller's one reply message, so a loser still decoding races with the winner: " +
			"the race detector reports it (proto Reset against Unmarshal), so under -race this row is skipped.",
		setup: func(p Policy, n need) ([]grpc.DialOption, string, error) {
			if n != needHedge {
				return nil, "hedging only", nil
			}
			if raceEnabled {
				return nil, "skipped under the race detector: its hedges share one reply message, a data race", nil
			}
			h := hedgepolicy.NewBuilderWithDelay[any](p.HedgeDelay).WithMaxHedges(1).Build()
			return []grpc.DialOption{grpc.WithDisableRetry(),
				grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor(h))}, "", nil
		},
	}
}

// failsafeHedgeQuantile is failsafe-go's hedging at the observed quantile
// of execution times (NewBuilderWithDelayQuantile), one hedge at most.
func failsafeHedgeQuantile(q float64, age, threshold uint) peer {
	return peer{
		name: peerFailsafeHedgeQuant,
		note: fmt.Sprintf("hedgepolicy.NewBuilderWithDelayQuantile(%.2f, %d, %d), one hedge at most, through "+
			"failsafegrpc.NewUnaryClientInterceptor; skipped under the race detector as the fixed-delay row is.", q, age, threshold),
		setup: func(_ Policy, n need) ([]grpc.DialOption, string, error) {
			if n != needHedge {
				return nil, "hedging only", nil
			}
			if raceEnabled {
				return nil, "skipped under the race detector: its hedges share one reply message, a data race", nil
			}
			h := hedgepolicy.NewBuilderWithDelayQuantile[any](q, age, threshold).WithMaxHedges(1).Build()
			return []grpc.DialOption{grpc.WithDisableRetry(),
				grpc.WithChainUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor(h))}, "", nil
		},
	}
}

// isFailure reports whether err counts against a breaker: the transient
// codes, as ours counts them by default.
func isFailure(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded:
		return true
	}
	return false
}

func gobreakerGGM() peer {
	return peer{
		name: peerGobreakerGGM,
		note: "gobreaker.CircuitBreaker around the ggm retry interceptor (our 15-line unary interceptor: gobreaker has no gRPC integration), so the breaker sees logical calls, not attempts. Streams: the ggm retry only.",
		setup: func(p Policy, n need) ([]grpc.DialOption, string, error) {
			if n == needHedge {
				return nil, "no hedging", nil
			}
			o := ggmCallOptions(p)
			cb := gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
				Name:        "bench",
				MaxRequests: 1,
				Timeout:     p.BreakerOpen,
				ReadyToTrip: func(c gobreaker.Counts) bool {
					return c.ConsecutiveFailures >= uint32(p.BreakerFailures)
				},
				IsSuccessful: func(err error) bool { return !isFailure(err) },
			})
			breaker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				_, err := cb.Execute(func() (struct{}, error) {
					return struct{}{}, invoker(ctx, method, req, reply, cc, opts...)
				})
				return err
			}
			return []grpc.DialOption{grpc.WithDisableRetry(),
				grpc.WithChainUnaryInterceptor(breaker, retry.UnaryClientInterceptor(o...)),
				grpc.WithChainStreamInterceptor(retry.StreamClientInterceptor(o...))}, "", nil
		},
	}
}

// oursConfig is the service config ours runs with: the same retry policy,
// a retry budget, and a breaker and bulkhead per method.
func oursConfig(p Policy) string {
	retryPolicy := fmt.Sprintf(`"retryPolicy":{"maxAttempts":%d,"initialBackoff":"%gs","maxBackoff":"%gs",`+
		`"backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}`,
		p.MaxAttempts, p.InitialBackoff.Seconds(), p.MaxBackoff.Seconds())
	breaker := fmt.Sprintf(`"circuitBreaker":{"consecutiveFailures":%d,"openDuration":"%gs","halfOpenProbes":1}`,
		p.BreakerFailures, p.BreakerOpen.Seconds())
	bh := func(max int) string {
		return fmt.Sprintf(`"bulkhead":{"maxConcurrent":%d,"maxQueue":4096,"maxQueueWait":"%gs"}`, max, p.BulkheadWait.Seconds())
	}
	mcs := fmt.Sprintf(`{"name":[{"service":%q}],%s,%s,%s}`, echoService, retryPolicy, breaker, bh(p.BulkheadMax))
	if p.SlowBulkhead > 0 {
		mcs += fmt.Sprintf(`,{"name":[{"service":%q,"method":"Lookup"}],%s,%s,%s}`,
			echoService, retryPolicy, breaker, bh(p.SlowBulkhead))
	}
	return `{"methodConfig":[` + mcs + `],"retryBudget":{"ratio":0.2,"minRetriesPerSecond":10,"ttl":"10s"}}`
}

// oursHedgeConfig is ours with a hedgingPolicy instead of the retry policy;
// hedge, when not empty, is the hedgingPolicy object as given.
func oursHedgeConfig(p Policy, hedge string) string {
	if hedge == "" {
		hedge = fmt.Sprintf(`{"maxAttempts":2,"hedgingDelay":"%gs"}`, p.HedgeDelay.Seconds())
	}
	return fmt.Sprintf(`{"methodConfig":[{"name":[{"service":%q}],"hedgingPolicy":%s}],`+
		`"retryBudget":{"ratio":0.2,"minRetriesPerSecond":10,"ttl":"10s"}}`, echoService, hedge)
}

func oursClient(doc string) ([]grpc.DialOption, error) {
	cfg, err := serviceconfig.Parse([]byte(doc))
	if err != nil {
		return nil, fmt.Errorf("bench: ours: %w", err)
	}
	c, err := interceptor.NewClient(interceptor.WithServiceConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("bench: ours: %w", err)
	}
	return c.DialOptions(), nil
}

func ours() peer {
	return peer{
		name: peerOurs,
		note: "interceptor.NewClient(WithServiceConfig(...)): the same retryPolicy, retryBudget {ratio 0.2, 10/s, 10s}, circuitBreaker {consecutiveFailures, openDuration, 1 probe} and bulkhead {maxConcurrent, maxQueueWait} per method; unary and streams.",
		setup: func(p Policy, n need) ([]grpc.DialOption, string, error) {
			if n == needHedge {
				return nil, "see the ours hedging rows", nil
			}
			opts, err := oursClient(oursConfig(p))
			return opts, "", err
		},
	}
}

func oursHedge(name, hedge string) peer {
	note := "hedgingPolicy {maxAttempts 2, hedgingDelay} in the service config, within the retry budget."
	if hedge != "" {
		note = "hedgingPolicy as passed in Policy.OursHedgeConfig: " + hedge
	}
	return peer{name: name, note: note, setup: func(p Policy, n need) ([]grpc.DialOption, string, error) {
		if n != needHedge {
			return nil, "hedging only", nil
		}
		opts, err := oursClient(oursHedgeConfig(p, hedge))
		return opts, "", err
	}}
}
