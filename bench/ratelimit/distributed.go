package ratelimit

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore/redistest"
	"github.com/grpc-resilience/resilience/interceptor/ratelimit/redisquota"
	"github.com/grpc-resilience/resilience/interceptor/wire"
)

// The distributed measurement: Replicas processes share a per-tenant limit
// of Rate per second in one redis-server. Tenant "a" is offered Load ×
// Rate, spread over the processes by Shares (70/10/10/10 by default);
// tenant "b" is offered exactly its own limit (Rate), evenly. Each process
// decides every call through one of two modes:
//
//   - leased: redisquota's Limiter (token leasing: a round trip per batch);
//   - envoy: a GCRA script in Redis asked on every call, the shape of
//     Envoy's global rate limit (a rate-limit service backed by Redis, asked
//     on every request; here without the service's own hop, which only
//     favours the baseline).
//
// Each process prints a JSON line per second of its counts, and one at the
// end with its decision latencies; the parent adds them up by second.
type DistConfig struct {
	Replicas int
	Rate     float64
	Burst    int
	Load     float64
	Shares   []float64
	Duration time.Duration
	Mode     string // "leased" or "envoy"
	// Fault: "" none; "redis-restart": redis-server killed at FaultAt and
	// started again FaultFor later; "kill-replica": process 0 (the busiest)
	// killed at FaultAt.
	Fault    string
	FaultAt  time.Duration
	FaultFor time.Duration
}

// DefaultDist is the measurement: 4 processes, 1,000/s per
// tenant, 4× load 70/10/10/10, 10 s.
func DefaultDist() DistConfig {
	return DistConfig{Replicas: 4, Rate: 1000, Burst: 100, Load: 4, Shares: []float64{0.7, 0.1, 0.1, 0.1},
		Duration: 10 * time.Second, Mode: "leased", FaultAt: 4 * time.Second, FaultFor: 2 * time.Second}
}

// DistResult is one run's numbers.
type DistResult struct {
	Mode, Fault string
	// A and B are tenant a's and b's admitted calls in each second, all
	// processes together.
	A, B []int
	// RoundTrips is the processes' Redis round trips, Admitted their
	// admitted calls (both tenants); RoundTripsA and AdmittedA tenant a's.
	RoundTrips, Admitted   int64
	RoundTripsA, AdmittedA int64
	// P50 and P99 are the decision latencies over every call of every
	// process (the processes' own percentiles, the worst of them).
	P50, P99 time.Duration
	// Fallback is the calls decided in fallback.
	Fallback int64
}

// childLine is what a replica process prints: every 50ms, its counts so
// far of the current second (and, once, the final counts of the second
// that ended); T is when, in ms after the start.
type childLine struct {
	T        int64   `json:"t"`
	Sec      int     `json:"sec"`
	A        int     `json:"a"`
	B        int     `json:"b"`
	RT       int64   `json:"rt"`
	RTA      int64   `json:"rta"` // the round trips of tenant a's key
	Done     bool    `json:"done,omitempty"`
	P50      float64 `json:"p50,omitempty"` // seconds
	P99      float64 `json:"p99,omitempty"`
	Fallback int64   `json:"fallback,omitempty"`
}

// ChildEnv names the environment variable that makes the benchmark command
// a replica process: its value is the JSON of a ChildArgs.
const ChildEnv = "RATELIMIT_BENCH_CHILD"

// ChildArgs is a replica process's part.
type ChildArgs struct {
	Index     int
	Addr      string
	Prefix    string
	Rate      float64
	Burst     int
	OfferA    float64 // tenant a, calls per second
	OfferB    float64
	Start     int64 // unix nanoseconds: when to start offering
	Duration  time.Duration
	Mode      string
	LeaseWait time.Duration
}

// Distributed runs the measurement once, with self as the command to start
// for each replica (the benchmark command, which runs RunChild when
// ChildEnv is set).
func Distributed(ctx context.Context, cfg DistConfig, self string) (DistResult, error) {
	if cfg.Replicas < 1 || len(cfg.Shares) != cfg.Replicas {
		return DistResult{}, fmt.Errorf("distributed: %d replicas, %d shares", cfg.Replicas, len(cfg.Shares))
	}
	srv, err := startRedis(0)
	if err != nil {
		return DistResult{}, err
	}
	defer srv.stop()
	prefix := fmt.Sprintf("bench:%d:", time.Now().UnixNano())
	start := time.Now().Add(1500 * time.Millisecond) // every process up and connected
	secs := int((cfg.Duration + time.Second - 1) / time.Second)
	res := DistResult{Mode: cfg.Mode, Fault: cfg.Fault, A: make([]int, secs), B: make([]int, secs)}
	// counts[i][sec] is replica i's latest report of second sec: the
	// counts only grow, and a killed replica's last report stands.
	counts := make([][][2]int, cfg.Replicas)
	killAt := make(chan struct{})
	var killOnce sync.Once
	var mu sync.Mutex
	var wg sync.WaitGroup
	procs := make([]*exec.Cmd, cfg.Replicas)
	errs := make(chan error, cfg.Replicas)
	for i := range cfg.Replicas {
		args := ChildArgs{Index: i, Addr: srv.addr, Prefix: prefix, Rate: cfg.Rate, Burst: cfg.Burst,
			OfferA: cfg.Load * cfg.Rate * cfg.Shares[i], OfferB: cfg.Rate / float64(cfg.Replicas),
			Start: start.UnixNano(), Duration: cfg.Duration, Mode: cfg.Mode, LeaseWait: 100 * time.Millisecond}
		js, _ := json.Marshal(args)
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), ChildEnv+"="+string(js))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return DistResult{}, err
		}
		if err := cmd.Start(); err != nil {
			return DistResult{}, err
		}
		procs[i] = cmd
		wg.Go(func() {
			var last childLine
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var l childLine
				if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
					errs <- fmt.Errorf("replica %d: %q: %v", i, sc.Text(), err)
					continue
				}
				mu.Lock()
				if l.Done {
					res.P50, res.P99 = max(res.P50, secs2d(l.P50)), max(res.P99, secs2d(l.P99))
					res.Fallback += l.Fallback
				} else if l.Sec >= 0 && l.Sec < secs {
					for len(counts[i]) <= l.Sec {
						counts[i] = append(counts[i], [2]int{})
					}
					counts[i][l.Sec] = [2]int{l.A, l.B}
				}
				mu.Unlock()
				last = l
				// The busiest replica is killed right after a report at
				// or past the fault's time, so what it admitted is known
				// to a few milliseconds.
				if cfg.Fault == "kill-replica" && i == 0 && time.Duration(l.T)*time.Millisecond >= cfg.FaultAt {
					killOnce.Do(func() { close(killAt) })
				}
			}
			_, _ = io.Copy(io.Discard, out)
			err := cmd.Wait()
			mu.Lock()
			res.RoundTrips += last.RT
			res.RoundTripsA += last.RTA
			mu.Unlock()
			if err != nil && !(cfg.Fault == "kill-replica" && i == 0) {
				errs <- fmt.Errorf("replica %d: %v", i, err)
			}
		})
	}
	switch cfg.Fault {
	case "redis-restart":
		sleepUntil(start.Add(cfg.FaultAt))
		srv.stop()
		sleepUntil(start.Add(cfg.FaultAt + cfg.FaultFor))
		if srv, err = startRedis(srv.port); err != nil {
			return DistResult{}, err
		}
		defer srv.stop()
	case "kill-replica":
		<-killAt
		_ = procs[0].Process.Kill()
	case "":
	default:
		return DistResult{}, fmt.Errorf("distributed: unknown fault %q", cfg.Fault)
	}
	wg.Wait()
	close(errs)
	for i := range counts {
		for sec, c := range counts[i] {
			res.A[sec] += c[0]
			res.B[sec] += c[1]
			res.Admitted += int64(c[0] + c[1])
			res.AdmittedA += int64(c[0])
		}
	}
	for err := range errs {
		return res, err
	}
	return res, nil
}

func secs2d(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func sleepUntil(t time.Time) {
	if d := time.Until(t); d > 0 {
		time.Sleep(d)
	}
}

// RunChild is a replica process: it offers its calls from args.Start for
// args.Duration and prints a line per second to w.
func RunChild(args ChildArgs, w io.Writer) error {
	rc := redis.NewClient(&redis.Options{Addr: args.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond,
		ContextTimeoutEnabled: true, PoolSize: 64})
	defer rc.Close()
	trips := redistest.CountRoundTrips(rc)
	tripsA := &keyTrips{key: "{" + limitName + ":" + keyHash("a") + "}", envoy: "{a}"}
	rc.AddHook(tripsA)
	decide, closeFn, err := decider(args, rc)
	if err != nil {
		return err
	}
	defer closeFn()
	start := time.Unix(0, args.Start)
	secs := int((args.Duration + time.Second - 1) / time.Second)
	a := make([]atomic.Int64, secs)
	b := make([]atomic.Int64, secs)
	var fallback atomic.Int64
	var latMu sync.Mutex
	var lats []time.Duration
	var wg sync.WaitGroup
	offer := func(tenant string, rate float64, counts []atomic.Int64, senders int) {
		if rate <= 0 {
			return
		}
		gap := time.Duration(float64(time.Second) * float64(senders) / rate)
		for s := range senders {
			wg.Go(func() {
				var mine []time.Duration
				next := start.Add(gap * time.Duration(s) / time.Duration(senders))
				end := start.Add(args.Duration)
				for next.Before(end) {
					sleepUntil(next)
					t0 := time.Now()
					ok, fb := decide(tenant)
					mine = append(mine, time.Since(t0))
					if fb {
						fallback.Add(1)
					}
					if sec := int(t0.Sub(start) / time.Second); ok && sec >= 0 && sec < secs {
						counts[sec].Add(1)
					}
					next = next.Add(gap)
				}
				latMu.Lock()
				lats = append(lats, mine...)
				latMu.Unlock()
			})
		}
	}
	offer("a", args.OfferA, a, max(1, int(args.OfferA/250)))
	offer("b", args.OfferB, b, max(1, int(args.OfferB/250)))
	enc := json.NewEncoder(w)
	report := func(sec int, at time.Duration) error {
		return enc.Encode(childLine{T: int64(at / time.Millisecond), Sec: sec, A: int(a[sec].Load()), B: int(b[sec].Load()),
			RT: trips.N(), RTA: tripsA.n.Load()})
	}
	// Every 50ms, the counts of the second under way, and once each second
	// has ended, its final counts: a replica killed mid-run has reported
	// all but its last few milliseconds.
	for at := 50 * time.Millisecond; at <= args.Duration+100*time.Millisecond; at += 50 * time.Millisecond {
		sleepUntil(start.Add(at))
		sec := int(at / time.Second)
		if at%time.Second < 100*time.Millisecond && sec > 0 && sec-1 < secs { // the second that ended, again, complete
			if err := report(sec-1, at); err != nil {
				return err
			}
		}
		if sec < secs {
			if err := report(sec, at); err != nil {
				return err
			}
		}
	}
	wg.Wait()
	slices.Sort(lats)
	pct := func(p float64) float64 {
		if len(lats) == 0 {
			return 0
		}
		return lats[min(len(lats)-1, int(p*float64(len(lats))))].Seconds()
	}
	return enc.Encode(childLine{Done: true, RT: trips.N(), RTA: tripsA.n.Load(), P50: pct(0.5), P99: pct(0.99), Fallback: fallback.Load()})
}

// decider returns the process's decision function for args.Mode.
func decider(args ChildArgs, rc *redis.Client) (func(tenant string) (ok, fallback bool), func(), error) {
	switch args.Mode {
	case "leased":
		store, err := redisquota.New(rc, redisquota.WithKeyPrefix(args.Prefix), redisquota.WithLeaseTimeout(args.LeaseWait))
		if err != nil {
			return nil, nil, err
		}
		l, err := store.Limiter(limitName, redisquota.Limit{Rate: args.Rate, Burst: args.Burst})
		if err != nil {
			return nil, nil, err
		}
		return func(tenant string) (bool, bool) {
			d, err := l.Allow(context.Background(), tenant, wire.Critical)
			return err == nil && d.OK, d.Fallback
		}, func() { _ = store.Close() }, nil
	case "envoy":
		t := micros(time.Duration(float64(time.Second) / args.Rate))
		tau := micros(time.Duration(float64(time.Second) * float64(args.Burst) / args.Rate))
		return func(tenant string) (bool, bool) {
			ctx, cancel := context.WithTimeout(context.Background(), args.LeaseWait)
			defer cancel()
			n, err := envoyScript.Run(ctx, rc, []string{args.Prefix + "{" + tenant + "}"}, t, tau).Int()
			if err != nil {
				return true, true // Envoy's default: failure_mode_deny false, the call goes through
			}
			return n == 1, false
		}, func() {}, nil
	}
	return nil, nil, fmt.Errorf("unknown mode %q", args.Mode)
}

func micros(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', -1, 64)
}

// envoyScript is GCRA asked on every call: 1 admitted, 0 refused.
var envoyScript = redis.NewScript(`
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local t = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
local nt = math.max(tat, now) + t
if nt - now > tau then return 0 end
redis.call('SET', KEYS[1], string.format('%.17g', nt), 'PX', math.ceil((nt - now) / 1000) + 1)
return 1
`)

// redisProc is a redis-server this package started, on a port of its own,
// so that it can be started again on the same port after a kill.
type redisProc struct {
	cmd  *exec.Cmd
	port int
	addr string
}

func startRedis(port int) (*redisProc, error) {
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--daemonize", "no", "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting redis-server (install it, or put it on PATH): %w", err)
	}
	p := &redisProc{cmd: cmd, port: port, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	c := redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			p.stop()
			return nil, errors.New("redis-server not ready after 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	return p, nil
}

func (p *redisProc) stop() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

// limitName is the distributed limit's name in the processes.
const limitName = "per-tenant"

// keyHash is how redisquota names a key in Redis (its package doc): the
// unpadded base64url of the first 12 bytes of the key's SHA-256.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

// keyTrips counts the scripts run on the Redis key that ends in key (or,
// for the baseline, envoy): one tenant's round trips.
type keyTrips struct {
	key, envoy string
	n          atomic.Int64
}

func (k *keyTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (k *keyTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 3 {
			if key, ok := args[3].(string); ok && (strings.HasSuffix(key, k.key) || strings.HasSuffix(key, k.envoy)) {
				k.n.Add(1)
			}
		}
		return next(ctx, cmd)
	}
}

func (k *keyTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
