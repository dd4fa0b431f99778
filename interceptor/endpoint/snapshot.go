package endpoint

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/connectivity"

	"github.com/grpc-resilience/resilience/internal/outlier"
)

// live holds the policy's instances: one per channel that uses it, from
// grpc's Build to its Close.
var live sync.Map // *lb → struct{}

// Snapshot is the state of the policy on one channel, for an operator.
type Snapshot struct {
	Target      string    // the channel's target
	ChildPolicy string    // round_robin, pick_first or peak_ewma
	At          time.Time // when the snapshot was taken (the now of Snapshots)
	// DecayTime and EndpointConcurrency are peak_ewma's settings in
	// effect, defaults applied; zero under the other children and in an
	// Idle snapshot.
	DecayTime           time.Duration
	EndpointConcurrency int
	// Idle is set for a channel whose policy grpc has closed (the channel
	// went idle, or was closed) while it still held ejections: the policy
	// keeps them for the channel's next policy, for as long as they last
	// (see Snapshots). Its endpoints are IDLE.
	Idle bool
	// Endpoints are the channel's endpoints, in the resolver's order.
	Endpoints []EndpointState
	// Ejections counts ejections; Overflow, ejections detected but refused
	// by maxEjectionPercent; Returns, ejections that ended; AttemptsAvoided,
	// retries and hedged copies sent away from an endpoint their call had
	// used. Since the channel's policy was built (each policy grpc builds
	// for the channel starts them afresh).
	Ejections, Overflow, Returns, AttemptsAvoided uint64
}

// EndpointState is one endpoint's state in a Snapshot.
type EndpointState struct {
	Addresses    []string
	Connectivity connectivity.State
	// EjectedUntil is when its ejection ends, EjectedSince when it began,
	// and Cause why (consecutive_failures, failure_rate, local_origin,
	// probation); zero and "" when in rotation.
	EjectedUntil, EjectedSince time.Time
	Cause                      string
	// Ejections counts its ejections; Multiplier is the last one's
	// multiplier (the k of its length, k × baseEjectionTime).
	Ejections  uint64
	Multiplier int
	// Probation: back from an ejection, no success since; its next failure
	// ejects it again.
	Probation bool
	// ConsecutiveFailures and ConsecutiveLocalFailures are its current
	// runs of failures and of local-origin failures; Calls and Failures
	// are its outcomes in the failure-percentage window.
	ConsecutiveFailures      int
	ConsecutiveLocalFailures int
	Calls, Failures          int
	// Outstanding counts its attempts in flight. Latency is its
	// peak_ewma estimate, decayed to the snapshot's time (zero when not
	// measured: peak_ewma measures it, the other children do not).
	Outstanding int
	Latency     time.Duration
}

// Snapshots returns the state of the policy on every channel that uses it,
// sorted by target, at now. A snapshot survives a configuration change
// (the policy keeps its ejections across one) and an idle channel: while
// grpc has closed a channel's policy and some of its endpoints are still
// ejected (or still carry an ejection multiplier), the channel is listed
// with Idle set while one of them is ejected, and the policy grpc builds
// when the channel wakes takes that state over. A closed channel's
// snapshot goes at once when none of its endpoints is ejected; else it
// stays, as Idle, until they would have returned: grpc closes an idle
// channel's policy as it closes a closed channel's, and tells it neither.
func Snapshots(now time.Time) []Snapshot {
	var out []Snapshot
	live.Range(func(k, _ any) bool {
		out = append(out, k.(*lb).snapshot(now))
		return true
	})
	out = append(out, parkedSnapshots(now)...)
	slices.SortFunc(out, func(a, b Snapshot) int { return strings.Compare(a.Target, b.Target) })
	return out
}

func (b *lb) snapshot(now time.Time) Snapshot {
	b.reportReturns(b.group.Sweep(now))
	cfg := b.cfg.Load()
	b.mu.Lock()
	defer b.mu.Unlock()
	ej, refused := b.group.Ejections()
	var returns uint64
	for r := outlier.Expired; r <= outlier.Shortened; r++ {
		returns += b.group.Returns(r)
	}
	s := Snapshot{Target: b.target, ChildPolicy: cfg.mode.String(), At: now, Ejections: ej, Overflow: refused,
		Returns: returns, AttemptsAvoided: b.avoided.Load()}
	if cfg.mode == p2c {
		s.DecayTime, s.EndpointConcurrency = cfg.decay, cfg.concurrency
	}
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
	t := b.nanotime(now)
	for _, e := range es {
		c, ok := conn[e]
		if !ok {
			c = connectivity.Idle
		}
		es := endpointState(e.addrs, e.out.State(now))
		es.Connectivity = c
		es.Outstanding = int(e.outstanding.Load())
		if cfg.mode == p2c { // the estimate is fed by peak_ewma only: under another child it is a stale one
			es.Latency = e.lat.Estimate(t, cfg.decay)
		}
		s.Endpoints = append(s.Endpoints, es)
	}
	return s
}

func endpointState(addrs []string, st outlier.State) EndpointState {
	es := EndpointState{Addresses: slices.Clone(addrs), Connectivity: connectivity.Idle,
		EjectedUntil: st.EjectedUntil, EjectedSince: st.EjectedSince, Ejections: st.Ejections, Multiplier: st.Multiplier,
		Probation: st.Probation, ConsecutiveFailures: st.ConsecutiveFailures, ConsecutiveLocalFailures: st.ConsecutiveLocalFailures,
		Calls: st.Calls, Failures: st.Failures}
	if st.Cause != outlier.NotEjected {
		es.Cause = st.Cause.String()
	}
	return es
}

// String prints the snapshot as a few lines of text, times relative to
// the snapshot's At ("ejected for 25s more, since 5s, local_origin"):
// what an operator reading it wants to know is how long, not when.
func (s Snapshot) String() string {
	var sb strings.Builder
	idle := ""
	if s.Idle {
		idle = ", idle"
	}
	child := s.ChildPolicy
	if s.EndpointConcurrency > 0 {
		child += fmt.Sprintf(" decayTime %v endpointConcurrency %d", s.DecayTime, s.EndpointConcurrency)
	}
	fmt.Fprintf(&sb, "%s (%s, %s%s): %d ejections, %d refused by maxEjectionPercent, %d returns, %d attempts sent elsewhere\n",
		s.Target, Name, child, idle, s.Ejections, s.Overflow, s.Returns, s.AttemptsAvoided)
	for _, e := range s.Endpoints {
		state := "in rotation"
		switch {
		case !e.EjectedUntil.IsZero():
			state = fmt.Sprintf("ejected for %v more, since %v, %s", roundDuration(e.EjectedUntil.Sub(s.At)),
				roundDuration(s.At.Sub(e.EjectedSince)), e.Cause)
		case e.Probation:
			state = "in rotation, on probation"
		}
		lat := ""
		if e.Latency > 0 {
			lat = fmt.Sprintf(", latency %v", roundDuration(e.Latency))
		}
		fmt.Fprintf(&sb, "  %-24s %-17s %s; %d ejections, %d failures in a row (%d local), %d/%d failed in the window, %d in flight%s\n",
			strings.Join(e.Addresses, ","), e.Connectivity, state, e.Ejections, e.ConsecutiveFailures, e.ConsecutiveLocalFailures,
			e.Failures, e.Calls, e.Outstanding, lat)
	}
	return sb.String()
}

// roundDuration rounds d for reading: to the millisecond under a minute,
// to the second above.
func roundDuration(d time.Duration) time.Duration {
	if d < time.Minute {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Second)
}

// parked holds the ejection state of channels whose policy grpc closed
// while some of their endpoints were ejected, by the channel's channelz
// identity (grpc keeps one per ClientConn across idleness), for the policy
// grpc builds when the channel wakes. At most maxParked channels; each
// entry goes when its state is fresh again (outlier.Saved.Fresh: every
// ejection over and every multiplier decayed, probation included) or a
// policy takes it, so that a closed channel's state goes in time too.
var (
	parkedMu sync.Mutex
	parked   = map[any]*parking{}
)

const maxParked = 1024

// parking is a closed policy's state.
type parking struct {
	target    string
	mode      mode
	cfg       outlier.Config
	endpoints []parkedEndpoint // in the resolver's order
}

type parkedEndpoint struct {
	addrs []string
	name  string
	saved outlier.Saved
}

// fresh reports whether nothing in p outlives now.
func (p *parking) fresh(now time.Time) bool {
	for _, e := range p.endpoints {
		if !e.saved.Fresh(now, p.cfg) {
			return false
		}
	}
	return true
}

// park keeps b's ejection state under its channel's identity, when some of
// it outlives now.
func park(channel any, b *lb) {
	now := time.Now()
	cfg := b.cfg.Load()
	p := &parking{target: b.target, mode: cfg.mode, cfg: b.group.Config()}
	b.mu.Lock()
	var es []*entry
	for _, e := range b.entries.All() {
		es = append(es, e)
	}
	b.mu.Unlock()
	slices.SortFunc(es, func(x, y *entry) int { return x.order - y.order })
	for _, e := range es {
		p.endpoints = append(p.endpoints, parkedEndpoint{addrs: e.addrs, name: e.name, saved: e.out.Save(now)})
	}
	if p.fresh(now) {
		return
	}
	parkedMu.Lock()
	defer parkedMu.Unlock()
	pruneLocked(now)
	if len(parked) >= maxParked {
		return // the oldest states are worth no more than this one: drop it
	}
	parked[channel] = p
}

// unpark takes the state parked for channel, if any.
func unpark(channel any) *parking {
	parkedMu.Lock()
	defer parkedMu.Unlock()
	p := parked[channel]
	delete(parked, channel)
	if p != nil && p.fresh(time.Now()) {
		return nil
	}
	return p
}

// pruneLocked drops the parked states that are fresh at now.
func pruneLocked(now time.Time) {
	for k, p := range parked {
		if p.fresh(now) {
			delete(parked, k)
		}
	}
}

func parkedSnapshots(now time.Time) []Snapshot {
	parkedMu.Lock()
	defer parkedMu.Unlock()
	pruneLocked(now)
	var out []Snapshot
	for _, p := range parked {
		s := Snapshot{Target: p.target, ChildPolicy: p.mode.String(), At: now, Idle: true}
		ejected := false
		for _, e := range p.endpoints {
			st := outlier.State{Ejections: e.saved.Count, Multiplier: e.saved.Multiplier, Probation: e.saved.Probation}
			if now.Before(e.saved.Until) {
				st.EjectedUntil, st.EjectedSince, st.Cause = e.saved.Until, e.saved.Since, e.saved.Cause
				ejected = true
			}
			s.Endpoints = append(s.Endpoints, endpointState(e.addrs, st))
		}
		if ejected { // a multiplier alone is kept for the next policy, not listed
			out = append(out, s)
		}
	}
	return out
}

// adopt takes over a parked state: each endpoint the resolver lists again
// starts with its saved ejection state (see newEntryLocked).
func (b *lb) adopt(p *parking) {
	if p == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.restore = map[string]outlier.Saved{}
	for _, e := range p.endpoints {
		b.restore[e.name] = e.saved
	}
}
