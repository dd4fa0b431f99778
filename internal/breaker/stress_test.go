package breaker

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStress drives one breaker from many goroutines through every state,
// with mixed outcomes, stale tokens and manual control, and checks the
// invariants: half-open never has more than HalfOpenProbes probes of one
// generation in flight, rejections carry the right retryAfter, the hook sees
// only valid transitions, and no probe slot leaks.
func TestStress(t *testing.T) {
	const (
		goroutines = 8
		iterations = 3000
		probes     = 3
	)
	var (
		clock       atomic.Int64 // ns since t0, moved forward by every goroutine
		badEdges    atomic.Int64
		toOpen      atomic.Int64
		toClosed    atomic.Int64
		probeMu     sync.Mutex
		probesInGen = map[uint64]int{} // probes in flight per generation, guarded by probeMu
	)
	cfg := Config{
		ConsecutiveFailures: 3, FailureRateThreshold: 0.5, MinimumCalls: 10,
		SlowCallDuration: 50 * ms, SlowCallRateThreshold: 0.8, Window: time.Second,
		OpenDuration: 10 * ms, MaxOpenDuration: 80 * ms, HalfOpenProbes: probes,
		OnStateChange: func(from, to State) {
			switch {
			case to == StateOpen && from != StateClosed && from != StateHalfOpen,
				to == StateHalfOpen && from != StateOpen,
				from == to:
				badEdges.Add(1)
			case to == StateOpen:
				toOpen.Add(1)
			case to == StateClosed && from == StateHalfOpen:
				toClosed.Add(1)
			}
		},
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := func(r *rand.Rand) time.Time {
		return t0.Add(time.Duration(clock.Add(r.Int64N(int64(200 * time.Microsecond)))))
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 42))
			var held []Token
			recordOne := func(tok Token, at time.Time) {
				if tok.Probe() {
					probeMu.Lock()
					probesInGen[tok.w>>stateBits]--
					probeMu.Unlock()
				}
				// Sick in every other 100ms period.
				sick := at.Sub(t0)/(100*ms)%2 == 0
				o, d := Success, time.Duration(r.Int64N(int64(40*ms)))
				switch p := r.Float64(); {
				case sick && p < 0.7 || !sick && p < 0.03:
					o = Failure
				case p > 0.9:
					o = Ignored
				case sick && p > 0.8:
					d = time.Second
				}
				b.Record(tok, at, o, d)
			}
			for i := range iterations {
				at := now(r)
				if g == 0 {
					s := b.Snapshot(at)
					if s.Probes < 0 || s.Probes > probes || s.Failures > s.Calls || s.SlowCalls > s.Calls || s.Calls < 0 {
						t.Errorf("Snapshot() = %+v, want 0 ≤ Probes ≤ %d and Failures, SlowCalls ≤ Calls", s, probes)
					}
					if i%500 == 499 {
						b.ForceOpen(at)
						b.Reset(at)
					}
				}
				tok, after, err := b.Allow(at)
				switch {
				case err == ErrOpen && after <= 0,
					(err == ErrHalfOpenFull || err == ErrForcedOpen) && after != 0,
					err != nil && err != ErrOpen && err != ErrHalfOpenFull && err != ErrForcedOpen:
					t.Errorf("Allow() = %v, %v, want ErrOpen with retryAfter > 0 or another rejection with 0", after, err)
				case err == nil && tok.Probe():
					probeMu.Lock()
					gen := tok.w >> stateBits
					probesInGen[gen]++
					if n := probesInGen[gen]; n > probes {
						t.Errorf("half-open generation %d has %d probes in flight, want at most %d", gen, n, probes)
					}
					probeMu.Unlock()
				}
				if err == nil {
					held = append(held, tok)
				}
				if len(held) > r.IntN(3) {
					recordOne(held[0], now(r))
					held = append(held[:0], held[1:]...)
				}
			}
			for _, tok := range held {
				recordOne(tok, now(r))
			}
		})
	}
	wg.Wait()
	if n := badEdges.Load(); n != 0 {
		t.Errorf("OnStateChange saw %d invalid transitions", n)
	}
	if toOpen.Load() == 0 || toClosed.Load() == 0 {
		t.Errorf("trips = %d, closes from half-open = %d, want both > 0", toOpen.Load(), toClosed.Load())
	}
	if s := b.Snapshot(t0.Add(time.Duration(clock.Load()))); s.Probes != 0 {
		t.Errorf("Snapshot().Probes = %d after every token was recorded, want 0", s.Probes)
	}
	t.Logf("trips %d, closes %d, final %+v", toOpen.Load(), toClosed.Load(), b.Snapshot(t0.Add(time.Duration(clock.Load()))))
}
