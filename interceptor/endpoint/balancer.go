package endpoint

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/balancer/endpointsharding"
	"google.golang.org/grpc/balancer/pickfirst"
	"google.golang.org/grpc/connectivity"
	estats "google.golang.org/grpc/experimental/stats"
	"google.golang.org/grpc/resolver"
	grpcsc "google.golang.org/grpc/serviceconfig"

	"github.com/grpc-resilience/resilience/interceptor/internal/trail"
	"github.com/grpc-resilience/resilience/internal/outlier"
	"github.com/grpc-resilience/resilience/internal/peakewma"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// Name is the policy's name in a service config's loadBalancingConfig.
const Name = serviceconfig.EndpointPolicyName

func init() {
	balancer.Register(builder{})
}

type builder struct{}

var (
	_ balancer.Builder      = builder{}
	_ balancer.ConfigParser = builder{}
	_ balancer.Balancer     = (*lb)(nil)
	_ balancer.ExitIdler    = (*lb)(nil)
)

func (builder) Name() string { return Name }

func (builder) ParseConfig(js json.RawMessage) (grpcsc.LoadBalancingConfig, error) {
	return parseConfig(js)
}

func (builder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := newLB(opts.Target.String(), cc.MetricsRecorder())
	b.cc, b.channel = cc, opts.ChannelzParent
	b.child = endpointsharding.NewBalancer(&childCC{ClientConn: cc, b: b}, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	if b.recorder != nil {
		b.unregister = b.recorder.RegisterAsyncReporter(estats.AsyncMetricReporterFunc(b.report), ejectedEndpoints)
	}
	// The Client's calls on this channel carry trails while the policy
	// lives. cc.Target is grpc.ClientConn.Target, the string the Client sees
	// per call without allocating; BuildOptions.Target.String() (what grpc
	// recommends over the deprecated method) is the parsed form, which can
	// differ ("localhost:1234" against "passthrough:///localhost:1234").
	b.unwant = trail.Want(cc.Target())
	if b.channel != nil {
		b.adopt(unpark(b.channel))
	}
	live.Store(b, struct{}{})
	return b
}

// newLB returns the policy's state with the default configuration, before
// grpc gives it one; recorder may be nil.
func newLB(target string, recorder estats.MetricsRecorder) *lb {
	b := &lb{target: target, targetLabel: []string{target}, recorder: recorder, epoch: time.Now(), entries: resolver.NewEndpointMap[*entry](),
		byOut: map[*outlier.Endpoint]*entry{}, labels: map[string]struct{}{}, rand: rand.Uint64}
	cfg := newConfig(&serviceconfig.EndpointPolicy{})
	b.cfg.Store(cfg)
	b.group, _ = outlier.New(cfg.outlier) // valid: the defaults
	return b
}

// lb is the policy on one channel: grpc's endpointsharding, with a
// pick_first child per endpoint, under a picker of its own that chooses
// the endpoint.
type lb struct {
	cc          balancer.ClientConn
	child       balancer.Balancer // endpointsharding
	target      string
	targetLabel []string               // {target}, for the pick path's metric
	channel     any                    // the channel's channelz identity, stable across idleness; nil in tests
	recorder    estats.MetricsRecorder // nil in tests that build it bare
	unregister  func()
	unwant      func() // ends trail.Want; nil in tests that build it bare
	// rand draws the peak_ewma picker's candidates: math/rand/v2's, which
	// takes no lock; a test's seeded source.
	rand func() uint64
	// epoch is the origin of peak_ewma's instants (nanotime).
	epoch time.Time

	cfg atomic.Pointer[lbConfig] // read by pickers and Done callbacks
	// group is the channel's ejection state, for the channel's life: a new
	// configuration changes it in place (outlier.Group.SetConfig).
	group *outlier.Group

	mu      sync.Mutex // guards what follows
	entries *resolver.EndpointMap[*entry]
	byOut   map[*outlier.Endpoint]*entry // every entry, by its ejection state
	last    balancer.State               // endpointsharding's latest
	closed  bool
	// labels are the endpoint metric labels given out, at most maxLabels.
	labels map[string]struct{}
	// restore is the state a closed policy of the channel left (see
	// adopt), by endpoint name, until the resolver lists the endpoint.
	restore map[string]outlier.Saved

	avoided atomic.Uint64 // picks that passed over an endpoint the call had used
}

// setConfig installs cfg, keeping every endpoint's ejection state where
// the new configuration allows (outlier.Group.SetConfig).
func (b *lb) setConfig(cfg *lbConfig) {
	old := b.cfg.Swap(cfg)
	if old.outlier == cfg.outlier {
		return
	}
	returned, err := b.group.SetConfig(cfg.outlier, time.Now())
	if err != nil { // cannot happen: parseConfig validated it
		return
	}
	b.reportReturns(returned)
}

func (b *lb) UpdateClientConnState(ccs balancer.ClientConnState) error {
	if cfg, _ := ccs.BalancerConfig.(*lbConfig); cfg != nil {
		b.setConfig(cfg)
	}
	b.mu.Lock()
	restored := false
	fresh := resolver.NewEndpointMap[*entry]()
	for i, ep := range ccs.ResolverState.Endpoints {
		if _, dup := fresh.Get(ep); dup {
			continue // listed twice: one endpoint (endpointsharding keeps the first too)
		}
		e, ok := b.entries.Get(ep)
		if !ok {
			var r bool
			e, r = b.newEntryLocked(ep)
			restored = restored || r
		}
		e.order = i
		fresh.Set(ep, e)
	}
	var gone []*entry
	for ep, e := range b.entries.All() {
		if _, ok := fresh.Get(ep); !ok {
			gone = append(gone, e)
		}
	}
	b.entries = fresh
	b.restore = nil // what the resolver no longer lists is not carried on
	b.mu.Unlock()
	now := time.Now()
	if restored {
		b.reportReturns(b.group.Enforce(now))
	}
	for _, e := range gone {
		// The endpoints left may now hold more than the bound allows: the
		// longest-ejected return.
		b.reportReturns(b.group.Remove(e.out, now))
	}
	b.mu.Lock()
	for _, e := range gone {
		delete(b.byOut, e.out)
	}
	b.mu.Unlock()
	// The children get no config of ours, as round_robin gives its own.
	return b.child.UpdateClientConnState(balancer.ClientConnState{
		ResolverState: pickfirst.EnableHealthListener(ccs.ResolverState),
	})
}

func (b *lb) ResolverError(err error) { b.child.ResolverError(err) }

func (b *lb) UpdateSubConnState(sc balancer.SubConn, s balancer.SubConnState) {
	b.child.UpdateSubConnState(sc, s)
}

func (b *lb) ExitIdle() {
	if ei, ok := b.child.(balancer.ExitIdler); ok {
		ei.ExitIdle()
	}
}

func (b *lb) Close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.child.Close()
	if b.unregister != nil {
		b.unregister()
	}
	if b.unwant != nil {
		b.unwant()
	}
	live.Delete(b)
	if b.channel != nil {
		park(b.channel, b)
	}
}

// childCC is the ClientConn endpointsharding sees: its state updates come
// to the policy, which puts its own picker in front.
type childCC struct {
	balancer.ClientConn
	b *lb
}

func (c *childCC) UpdateState(s balancer.State) {
	b := c.b
	now := time.Now()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.last = s
	back := b.noteConnectivityLocked(s)
	p := b.pickerLocked(s)
	b.mu.Unlock()
	// endpointsharding sends its updates one at a time, so pickers reach
	// grpc in order.
	b.cc.UpdateState(balancer.State{ConnectivityState: s.ConnectivityState, Picker: p})
	for _, e := range back {
		if ch := e.out.Reconnected(now); ch != (outlier.Change{}) {
			b.reportChange(e, ch)
		}
	}
	b.reportReturns(b.group.Sweep(now))
}

// noteConnectivityLocked records each endpoint's connectivity in s and
// returns the endpoints READY again after another state: a new connection,
// whose attempts' local-origin failures are no longer the old one's.
func (b *lb) noteConnectivityLocked(s balancer.State) []*entry {
	var back []*entry
	for _, cs := range endpointsharding.ChildStatesFromPicker(s.Picker) {
		e, ok := b.entries.Get(cs.Endpoint)
		if !ok {
			continue
		}
		ready := cs.State.ConnectivityState == connectivity.Ready
		if ready && !e.ready {
			e.gen.Add(1)
			if e.wasReady {
				back = append(back, e)
			}
			e.wasReady = true
		}
		e.ready = ready
	}
	return back
}

// pickerLocked returns the picker over the READY endpoints of s.
func (b *lb) pickerLocked(s balancer.State) balancer.Picker {
	cfg := b.cfg.Load()
	p := newPicker(b, cfg, s.Picker)
	for _, cs := range endpointsharding.ChildStatesFromPicker(s.Picker) {
		if cs.State.ConnectivityState != connectivity.Ready {
			continue
		}
		if e, ok := b.entries.Get(cs.Endpoint); ok {
			p.ready = append(p.ready, choice{e: e, picker: cs.State.Picker})
		}
	}
	if cfg.mode == ordered {
		slices.SortFunc(p.ready, func(x, y choice) int { return x.e.order - y.e.order })
	}
	return p
}

// nextID numbers endpoints for the calls' trails, from 1.
var nextID atomic.Uint64

// maxLabels bounds the distinct values of a channel's endpoint metric
// label over its life; past it, new endpoints are labelled "other".
const maxLabels = 100

// entry is one endpoint of the channel. Its fields are set before it is
// shared and never written after, except where noted.
type entry struct {
	id    uint64
	addrs []string
	name  string // addrs joined by ",", for logs
	label string // the endpoint metric label: name, or "other" past maxLabels
	order int    // its index in the resolver's list; under lb.mu
	out   *outlier.Endpoint
	b     *lb

	ready    bool // under lb.mu: READY in the last state seen
	wasReady bool // under lb.mu: has been READY
	// gen counts the endpoint's connections (READY after another state).
	// A local-origin failure of an attempt picked on an earlier connection
	// says nothing of the new one and is dropped.
	gen atomic.Uint32
	// outstanding counts attempts picked and not yet done.
	outstanding atomic.Int32
	// lat is the latency estimate (peak_ewma; kept in every mode, fed only
	// in it).
	lat peakewma.Estimator
}

// newEntryLocked returns a new entry for ep, with the state a closed
// policy of the channel left for it if any (restored).
func (b *lb) newEntryLocked(ep resolver.Endpoint) (e *entry, restored bool) {
	addrs := make([]string, len(ep.Addresses))
	for j, a := range ep.Addresses {
		addrs[j] = a.Addr
	}
	e = &entry{id: nextID.Add(1), addrs: addrs, name: strings.Join(addrs, ","), b: b}
	if saved, ok := b.restore[e.name]; ok {
		e.out, restored = b.group.AddSaved(saved), true
		delete(b.restore, e.name)
	} else {
		e.out = b.group.Add()
	}
	e.label = e.name
	if _, ok := b.labels[e.name]; !ok {
		if len(b.labels) >= maxLabels {
			e.label = "other"
		} else {
			b.labels[e.name] = struct{}{}
		}
	}
	b.byOut[e.out] = e
	return e, restored
}
