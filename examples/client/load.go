package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rescodes "github.com/grpc-resilience/resilience/codes"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

// stats counts calls per summary period and in total.
type stats struct {
	start   time.Time
	retries atomic.Int64 // retries in the period, from the OnRetry hook

	mu            sync.Mutex
	period, total map[codes.Code]int64 // calls by final code; guarded by mu
	totalRetries  int64                // guarded by mu
}

func newStats() *stats {
	return &stats{start: time.Now(), period: map[codes.Code]int64{}, total: map[codes.Code]int64{}}
}

func (s *stats) record(c codes.Code) {
	s.mu.Lock()
	s.period[c]++
	s.total[c]++
	s.mu.Unlock()
}

// print writes one summary line, of the last period or, when total, of the
// whole run:
//
//	1s calls=812 ok=790 codes=OK:790,UNAVAILABLE:22 attempts/call=1.31 breaker=closed
func (s *stats) print(w io.Writer, total bool, breaker string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	retries := s.retries.Swap(0)
	s.totalRetries += retries
	counts, label := s.period, fmt.Sprintf("%.0fs", time.Since(s.start).Seconds())
	if total {
		counts, retries, label = s.total, s.totalRetries, "total"
	}
	var calls int64
	parts := make([]string, 0, len(counts))
	for c, n := range counts {
		calls += n
		parts = append(parts, fmt.Sprintf("%s:%d", rescodes.Name(c), n))
	}
	sort.Strings(parts)
	perCall := 0.0
	if calls > 0 {
		perCall = float64(calls+retries) / float64(calls)
	}
	fmt.Fprintf(w, "%s calls=%d ok=%d codes=%s attempts/call=%.2f breaker=%s\n",
		label, calls, counts[codes.OK], strings.Join(parts, ","), perCall, breaker)
	s.period = map[codes.Code]int64{}
}

// caller returns one call of the chosen method with its own deadline.
func caller(ec echov1.EchoServiceClient, c *config) func(ctx context.Context, i int64) error {
	return func(ctx context.Context, i int64) error {
		ctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		msg := fmt.Sprintf("call %d", i)
		var err error
		if c.method == "Lookup" {
			_, err = ec.Lookup(ctx, &echov1.LookupRequest{Message: msg})
		} else {
			_, err = ec.Echo(ctx, &echov1.EchoRequest{Message: msg})
		}
		return err
	}
}

// drive runs c.concurrency callers until ctx ends, at c.rate calls per
// second in total when positive, and calls summary every second and once
// with total at the end.
func drive(ctx context.Context, c *config, call func(context.Context, int64) error, st *stats, summary func(total bool)) {
	var tokens chan struct{}
	if c.rate > 0 {
		tokens = make(chan struct{}, c.concurrency)
		go pace(ctx, c.rate, tokens)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	for range c.concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if tokens != nil {
					select {
					case <-tokens:
					case <-ctx.Done():
						return
					}
				}
				if ctx.Err() != nil {
					return
				}
				err := call(context.WithoutCancel(ctx), n.Add(1))
				st.record(status.Code(err))
			}
		}()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-tick.C:
			summary(false)
		case <-ctx.Done():
			done = true
		}
	}
	wg.Wait()
	summary(false)
	summary(true)
}

// pace puts rate tokens per second into tokens, dropping those no caller
// is free to take, until ctx ends.
func pace(ctx context.Context, rate float64, tokens chan<- struct{}) {
	interval := time.Duration(float64(time.Second) / rate)
	t := time.NewTicker(max(interval, time.Microsecond))
	defer t.Stop()
	for {
		select {
		case <-t.C:
			select {
			case tokens <- struct{}{}:
			default:
			}
		case <-ctx.Done():
			return
		}
	}
}
