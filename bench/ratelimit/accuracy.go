package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	ours "github.com/grpc-resilience/resilience/internal/ratelimit"
)

// AccuracyConfig is the admitted-rate measurement: calls offered at Load ×
// Rate for Duration of real time, from Senders goroutines on an open-loop
// schedule (a sender that falls behind catches up, so the calls offered
// are what the schedule says, whatever the scheduler does), against one
// key of a limit of Rate per second with bursts of Burst. Each call asks
// ours and x/time/rate (with the same rate and burst) at the same instant.
//
// A token bucket can only admit what arrives: when no call comes for
// longer than the burst lasts (Burst/Rate), the tokens beyond the burst
// are lost, for any implementation. On a busy machine senders stall for
// tens of milliseconds, so the result reports the longest gap between
// calls, and a burst of 10 (10ms at 1,000/s) measures the scheduler as
// much as the limiter.
type AccuracyConfig struct {
	Rate     float64
	Burst    int
	Load     float64
	Duration time.Duration
	Senders  int
}

// DefaultAccuracy is the measurement: 1,000/s offered at 3× for
// 10 s.
func DefaultAccuracy() AccuracyConfig {
	return AccuracyConfig{Rate: 1000, Burst: 100, Load: 3, Duration: 10 * time.Second, Senders: 4}
}

// AccuracyResult is one run's numbers.
type AccuracyResult struct {
	Offered, Admitted int64
	Elapsed           time.Duration // from the first call to the last
	// Ratio is the admitted rate against the configured rate, from the
	// first refused call (the burst spent: the bucket empty) to the last
	// call: the calls admitted after the first refusal over Rate × that
	// time. Counting from the first call instead would count the burst,
	// and lose what a stall of the senders while the bucket was still
	// full lets spill over (tokens of a full bucket are lost in any
	// implementation).
	Ratio float64
	// XAdmitted and XRatio are x/time/rate's, on the same calls.
	XAdmitted int64
	XRatio    float64
	// Window is the time from the first refusal to the last call.
	Window time.Duration
	// MaxGap is the longest time between two consecutive calls.
	MaxGap time.Duration
}

// Accuracy runs the measurement once.
func Accuracy(ctx context.Context, cfg AccuracyConfig) (AccuracyResult, error) {
	start := time.Now()
	l, err := ours.New(ours.Config{Rate: cfg.Rate, Burst: cfg.Burst}, start)
	if err != nil {
		return AccuracyResult{}, err
	}
	if cfg.Senders < 1 || cfg.Load <= 0 || cfg.Duration <= 0 {
		return AccuracyResult{}, fmt.Errorf("accuracy: %+v: need senders, load and duration", cfg)
	}
	gap := time.Duration(float64(time.Second) * float64(cfg.Senders) / (cfg.Load * cfg.Rate))
	x := rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Burst)
	var offered, admitted, xadmitted atomic.Int64
	// After the first refusal (by ours; x/time/rate refuses the same
	// calls), in ns after start; 0 before.
	var refusedAt atomic.Int64
	var after, xafter atomic.Int64
	var mu sync.Mutex // orders the calls, for the gaps
	var prev time.Time
	var maxGap time.Duration
	var first, last atomic.Int64 // ns after start
	first.Store(1 << 62)
	var wg sync.WaitGroup
	for s := range cfg.Senders {
		wg.Go(func() {
			next := start.Add(gap * time.Duration(s) / time.Duration(cfg.Senders)) // senders interleave
			end := start.Add(cfg.Duration)
			for next.Before(end) && ctx.Err() == nil {
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
				mu.Lock()
				now := time.Now()
				if !prev.IsZero() {
					maxGap = max(maxGap, now.Sub(prev))
				}
				prev = now
				mu.Unlock()
				counting := refusedAt.Load() != 0
				if ok, _ := l.Allow(now, "tenant", ours.Critical); ok {
					admitted.Add(1)
					if counting {
						after.Add(1)
					}
				} else if !counting {
					refusedAt.CompareAndSwap(0, int64(now.Sub(start)))
				}
				if x.AllowN(now, 1) {
					xadmitted.Add(1)
					if counting {
						xafter.Add(1)
					}
				}
				offered.Add(1)
				n := int64(now.Sub(start))
				for f := first.Load(); n < f && !first.CompareAndSwap(f, n); f = first.Load() {
				}
				for x := last.Load(); n > x && !last.CompareAndSwap(x, n); x = last.Load() {
				}
				next = next.Add(gap)
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return AccuracyResult{}, err
	}
	r := AccuracyResult{Offered: offered.Load(), Admitted: admitted.Load(), XAdmitted: xadmitted.Load(),
		Elapsed: time.Duration(last.Load() - first.Load()), MaxGap: maxGap,
		Window: time.Duration(last.Load() - refusedAt.Load())}
	r.Ratio = float64(after.Load()) / (cfg.Rate * r.Window.Seconds())
	r.XRatio = float64(xafter.Load()) / (cfg.Rate * r.Window.Seconds())
	return r, nil
}
