package outlier

import (
	"testing"
	"time"
	"unsafe"
)

// stepWall returns t with its wall clock moved by d (whole seconds) and
// its monotonic reading unchanged: what time.Now returns after NTP or an
// operator steps the system clock. time.Time is {wall uint64; ext int64;
// loc}; with a monotonic reading (bit 63 of wall), bits 30–62 of wall
// count the seconds since 1885 and ext is the monotonic reading.
func stepWall(tb testing.TB, t time.Time, d time.Duration) time.Time {
	tb.Helper()
	p := (*struct {
		wall uint64
		ext  int64
	})(unsafe.Pointer(&t))
	if p.wall>>63 == 0 {
		tb.Fatal("stepWall: t has no monotonic reading")
	}
	p.wall += uint64(int64(d/time.Second)) << 30
	return t
}

// TestEjectionFollowsTheMonotonicClockNotTheWallClock pins ejection times
// against a step of the system clock: an ejection of 10s ends 10s later
// on the monotonic clock whatever the wall clock did meanwhile. Before:
// the engine compared Unix wall nanoseconds, so a step back of an hour
// kept a recovered endpoint out for an hour more, and a step forward
// ended every ejection at once.
func TestEjectionFollowsTheMonotonicClockNotTheWallClock(t *testing.T) {
	now := time.Now()
	if got, want := stepWall(t, now, -time.Hour).Round(0), now.Round(0).Add(-time.Hour); !got.Equal(want) {
		t.Fatalf("stepWall = %v, want %v", got, want)
	}
	cfg := testConfig()
	cfg.ConsecutiveFailures, cfg.BaseEjectionTime = 1, 10*time.Second
	_, eps := newGroup(t, cfg, 2)
	e := eps[0]
	if !e.Record(now, Failure).Ejected() {
		t.Fatal("no ejection")
	}
	tests := []struct {
		name  string
		at    time.Time
		want  bool
		until time.Duration // EjectedUntil − at, when ejected
	}{
		{"1s later, clock stepped forward 1h", stepWall(t, now.Add(time.Second), time.Hour), true, 9 * time.Second},
		{"11s later, clock stepped back 1h", stepWall(t, now.Add(11*time.Second), -time.Hour), false, 0},
	}
	for _, tt := range tests {
		if got := e.Ejected(tt.at); got != tt.want {
			t.Errorf("%s: Ejected = %v, want %v", tt.name, got, tt.want)
		}
		if u := e.EjectedUntil(tt.at); tt.want && u.Sub(tt.at) != tt.until {
			t.Errorf("%s: EjectedUntil − now = %v, want %v", tt.name, u.Sub(tt.at), tt.until)
		}
	}
}
