package endpoint

import (
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/resolver"

	"github.com/grpc-resilience/resilience/internal/outlier"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// TestParkedStateGoesOnceItsMultiplierDecayed pins REVIEW class "a release
// missing" for the state a closed policy parks: an endpoint ejected, back
// and on probation (no success since: the channel closed first) parks its
// channel's state, and the state goes once its multiplier has decayed
// (Multiplier × baseEjectionTime after the return), as Snapshots says.
// Before, probation alone kept it parked for the process's life: grpc
// closes a closed channel's policy as an idle one's, so each closed
// channel that had an endpoint on probation stayed, until maxParked of
// them left no room for the idle channels that need it.
func TestParkedStateGoesOnceItsMultiplierDecayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newLB("parked", nil)
		b.setConfig(newConfig(&serviceconfig.EndpointPolicy{ConsecutiveFailures: 1, BaseEjectionTime: time.Second,
			MaxEjectionPercent: ptr(100)}))
		ep := resolver.Endpoint{Addresses: []resolver.Address{{Addr: "10.0.0.1:443"}}}
		b.mu.Lock()
		e, _ := b.newEntryLocked(ep)
		b.entries.Set(ep, e)
		b.mu.Unlock()
		if ch := e.out.Record(time.Now(), outlier.Failure); !ch.Ejected() {
			t.Fatalf("a failure at consecutiveFailures 1 did not eject: %+v", ch)
		}
		time.Sleep(1500 * time.Millisecond) // the 1s ejection has ended, unnoticed: on probation
		channel := new(int)
		park(channel, b)
		has := func() bool {
			parkedMu.Lock()
			defer parkedMu.Unlock()
			pruneLocked(time.Now())
			_, ok := parked[channel]
			return ok
		}
		if !has() {
			t.Fatal("a state on probation, its multiplier not decayed, was not parked")
		}
		time.Sleep(time.Second) // 1.5s since the return: 1 × baseEjectionTime has passed
		if has() {
			t.Fatal("the parked state stayed after its multiplier decayed: probation alone keeps it for ever")
		}
		if p := unpark(channel); p != nil {
			t.Fatalf("unpark returned a state whose multiplier has decayed: %+v", p)
		}
	})
}
