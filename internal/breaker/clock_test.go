package breaker

import (
	"testing"
	"time"
	"unsafe"
)

// stepWall returns t, which must carry a monotonic reading, with its wall
// clock moved by d (whole seconds) and its monotonic reading unchanged: what
// time.Now returns after the system clock was stepped by d. It writes the
// seconds field of time.Time's wall word (bits 30-62 while the monotonic
// bit is set), and checks the result, so that a change of the layout fails
// the test instead of testing nothing.
func stepWall(tb testing.TB, t time.Time, d time.Duration) time.Time {
	tb.Helper()
	s := t
	w := (*uint64)(unsafe.Pointer(&s))
	if *w>>63 == 0 {
		tb.Fatalf("stepWall: %v has no monotonic reading", t)
	}
	*w += uint64(int64(d/time.Second) << 30)
	if got := s.UnixNano() - t.UnixNano(); got != int64(d) || s.Sub(t) != 0 {
		tb.Fatalf("stepWall: wall moved %v and monotonic %v, want %v and 0: time.Time's layout changed", time.Duration(got), s.Sub(t), d)
	}
	return s
}

// TestOpenTimeIgnoresWallClockSteps pins that a breaker's open time runs on
// the monotonic clock when its instants carry it: a step of the wall clock
// back does not hold it open for the length of the step, and a step forward
// does not cut its open time short.
func TestOpenTimeIgnoresWallClockSteps(t *testing.T) {
	tests := []struct {
		name      string
		after     time.Duration // on the monotonic clock, from the trip
		step      time.Duration // of the wall clock meanwhile
		wantErr   error
		wantRetry time.Duration
	}{
		{name: "stepped back, open time over", after: 6 * time.Second, step: -time.Hour, wantErr: nil},
		{name: "stepped back, open time left", after: time.Second, step: -time.Hour, wantErr: ErrOpen, wantRetry: 4 * time.Second},
		{name: "stepped forward, open time left", after: time.Second, step: time.Hour, wantErr: ErrOpen, wantRetry: 4 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(Config{ConsecutiveFailures: 1, OpenDuration: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			tok, _, _ := b.Allow(t0)
			b.Record(tok, t0, Failure, 0)
			now := stepWall(t, t0.Add(tt.after), tt.step)
			tok, retry, err := b.Allow(now)
			if err != tt.wantErr || retry != tt.wantRetry {
				t.Fatalf("Allow(%v after the trip, wall clock stepped %v) = %v, %v, want %v, %v", tt.after, tt.step, retry, err, tt.wantRetry, tt.wantErr)
			}
			if err == nil && !tok.Probe() {
				t.Fatalf("Allow admitted %+v, want a half-open probe", tok)
			}
			b.Record(tok, now, Success, 0)
			if s := b.Snapshot(now); s.Probes != 0 {
				t.Fatalf("Snapshot().Probes = %d after the probe's outcome, want 0", s.Probes)
			}
		})
	}
}
