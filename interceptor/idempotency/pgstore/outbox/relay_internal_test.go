package outbox

import (
	"testing"
	"time"
)

// TestRelayBackoffDoublesUpToItsMaximum pins RelayConfig's formula: the
// n-th failed delivery waits InitialBackoff·2^(n-1), at most MaxBackoff.
func TestRelayBackoffDoublesUpToItsMaximum(t *testing.T) {
	r := &Relay{cfg: RelayConfig{InitialBackoff: time.Second, MaxBackoff: 10 * time.Second}}
	tests := []struct {
		attempts int
		want     time.Duration
	}{
		{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {4, 8 * time.Second}, {5, 10 * time.Second},
		{1000, 10 * time.Second},
	}
	for _, tt := range tests {
		if got := r.backoff(tt.attempts); got != tt.want {
			t.Errorf("backoff(%d) = %v, want %v", tt.attempts, got, tt.want)
		}
	}
}

// TestRelayHoldsAMethodWhoseLastDeliveryOfAPassWasRefused pins the rule of
// mixed outcomes in one pass: a method is held when the last of its
// deliveries to end was refused by the client, until the latest time its
// refusals gave; a delivery admitted after the refusals (the half-open
// probe that closed the breaker) holds nothing; each method on its own.
func TestRelayHoldsAMethodWhoseLastDeliveryOfAPassWasRefused(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	refused := func(end, untilMs int) outcome { return outcome{refused: true, end: at(end), until: at(untilMs)} }
	admitted := func(end int) outcome { return outcome{answered: true, end: at(end)} }
	failed := func(end int) outcome { return outcome{end: at(end)} } // sent, failed for now
	tests := []struct {
		name    string
		methods []string
		outs    []outcome
		want    map[string]time.Time
	}{
		{"AllRefusedHeldUntilTheLatestRetryAfter", []string{"/a/A", "/a/A"}, []outcome{refused(1, 5000), refused(2, 5010)},
			map[string]time.Time{"/a/A": at(5010)}},
		{"ProbeAdmittedAfterTheRefusals", []string{"/a/A", "/a/A", "/a/A"}, []outcome{refused(1, 1000), refused(1, 1000), admitted(30)},
			map[string]time.Time{}},
		{"BreakerOpenedMidPass", []string{"/a/A", "/a/A", "/a/A"}, []outcome{admitted(1), failed(5), refused(20, 5020)},
			map[string]time.Time{"/a/A": at(5020)}},
		{"EachMethodOnItsOwn", []string{"/a/A", "/b/B", "/b/B"}, []outcome{refused(10, 5010), admitted(20), failed(30)},
			map[string]time.Time{"/a/A": at(5010)}},
		{"NoRefusal", []string{"/a/A", "/b/B"}, []outcome{admitted(1), failed(2)}, map[string]time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Relay{}
			msgs := make([]Message, len(tt.methods))
			for i, m := range tt.methods {
				msgs[i].FullMethod = m
			}
			r.hold(msgs, tt.outs)
			if len(r.held) != len(tt.want) {
				t.Fatalf("held = %v, want %v", r.held, tt.want)
			}
			for m, until := range tt.want {
				if !r.held[m].Equal(until) {
					t.Errorf("held[%s] = %v, want %v", m, r.held[m].Sub(t0), until.Sub(t0))
				}
			}
			if got := r.heldMethods(at(6000)); len(got) != 0 || len(r.held) != 0 {
				t.Errorf("heldMethods after every hold = %v (map %v), want none, forgotten", got, r.held)
			}
		})
	}
}
