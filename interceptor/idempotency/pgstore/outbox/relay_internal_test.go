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
