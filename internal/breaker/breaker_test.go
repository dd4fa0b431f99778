package breaker

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Unix(1_000_000, 0)

const ms = time.Millisecond

// A step is one call on the breaker at t0+at, with what it must give.
type step struct {
	kind    stepKind
	at      time.Duration
	slot    int           // token slot for admit and record
	outcome Outcome       // for call and record
	dur     time.Duration // for call and record
	err     error         // rejection, for reject
	after   time.Duration // retryAfter, for reject
	state   State         // for state
	check   func(Snapshot) string
}

type stepKind int

const (
	kCall        stepKind = iota // Allow must admit; Record at once
	kAdmit                       // Allow must admit; keep the token in slot
	kReject                      // Allow must reject with err and after
	kRecord                      // Record the token in slot
	kState                       // Snapshot().State must be state
	kSnap                        // check(Snapshot()) must return ""
	kForceOpen                   // ForceOpen
	kForceClosed                 // ForceClosed
	kReset                       // Reset
)

func call(at time.Duration, o Outcome, dur time.Duration) step {
	return step{kind: kCall, at: at, outcome: o, dur: dur}
}
func admit(at time.Duration, slot int) step { return step{kind: kAdmit, at: at, slot: slot} }
func reject(at time.Duration, err error, after time.Duration) step {
	return step{kind: kReject, at: at, err: err, after: after}
}
func record(at time.Duration, slot int, o Outcome) step {
	return step{kind: kRecord, at: at, slot: slot, outcome: o}
}
func state(at time.Duration, s State) step { return step{kind: kState, at: at, state: s} }
func snap(at time.Duration, check func(Snapshot) string) step {
	return step{kind: kSnap, at: at, check: check}
}

// counts checks the window's counts.
func counts(at time.Duration, calls, failures, slow int) step {
	return snap(at, func(s Snapshot) string {
		if s.Calls != calls || s.Failures != failures || s.SlowCalls != slow {
			return "counts " + itoa(s.Calls) + "/" + itoa(s.Failures) + "/" + itoa(s.SlowCalls) +
				", want " + itoa(calls) + "/" + itoa(failures) + "/" + itoa(slow)
		}
		return ""
	})
}

// openFor checks an Open breaker's open period and its end.
func openFor(at, d, until time.Duration) step {
	return snap(at, func(s Snapshot) string {
		if s.State != StateOpen || s.OpenDuration != d || !s.OpenUntil.Equal(t0.Add(until)) {
			return "state " + s.State.String() + " open " + s.OpenDuration.String() + " until t0+" +
				s.OpenUntil.Sub(t0).String() + ", want open " + d.String() + " until t0+" + until.String()
		}
		return ""
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

func runSteps(t *testing.T, b *Breaker, steps []step) {
	t.Helper()
	toks := map[int]Token{}
	for i, s := range steps {
		now := t0.Add(s.at)
		switch s.kind {
		case kCall, kAdmit:
			tok, after, err := b.Allow(now)
			if err != nil {
				t.Fatalf("step %d: Allow(t0+%v) = %v, %v, want admission", i, s.at, after, err)
			}
			if s.kind == kAdmit {
				toks[s.slot] = tok
			} else {
				b.Record(tok, now, s.outcome, s.dur)
			}
		case kReject:
			tok, after, err := b.Allow(now)
			if err != s.err || after != s.after || tok != (Token{}) {
				t.Fatalf("step %d: Allow(t0+%v) = %v, %v, %v, want zero Token, %v, %v", i, s.at, tok, after, err, s.after, s.err)
			}
		case kRecord:
			tok, ok := toks[s.slot]
			if !ok {
				t.Fatalf("step %d: no token in slot %d", i, s.slot)
			}
			b.Record(tok, now, s.outcome, s.dur)
		case kState:
			if got := b.Snapshot(now).State; got != s.state {
				t.Fatalf("step %d: Snapshot(t0+%v).State = %v, want %v", i, s.at, got, s.state)
			}
		case kSnap:
			if msg := s.check(b.Snapshot(now)); msg != "" {
				t.Fatalf("step %d: Snapshot(t0+%v): %s", i, s.at, msg)
			}
		case kForceOpen:
			b.ForceOpen(now)
		case kForceClosed:
			b.ForceClosed(now)
		case kReset:
			b.Reset(now)
		}
	}
}

func TestStateMachine(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{
			name: "trips on consecutive failures; a success restarts the count",
			cfg:  Config{ConsecutiveFailures: 3},
			steps: []step{
				call(0, Failure, 0), call(1*ms, Failure, 0), call(2*ms, Success, 0),
				call(3*ms, Failure, 0), call(4*ms, Failure, 0), state(4*ms, StateClosed),
				snap(4*ms, func(s Snapshot) string {
					if s.ConsecutiveFailures != 2 {
						return "ConsecutiveFailures " + itoa(s.ConsecutiveFailures) + ", want 2"
					}
					return ""
				}),
				call(5*ms, Failure, 0), state(5*ms, StateOpen),
				openFor(5*ms, DefaultOpenDuration, 5*ms+DefaultOpenDuration),
				reject(6*ms, ErrOpen, DefaultOpenDuration-1*ms),
			},
		},
		{
			name: "trips on failure rate once minimum calls were seen",
			cfg:  Config{FailureRateThreshold: 0.5, MinimumCalls: 4},
			steps: []step{
				call(0, Failure, 0), call(1*ms, Failure, 0), call(2*ms, Failure, 0),
				state(2*ms, StateClosed), counts(2*ms, 3, 3, 0), // 3/3 failed, below MinimumCalls
				call(3*ms, Success, 0), state(3*ms, StateOpen), // 3/4 ≥ 0.5
			},
		},
		{
			name: "failure rate exactly at the threshold trips, on a success",
			cfg:  Config{FailureRateThreshold: 0.3, MinimumCalls: 10},
			steps: []step{
				call(0, Failure, 0), call(0, Failure, 0), call(0, Failure, 0),
				call(0, Success, 0), call(0, Success, 0), call(0, Success, 0),
				call(0, Success, 0), call(0, Success, 0), call(0, Success, 0),
				state(0, StateClosed),
				call(0, Success, 0), state(0, StateOpen), // 3/10 = 0.3
			},
		},
		{
			name: "failure rate below the threshold does not trip",
			cfg:  Config{FailureRateThreshold: 0.5, MinimumCalls: 4},
			steps: []step{
				call(0, Failure, 0), call(0, Success, 0), call(0, Success, 0), call(0, Success, 0),
				call(0, Failure, 0), call(0, Success, 0), call(0, Success, 0),
				state(0, StateClosed), counts(0, 7, 2, 0),
			},
		},
		{
			name: "trips on slow-call rate; only calls above SlowCallDuration are slow",
			cfg:  Config{SlowCallDuration: 100 * ms, SlowCallRateThreshold: 0.5, MinimumCalls: 4},
			steps: []step{
				call(0, Success, 200*ms), call(1*ms, Success, 50*ms), call(2*ms, Success, 100*ms),
				state(2*ms, StateClosed), counts(2*ms, 3, 0, 1),
				call(3*ms, Success, 101*ms), state(3*ms, StateOpen), // 2/4 slow
			},
		},
		{
			name: "slow failures count as slow; slow rate threshold 0 means 1",
			cfg:  Config{SlowCallDuration: 100 * ms, MinimumCalls: 2},
			steps: []step{
				call(0, Failure, time.Second), call(0, Success, 0), call(0, Success, time.Second),
				state(0, StateClosed), counts(0, 3, 1, 2),
			},
		},
		{
			name: "slow-call rate of 1 trips",
			cfg:  Config{SlowCallDuration: 100 * ms, MinimumCalls: 2},
			steps: []step{
				call(0, Success, time.Second), state(0, StateClosed),
				call(0, Failure, time.Second), state(0, StateOpen),
			},
		},
		{
			name: "outcomes leave the window after Window",
			cfg:  Config{FailureRateThreshold: 0.5, MinimumCalls: 4, Window: 10 * time.Second},
			steps: []step{
				call(500*ms, Failure, 0), call(1500*ms, Failure, 0), call(1500*ms, Failure, 0),
				counts(9999*ms, 3, 3, 0), // bucket [0s, 1s) is still in the window
				counts(10*time.Second, 2, 2, 0),
				call(10*time.Second, Success, 0), state(10*time.Second, StateClosed), // 2/3, below MinimumCalls
				counts(11*time.Second, 1, 0, 0),
				call(11*time.Second, Failure, 0), call(11*time.Second, Failure, 0),
				state(11*time.Second, StateClosed),                                 // 2/3, below MinimumCalls
				call(11*time.Second, Success, 0), state(11*time.Second, StateOpen), // 2/4
			},
		},
		{
			name: "a long pause empties the window",
			cfg:  Config{FailureRateThreshold: 0.5, MinimumCalls: 2, Window: time.Second},
			steps: []step{
				call(0, Failure, 0), counts(999*ms, 1, 1, 0), counts(time.Hour, 0, 0, 0),
				call(time.Hour, Failure, 0), state(time.Hour, StateClosed),
			},
		},
		{
			name: "an earlier now counts in the newest bucket",
			cfg:  Config{FailureRateThreshold: 0.5, MinimumCalls: 5, Window: 10 * time.Second},
			steps: []step{
				call(5*time.Second, Failure, 0), call(0, Failure, 0),
				counts(14*time.Second, 2, 2, 0), counts(15*time.Second, 0, 0, 0),
			},
		},
		{
			name: "half-open lets HalfOpenProbes through; that many successes close it",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second, HalfOpenProbes: 2},
			steps: []step{
				call(0, Failure, 0),
				reject(999*ms, ErrOpen, 1*ms),
				admit(time.Second, 1), admit(time.Second, 2),
				reject(time.Second, ErrHalfOpenFull, 0),
				record(1100*ms, 1, Success),
				state(1100*ms, StateHalfOpen),
				admit(1100*ms, 3),
				reject(1100*ms, ErrHalfOpenFull, 0),
				record(1200*ms, 2, Success), state(1200*ms, StateClosed),
				record(1300*ms, 3, Failure), // admitted while half-open: stale
				state(1300*ms, StateClosed), counts(1300*ms, 0, 0, 0),
			},
		},
		{
			name: "one failed probe opens the breaker again",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second, HalfOpenProbes: 3},
			steps: []step{
				call(0, Failure, 0),
				admit(time.Second, 1), admit(time.Second, 2),
				record(time.Second+ms, 1, Success),
				record(time.Second+2*ms, 2, Failure),
				// The open period counts from the failed probe's start.
				openFor(time.Second+2*ms, time.Second, 2*time.Second),
				reject(time.Second+500*ms, ErrOpen, 500*ms),
			},
		},
		{
			name: "a probe that fails later than an open period after its start half-opens at once",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second},
			steps: []step{
				call(0, Failure, 0),
				admit(time.Second, 1), // sent during the outage
				reject(time.Second+500*ms, ErrHalfOpenFull, 0),
				record(time.Second+900*ms, 1, Failure), // its answer came late
				reject(time.Second+950*ms, ErrOpen, 50*ms),
				admit(2*time.Second, 2), record(2*time.Second+ms, 2, Success),
				state(2*time.Second+ms, StateClosed),
			},
		},
		{
			name: "a probe that never reports is deemed lost after an open period",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second},
			steps: []step{
				call(0, Failure, 0),
				admit(time.Second, 1),
				reject(2*time.Second-ms, ErrHalfOpenFull, 0),
				admit(2*time.Second, 2),              // probe 1 is lost: a new one goes
				record(2*time.Second+ms, 1, Failure), // probe 1's late outcome is stale
				state(2*time.Second+ms, StateHalfOpen),
				record(2*time.Second+2*ms, 2, Success),
				state(2*time.Second+2*ms, StateClosed),
			},
		},
		{
			name: "with two probes, one that replaced a reported probe gets its whole open period",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second, HalfOpenProbes: 2},
			steps: []step{
				call(0, Failure, 0),
				admit(time.Second, 1),
				admit(time.Second+900*ms, 2),
				record(time.Second+950*ms, 1, Success),
				admit(time.Second+960*ms, 3), // full again: probes 2 and 3
				reject(2*time.Second+100*ms, ErrHalfOpenFull, 0),
				record(2*time.Second+200*ms, 2, Success), // not deemed lost: counts
				state(2*time.Second+200*ms, StateClosed),
			},
		},
		{
			name: "a slow probe opens the breaker again when slow calls trip it",
			cfg:  Config{ConsecutiveFailures: 1, SlowCallDuration: 100 * ms, OpenDuration: time.Second},
			steps: []step{
				call(0, Failure, 0),
				call(time.Second, Success, 101*ms), state(time.Second, StateOpen),
				call(2*time.Second, Success, 100*ms), state(2*time.Second, StateClosed),
			},
		},
		{
			name: "open time doubles on trips from half-open up to the cap; a close resets it",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second, MaxOpenDuration: 3 * time.Second},
			steps: []step{
				call(0, Failure, 0), openFor(0, time.Second, time.Second),
				call(time.Second, Failure, 0), openFor(time.Second, 2*time.Second, 3*time.Second),
				reject(2*time.Second, ErrOpen, time.Second),
				call(3*time.Second, Failure, 0), openFor(3*time.Second, 3*time.Second, 6*time.Second),
				call(6*time.Second, Failure, 0), openFor(6*time.Second, 3*time.Second, 9*time.Second),
				call(9*time.Second, Success, 0), state(9*time.Second, StateClosed),
				call(10*time.Second, Failure, 0), openFor(10*time.Second, time.Second, 11*time.Second),
				snap(10*time.Second, func(s Snapshot) string {
					if s.Trips != 5 {
						return "Trips " + itoa(int(s.Trips)) + ", want 5"
					}
					return ""
				}),
			},
		},
		{
			name: "ignored outcomes count nothing and keep the failure streak",
			cfg:  Config{ConsecutiveFailures: 2, FailureRateThreshold: 0.5, MinimumCalls: 3},
			steps: []step{
				call(0, Failure, 0), call(0, Ignored, time.Hour), call(0, Outcome(99), 0),
				counts(0, 1, 1, 0), state(0, StateClosed),
				call(0, Failure, 0), state(0, StateOpen),
			},
		},
		{
			name: "an ignored probe frees its slot",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second},
			steps: []step{
				call(0, Failure, 0),
				admit(time.Second, 1), reject(time.Second, ErrHalfOpenFull, 0),
				record(time.Second, 1, Ignored), state(time.Second, StateHalfOpen),
				admit(time.Second, 2), record(time.Second, 2, Success), state(time.Second, StateClosed),
			},
		},
		{
			name: "outcomes of an earlier generation are discarded",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second},
			steps: []step{
				admit(0, 1), admit(0, 2), admit(0, 3),
				record(0, 1, Failure), openFor(0, time.Second, time.Second),
				record(10*ms, 2, Failure), // stale: no second trip, no longer open time
				openFor(10*ms, time.Second, time.Second),
				admit(time.Second, 4),
				record(time.Second, 3, Success), // stale: does not close
				snap(time.Second, func(s Snapshot) string {
					if s.State != StateHalfOpen || s.Probes != 1 || s.ProbeSuccesses != 0 || s.Trips != 1 {
						return "state " + s.State.String() + " probes " + itoa(s.Probes) + " successes " +
							itoa(s.ProbeSuccesses) + " trips " + itoa(int(s.Trips)) + ", want half-open 1 0 1"
					}
					return ""
				}),
				record(time.Second, 4, Success), state(time.Second, StateClosed),
			},
		},
		{
			name: "Reset discards outcomes admitted before it",
			cfg:  Config{ConsecutiveFailures: 1},
			steps: []step{
				admit(0, 1), {kind: kReset}, record(0, 1, Failure), state(0, StateClosed),
			},
		},
		{
			name: "ForceOpen holds the breaker open until Reset",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second},
			steps: []step{
				admit(0, 1),
				{kind: kForceOpen}, reject(0, ErrForcedOpen, 0),
				record(0, 1, Success), reject(time.Hour, ErrForcedOpen, 0), state(time.Hour, StateForcedOpen),
				{kind: kReset, at: time.Hour}, state(time.Hour, StateClosed),
				call(time.Hour, Failure, 0), state(time.Hour, StateOpen),
			},
		},
		{
			name: "ForceClosed admits and counts but never trips, until Reset",
			cfg:  Config{ConsecutiveFailures: 1, FailureRateThreshold: 0.1, MinimumCalls: 1},
			steps: []step{
				call(0, Failure, 0), state(0, StateOpen),
				{kind: kForceClosed}, state(0, StateForcedClosed), counts(0, 0, 0, 0),
				call(0, Failure, 0), call(0, Failure, 0), counts(0, 2, 2, 0), state(0, StateForcedClosed),
				{kind: kForceOpen}, reject(0, ErrForcedOpen, 0),
				{kind: kForceClosed}, call(0, Success, 0), state(0, StateForcedClosed),
				{kind: kReset}, counts(0, 0, 0, 0), state(0, StateClosed),
				call(0, Failure, 0), state(0, StateOpen),
			},
		},
		{
			name: "ForceOpen during half-open discards the probes",
			cfg:  Config{ConsecutiveFailures: 1, OpenDuration: time.Second},
			steps: []step{
				call(0, Failure, 0), admit(time.Second, 1),
				{kind: kForceOpen, at: time.Second}, record(time.Second, 1, Success),
				state(time.Second, StateForcedOpen),
			},
		},
		{
			name: "without trip conditions the breaker never trips",
			cfg:  Config{},
			steps: []step{
				call(0, Failure, time.Hour), call(0, Failure, 0), call(0, Failure, 0),
				counts(0, 3, 3, 0), state(0, StateClosed),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New(tt.cfg)
			if err != nil {
				t.Fatalf("New(%+v) = %v", tt.cfg, err)
			}
			runSteps(t, b, tt.steps)
		})
	}
}

func TestRejectionsAreErrOpen(t *testing.T) {
	for _, err := range []error{ErrOpen, ErrForcedOpen, ErrHalfOpenFull} {
		if !errors.Is(err, ErrOpen) {
			t.Errorf("errors.Is(%v, ErrOpen) = false, want true", err)
		}
	}
	if errors.Is(ErrOpen, ErrForcedOpen) || errors.Is(ErrHalfOpenFull, ErrForcedOpen) {
		t.Error("ErrOpen or ErrHalfOpenFull is ErrForcedOpen, want distinct")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // empty: valid
	}{
		{name: "zero", cfg: Config{}},
		{name: "all set", cfg: Config{
			ConsecutiveFailures: 5, FailureRateThreshold: 1, SlowCallDuration: time.Second,
			SlowCallRateThreshold: 1, MinimumCalls: 1, Window: 10, OpenDuration: time.Second,
			MaxOpenDuration: time.Minute, HalfOpenProbes: 3,
		}},
		{name: "max open equals default open", cfg: Config{MaxOpenDuration: DefaultOpenDuration}},
		{name: "negative consecutive", cfg: Config{ConsecutiveFailures: -1},
			wantErr: "breaker: Config.ConsecutiveFailures = -1: must be in [0, 2147483647]"},
		{name: "rate above 1", cfg: Config{FailureRateThreshold: 1.5},
			wantErr: "breaker: Config.FailureRateThreshold = 1.5: must be in [0, 1]"},
		{name: "negative rate", cfg: Config{FailureRateThreshold: -0.1},
			wantErr: "breaker: Config.FailureRateThreshold = -0.1: must be in [0, 1]"},
		{name: "NaN slow rate", cfg: Config{SlowCallRateThreshold: nan()},
			wantErr: "breaker: Config.SlowCallRateThreshold = NaN: must be in [0, 1]"},
		{name: "negative slow duration", cfg: Config{SlowCallDuration: -1},
			wantErr: "breaker: Config.SlowCallDuration = -1ns: must not be negative"},
		{name: "negative minimum calls", cfg: Config{MinimumCalls: -3},
			wantErr: "breaker: Config.MinimumCalls = -3: must be in [0, 2147483647]"},
		{name: "window below one ns per bucket", cfg: Config{Window: 9},
			wantErr: "breaker: Config.Window = 9ns: must be 0 or at least 10ns"},
		{name: "negative open", cfg: Config{OpenDuration: -time.Second},
			wantErr: "breaker: Config.OpenDuration = -1s: must not be negative"},
		{name: "negative max open", cfg: Config{MaxOpenDuration: -time.Second},
			wantErr: "breaker: Config.MaxOpenDuration = -1s: must not be negative"},
		{name: "max open below open", cfg: Config{OpenDuration: 2 * time.Second, MaxOpenDuration: time.Second},
			wantErr: "breaker: Config.MaxOpenDuration = 1s: must not be less than OpenDuration (2s)"},
		{name: "max open below default open", cfg: Config{MaxOpenDuration: time.Second},
			wantErr: "breaker: Config.MaxOpenDuration = 1s: must not be less than OpenDuration (5s)"},
		{name: "negative probes", cfg: Config{HalfOpenProbes: -1},
			wantErr: "breaker: Config.HalfOpenProbes = -1: must be in [0, 2147483647]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.wantErr {
				t.Errorf("Validate() = %q, want %q", got, tt.wantErr)
			}
			b, err := New(tt.cfg)
			if (err == nil) != (tt.wantErr == "") || (err == nil) != (b != nil) {
				t.Errorf("New() = %v, %v, want error %q", b, err, tt.wantErr)
			}
		})
	}
}

func nan() float64 { var z float64; return z / z }

func TestNewResolvesDefaults(t *testing.T) {
	b, err := New(Config{SlowCallDuration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		SlowCallDuration: time.Second, SlowCallRateThreshold: 1, MinimumCalls: DefaultMinimumCalls,
		Window: DefaultWindow, OpenDuration: DefaultOpenDuration, MaxOpenDuration: DefaultOpenDuration,
		HalfOpenProbes: DefaultHalfOpenProbes,
	}
	if !reflect.DeepEqual(b.cfg, want) {
		t.Errorf("New(%+v).cfg = %+v, want %+v", Config{SlowCallDuration: time.Second}, b.cfg, want)
	}
	if s := b.Snapshot(t0); s.State != StateClosed || s.OpenDuration != DefaultOpenDuration {
		t.Errorf("Snapshot() = %+v, want closed with OpenDuration %v", s, DefaultOpenDuration)
	}
}

func TestStringers(t *testing.T) {
	tests := []struct {
		in   interface{ String() string }
		want string
	}{
		{StateClosed, "closed"}, {StateOpen, "open"}, {StateHalfOpen, "half-open"},
		{StateForcedOpen, "forced-open"}, {StateForcedClosed, "forced-closed"}, {State(9), "State(9)"},
		{Ignored, "ignored"}, {Success, "success"}, {Failure, "failure"}, {Outcome(7), "ignored"},
	}
	for _, tt := range tests {
		if got := tt.in.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

func TestStateChangeHookRunsOutsideTheLock(t *testing.T) {
	type change struct{ from, to State }
	var (
		b       *Breaker
		changes []change
	)
	cfg := Config{
		ConsecutiveFailures: 1, OpenDuration: time.Second,
		OnStateChange: func(from, to State) {
			// Both would deadlock or fail if the hook ran with the lock held.
			if !b.mu.TryLock() {
				t.Errorf("OnStateChange(%v, %v) called with the lock held", from, to)
			} else {
				b.mu.Unlock()
			}
			if s := b.Snapshot(t0); s.State != to { // t0 is before every open time ends
				t.Errorf("OnStateChange(%v, %v): Snapshot().State = %v, want %v", from, to, s.State, to)
			}
			changes = append(changes, change{from, to})
		},
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runSteps(t, b, []step{
		call(0, Failure, 0),                 // closed → open
		call(time.Second, Failure, 0),       // open → half-open (Allow), half-open → open (Record)
		state(3*time.Second, StateHalfOpen), // described half-open (Snapshot changes nothing)
		call(3*time.Second, Success, 0),     // open → half-open (Allow), half-open → closed
		{kind: kReset, at: 3 * time.Second}, // closed → closed: no call
		{kind: kForceOpen, at: 3 * time.Second},
		{kind: kForceOpen, at: 3 * time.Second}, // no change: no call
		{kind: kForceClosed, at: 3 * time.Second},
		{kind: kReset, at: 3 * time.Second},
	})
	want := []change{
		{StateClosed, StateOpen}, {StateOpen, StateHalfOpen}, {StateHalfOpen, StateOpen},
		{StateOpen, StateHalfOpen}, {StateHalfOpen, StateClosed},
		{StateClosed, StateForcedOpen}, {StateForcedOpen, StateForcedClosed}, {StateForcedClosed, StateClosed},
	}
	if len(changes) != len(want) {
		t.Fatalf("OnStateChange calls = %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Errorf("OnStateChange call %d = %v, want %v", i, changes[i], want[i])
		}
	}
}

func TestTokenProbe(t *testing.T) {
	b, err := New(Config{ConsecutiveFailures: 1, OpenDuration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tok, _, _ := b.Allow(t0)
	if tok.Probe() {
		t.Errorf("Allow(t0).Probe() = true in closed, want false")
	}
	b.Record(tok, t0, Failure, 0)
	if tok, _, _ = b.Allow(t0); tok.Probe() {
		t.Errorf("rejected Token.Probe() = true, want false")
	}
	if tok, _, _ = b.Allow(t0.Add(time.Second)); !tok.Probe() {
		t.Errorf("Allow(t0+1s).Probe() = false in half-open, want true")
	}
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	b, err := New(Config{ConsecutiveFailures: 1000, FailureRateThreshold: 0.99, SlowCallDuration: time.Second, HalfOpenProbes: 1})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	tests := []struct {
		name string
		f    func()
	}{
		{"closed success", func() {
			now = now.Add(time.Millisecond)
			tok, _, _ := b.Allow(now)
			b.Record(tok, now, Success, time.Millisecond)
		}},
		{"closed failure and ignored", func() {
			now = now.Add(time.Millisecond)
			tok, _, _ := b.Allow(now)
			b.Record(tok, now, Failure, 2*time.Second)
			tok, _, _ = b.Allow(now)
			b.Record(tok, now, Ignored, 0)
		}},
		{"open rejection", func() {
			b.ForceOpen(now)
			b.Allow(now)
			b.Reset(now)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testing.AllocsPerRun(1000, tt.f); got != 0 {
				t.Errorf("AllocsPerRun(%s) = %v, want 0", tt.name, got)
			}
		})
	}
}

// TestRejectsPeeksWithoutChanging: Rejects gives Allow's lock-free
// rejection in every state and admits nothing, takes no probe and turns no
// state; Admitting is true exactly in the closed states.
func TestRejectsPeeksWithoutChanging(t *testing.T) {
	b, err := New(Config{ConsecutiveFailures: 1, OpenDuration: time.Second, HalfOpenProbes: 1})
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, now time.Time, admitting bool, wantErr error, wantAfter time.Duration) {
		t.Helper()
		if got := b.Admitting(); got != admitting {
			t.Errorf("%s: Admitting() = %v, want %v", what, got, admitting)
		}
		if after, err := b.Rejects(now); err != wantErr || after != wantAfter {
			t.Errorf("%s: Rejects = %v, %v, want %v, %v", what, after, err, wantAfter, wantErr)
		}
	}
	check("closed", t0, true, nil, 0)
	tok, _, _ := b.Allow(t0)
	b.Record(tok, t0, Failure, 0)
	check("open", t0.Add(300*ms), false, ErrOpen, 700*ms)
	// The open time has passed: Allow would turn half-open and admit a
	// probe; Rejects says nil and changes nothing.
	check("open, time passed", t0.Add(time.Second), false, nil, 0)
	if s := b.Snapshot(t0.Add(300 * ms)).State; s != StateOpen {
		t.Fatalf("state after Rejects = %v, want still open", s)
	}
	probe, _, err := b.Allow(t0.Add(time.Second))
	if err != nil || !probe.Probe() {
		t.Fatalf("Allow after the open time = %v, want a probe", err)
	}
	check("half-open, probe out", t0.Add(time.Second+ms), false, ErrHalfOpenFull, 0)
	b.Record(probe, t0.Add(time.Second+ms), Success, ms)
	check("closed again", t0.Add(time.Second+ms), true, nil, 0)
	b.ForceOpen(t0.Add(2 * time.Second))
	check("forced open", t0.Add(2*time.Second), false, ErrForcedOpen, 0)
	b.ForceClosed(t0.Add(2 * time.Second))
	check("forced closed", t0.Add(2*time.Second), true, nil, 0)
}

// TestReconfigureKeepsTheState: a breaker runs its steps under oldCfg, is
// reconfigured to cfg at at, and runs the steps after. Forced states stay;
// an open period ends when it would have, at most the new MaxOpenDuration
// after the change; counts start afresh under the new thresholds; no hook
// is called.
func TestReconfigureKeepsTheState(t *testing.T) {
	oldCfg := Config{ConsecutiveFailures: 2, OpenDuration: 100 * ms, MaxOpenDuration: 400 * ms}
	newCfg := Config{ConsecutiveFailures: 3, OpenDuration: 50 * ms, MaxOpenDuration: 60 * ms}
	trip := []step{call(0, Failure, 0), call(1*ms, Failure, 0)} // open t0+1ms .. t0+101ms
	tests := []struct {
		name  string
		cfg   Config
		old   []step
		at    time.Duration
		steps []step
	}{
		{"closed stays closed with counts afresh", newCfg, []step{call(0, Failure, 0)}, 2 * ms,
			[]step{state(2*ms, StateClosed), counts(2*ms, 0, 0, 0), call(3*ms, Failure, 0), call(4*ms, Failure, 0), state(4*ms, StateClosed),
				call(5*ms, Failure, 0), state(5*ms, StateOpen)}},
		{"forced open stays forced open", oldCfg, []step{{kind: kForceOpen}}, 2 * ms,
			[]step{reject(3*ms, ErrForcedOpen, 0), state(time.Hour, StateForcedOpen)}},
		{"forced closed stays forced closed", oldCfg, []step{{kind: kForceClosed}}, 2 * ms,
			[]step{call(3*ms, Failure, 0), call(4*ms, Failure, 0), call(5*ms, Failure, 0), state(5*ms, StateForcedClosed)}},
		{"open ends when it would have", Config{ConsecutiveFailures: 3, OpenDuration: 50 * ms, MaxOpenDuration: time.Second}, trip, 20 * ms,
			[]step{openFor(20*ms, 100*ms, 101*ms), reject(100*ms, ErrOpen, 1*ms), call(101*ms, Success, 0), state(101*ms, StateClosed)}},
		{"open at most the new max from the change", newCfg, trip, 20 * ms,
			[]step{openFor(20*ms, 60*ms, 80*ms), reject(79*ms, ErrOpen, 1*ms), state(80*ms, StateHalfOpen)}},
		{"open past its time is half-open", newCfg, trip, 200 * ms,
			[]step{state(200*ms, StateHalfOpen), call(201*ms, Success, 0), state(201*ms, StateClosed)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changing := false
			cfg := oldCfg
			cfg.OnStateChange = func(from, to State) {
				if changing {
					t.Errorf("OnStateChange(%v, %v) on Reconfigure", from, to)
				}
			}
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			runSteps(t, b, tt.old)
			changing = true
			if err := b.Reconfigure(tt.cfg, t0.Add(tt.at)); err != nil {
				t.Fatal(err)
			}
			changing = false
			runSteps(t, b, tt.steps)
		})
	}
}

// TestReconfigureRefusesABadConfig: a config out of range is an error and
// changes nothing.
func TestReconfigureRefusesABadConfig(t *testing.T) {
	b, err := New(Config{ConsecutiveFailures: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Reconfigure(Config{FailureRateThreshold: 2}, t0); err == nil {
		t.Fatal("Reconfigure(FailureRateThreshold 2) = nil, want an error")
	}
	runSteps(t, b, []step{call(0, Failure, 0), state(0, StateOpen)})
}

// TestStateChangesAreReportedInOrderOneAtATime pins the order of
// OnStateChange under concurrency: 8 goroutines trip, probe, force and
// reset one breaker while its hook, which sleeps a little and calls the
// breaker back (ForceOpen, Snapshot, Reset), checks that no other report
// runs beside it and that each report's from is the last report's to. Hooks
// of changes in quick succession used to run concurrently and out of
// order; a hook that calls the breaker runs after it returns.
func TestStateChangesAreReportedInOrderOneAtATime(t *testing.T) {
	var (
		b        *Breaker
		running  atomic.Int32
		mu       sync.Mutex
		last     = StateClosed
		reports  int
		reentry  atomic.Int32
		badOrder []string
	)
	b, err := New(Config{ConsecutiveFailures: 1, OpenDuration: time.Millisecond, OnStateChange: func(from, to State) {
		if running.Add(1) != 1 {
			t.Error("two OnStateChange calls at once")
		}
		mu.Lock()
		if from != last {
			badOrder = append(badOrder, fmt.Sprintf("%v→%v after →%v", from, to, last))
		}
		last = to
		reports++
		mu.Unlock()
		if reentry.Add(1)%7 == 0 {
			b.ForceOpen(time.Now()) // reported after this hook returns
			b.Reset(time.Now())
		}
		_ = b.Snapshot(time.Now())
		running.Add(-1)
	}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				now := time.Now()
				switch (g + i) % 5 {
				case 0, 1:
					if tok, _, err := b.Allow(now); err == nil {
						b.Record(tok, time.Now(), Failure, 0)
					}
				case 2:
					if tok, _, err := b.Allow(now); err == nil {
						b.Record(tok, time.Now(), Success, 0)
					}
				case 3:
					b.ForceOpen(now)
				case 4:
					b.Reset(now)
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(badOrder) > 0 {
		t.Errorf("%d of %d reports out of order, first: %s", len(badOrder), reports, badOrder[0])
	}
	// The state itself, not Snapshot's: Snapshot reads an open breaker
	// whose open time has passed (1ms here, soon gone on a busy machine)
	// as half-open, a change reported only at the next Allow.
	b.mu.Lock()
	got := b.state
	b.mu.Unlock()
	if got != last {
		t.Errorf("the last report was →%v, the breaker is %v", last, got)
	}
	if reports < 100 {
		t.Errorf("%d reports, want many", reports)
	}
}

// TestAHookThatPanicsDoesNotStopTheReports: the changes after a hook's
// panic are still reported.
func TestAHookThatPanicsDoesNotStopTheReports(t *testing.T) {
	var got []State
	b, err := New(Config{ConsecutiveFailures: 1, OnStateChange: func(_, to State) {
		got = append(got, to)
		if to == StateForcedOpen {
			panic("hook")
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		b.ForceOpen(t0)
	}()
	b.Reset(t0)
	if want := []State{StateForcedOpen, StateClosed}; !slices.Equal(got, want) {
		t.Errorf("reports %v, want %v", got, want)
	}
}

// TestAnAllowWhoseHookPanicsGivesItsProbeBack: the Allow that turns the
// breaker HalfOpen takes the probe, then reports the change; a hook that
// panics (or calls runtime.Goexit) there leaves its caller without the
// token, so the probe goes back and the next Allow is the probe, not
// refused with ErrHalfOpenFull for an open period.
func TestAnAllowWhoseHookPanicsGivesItsProbeBack(t *testing.T) {
	for _, goexit := range []bool{false, true} {
		b, err := New(Config{ConsecutiveFailures: 1, OpenDuration: time.Second, HalfOpenProbes: 1,
			OnStateChange: func(_, to State) {
				if to != StateHalfOpen {
					return
				}
				if goexit {
					runtime.Goexit()
				}
				panic("hook")
			}})
		if err != nil {
			t.Fatal(err)
		}
		tok, _, _ := b.Allow(t0)
		b.Record(tok, t0, Failure, 0)
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() { _ = recover() }()
			_, _, _ = b.Allow(t0.Add(time.Second))
			t.Error("Allow returned; its hook panics")
		}()
		<-done
		if s := b.Snapshot(t0.Add(time.Second)); s.State != StateHalfOpen || s.Probes != 0 {
			t.Errorf("goexit=%v: after the hook's abort: %v with %d probes out, want half-open with none", goexit, s.State, s.Probes)
		}
		if _, _, err := b.Allow(t0.Add(time.Second)); err != nil {
			t.Errorf("goexit=%v: the next Allow: %v, want the probe", goexit, err)
		}
	}
}
