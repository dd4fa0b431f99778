package endpoint

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/connectivity"
)

// live holds the policy's instances: one per channel that uses it, from
// grpc's Build to its Close.
var live sync.Map // *lb → struct{}

// Snapshot is the state of the policy on one channel, for an operator.
type Snapshot struct {
	Target      string // the channel's target
	ChildPolicy string // round_robin or pick_first
	// Endpoints are the channel's endpoints, in the resolver's order.
	Endpoints []EndpointState
	// Ejections counts ejections; Overflow, those refused by
	// maxEjectionPercent; AttemptsAvoided, retries and hedged copies sent
	// away from an endpoint their call had used. Since the channel
	// started, or since its ejection configuration last changed
	// (Ejections, Overflow).
	Ejections, Overflow, AttemptsAvoided uint64
}

// EndpointState is one endpoint's state in a Snapshot.
type EndpointState struct {
	Addresses    []string
	Connectivity connectivity.State
	// EjectedUntil is when its ejection ends; zero when in rotation.
	EjectedUntil time.Time
	// Ejections counts its ejections.
	Ejections uint64
	// ConsecutiveFailures is its current run of failures; Calls and
	// Failures are its outcomes in the failure-percentage window.
	ConsecutiveFailures int
	Calls, Failures     int
}

// Snapshots returns the state of the policy on every channel that uses it,
// sorted by target, at now.
func Snapshots(now time.Time) []Snapshot {
	var out []Snapshot
	live.Range(func(k, _ any) bool {
		out = append(out, k.(*lb).snapshot(now))
		return true
	})
	slices.SortFunc(out, func(a, b Snapshot) int { return strings.Compare(a.Target, b.Target) })
	return out
}

func (b *lb) snapshot(now time.Time) Snapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	child := "round_robin"
	if b.cfg.Load().ordered {
		child = "pick_first"
	}
	ej, _ := b.group.Ejections()
	s := Snapshot{Target: b.target, ChildPolicy: child, Ejections: ej, Overflow: b.overflow.Load(), AttemptsAvoided: b.avoided.Load()}
	conn := map[*entry]connectivity.State{}
	if b.last.Picker != nil {
		for _, cs := range endpointsharding.ChildStatesFromPicker(b.last.Picker) {
			if e, ok := b.entries.Get(cs.Endpoint); ok {
				conn[e] = cs.State.ConnectivityState
			}
		}
	}
	var es []*entry
	for _, e := range b.entries.All() {
		es = append(es, e)
	}
	slices.SortFunc(es, func(x, y *entry) int { return x.order - y.order })
	for _, e := range es {
		st := e.out.State(now)
		c, ok := conn[e]
		if !ok {
			c = connectivity.Idle
		}
		s.Endpoints = append(s.Endpoints, EndpointState{Addresses: slices.Clone(e.addrs), Connectivity: c,
			EjectedUntil: st.EjectedUntil, Ejections: st.Ejections, ConsecutiveFailures: st.ConsecutiveFailures,
			Calls: st.Calls, Failures: st.Failures})
	}
	return s
}

// String prints the snapshot as a few lines of text, times relative to
// now as the snapshot was taken.
func (s Snapshot) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s (%s, %s): %d ejections, %d refused by maxEjectionPercent, %d attempts sent elsewhere\n",
		s.Target, Name, s.ChildPolicy, s.Ejections, s.Overflow, s.AttemptsAvoided)
	for _, e := range s.Endpoints {
		state := "in rotation"
		if !e.EjectedUntil.IsZero() {
			state = "ejected until " + e.EjectedUntil.Format(time.RFC3339Nano)
		}
		fmt.Fprintf(&sb, "  %-24s %-17s %s; %d ejections, %d failures in a row, %d/%d failed in the window\n",
			strings.Join(e.Addresses, ","), e.Connectivity, state, e.Ejections, e.ConsecutiveFailures, e.Failures, e.Calls)
	}
	return sb.String()
}
