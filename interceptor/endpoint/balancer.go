package endpoint

import (
	"encoding/json"
	"slices"
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

	"github.com/grpc-resilience/resilience/internal/outlier"
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
	b := &lb{cc: cc, target: opts.Target.String(), recorder: cc.MetricsRecorder(), entries: resolver.NewEndpointMap[*entry]()}
	b.setConfigLocked(newConfig(&serviceconfig.EndpointPolicy{}))
	b.child = endpointsharding.NewBalancer(&childCC{ClientConn: cc, b: b}, opts, balancer.Get(pickfirst.Name).Build, endpointsharding.Options{})
	if b.recorder != nil {
		b.unregister = b.recorder.RegisterAsyncReporter(estats.AsyncMetricReporterFunc(b.report), ejectedEndpoints)
	}
	live.Store(b, struct{}{})
	return b
}

// lb is the policy on one channel: grpc's endpointsharding, with a
// pick_first child per endpoint, under a picker of its own that chooses
// the endpoint.
type lb struct {
	cc         balancer.ClientConn
	child      balancer.Balancer // endpointsharding
	target     string
	recorder   estats.MetricsRecorder // nil in tests that build it bare
	unregister func()

	cfg atomic.Pointer[lbConfig] // read by Done callbacks
	// current is group, for the Done callbacks, which take no lock.
	current atomic.Pointer[outlier.Group]

	mu      sync.Mutex // guards what follows
	group   *outlier.Group
	entries *resolver.EndpointMap[*entry]
	last    balancer.State // endpointsharding's latest
	closed  bool

	avoided  atomic.Uint64 // picks that passed over an endpoint the call had used
	overflow atomic.Uint64 // refusals seen by the Done callbacks (see entry.done)
}

// setConfigLocked installs cfg; an ejection configuration that changed
// starts every endpoint afresh in a new group.
func (b *lb) setConfigLocked(cfg *lbConfig) {
	old := b.cfg.Load()
	b.cfg.Store(cfg)
	if old != nil && old.outlier == cfg.outlier {
		return
	}
	g, err := outlier.New(cfg.outlier)
	if err != nil { // cannot happen: parseConfig validated it
		g, _ = outlier.New(newConfig(&serviceconfig.EndpointPolicy{}).outlier)
	}
	b.group = g
	b.current.Store(g)
	b.overflow.Store(0)
	fresh := resolver.NewEndpointMap[*entry]()
	for ep, e := range b.entries.All() {
		fresh.Set(ep, b.newEntry(e.order, e.addrs))
	}
	b.entries = fresh
}

func (b *lb) UpdateClientConnState(ccs balancer.ClientConnState) error {
	cfg, _ := ccs.BalancerConfig.(*lbConfig)
	b.mu.Lock()
	if cfg != nil {
		b.setConfigLocked(cfg)
	}
	fresh := resolver.NewEndpointMap[*entry]()
	for i, ep := range ccs.ResolverState.Endpoints {
		e, ok := b.entries.Get(ep)
		if !ok {
			addrs := make([]string, len(ep.Addresses))
			for j, a := range ep.Addresses {
				addrs[j] = a.Addr
			}
			e = b.newEntry(i, addrs)
		}
		e.order = i
		fresh.Set(ep, e)
	}
	for ep, e := range b.entries.All() {
		if _, ok := fresh.Get(ep); !ok {
			b.group.Remove(e.out)
		}
	}
	b.entries = fresh
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
	live.Delete(b)
}

// childCC is the ClientConn endpointsharding sees: its state updates come
// to the policy, which puts its own picker in front.
type childCC struct {
	balancer.ClientConn
	b *lb
}

func (c *childCC) UpdateState(s balancer.State) {
	b := c.b
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.last = s
	p := b.pickerLocked(s)
	b.mu.Unlock()
	// endpointsharding sends its updates one at a time, so pickers reach
	// grpc in order.
	b.cc.UpdateState(balancer.State{ConnectivityState: s.ConnectivityState, Picker: p})
}

// pickerLocked returns the picker over the READY endpoints of s.
func (b *lb) pickerLocked(s balancer.State) balancer.Picker {
	cfg := b.cfg.Load()
	p := &picker{b: b, fallback: s.Picker, ordered: cfg.ordered}
	for _, cs := range endpointsharding.ChildStatesFromPicker(s.Picker) {
		if cs.State.ConnectivityState != connectivity.Ready {
			continue
		}
		if e, ok := b.entries.Get(cs.Endpoint); ok {
			p.ready = append(p.ready, choice{e: e, picker: cs.State.Picker})
		}
	}
	if cfg.ordered {
		slices.SortFunc(p.ready, func(x, y choice) int { return x.e.order - y.e.order })
	}
	return p
}

// nextID numbers endpoints for the calls' trails, from 1.
var nextID atomic.Uint64

// entry is one endpoint of the channel. Its fields are set before it is
// shared and never written after, except order (under lb.mu).
type entry struct {
	id    uint64
	addrs []string
	order int            // its index in the resolver's list
	g     *outlier.Group // the group of out
	out   *outlier.Endpoint
	b     *lb
	// done is e.record, as a func value made once: a pick on the success
	// path allocates nothing for it.
	done func(balancer.DoneInfo)
}

func (b *lb) newEntry(order int, addrs []string) *entry {
	e := &entry{id: nextID.Add(1), addrs: addrs, order: order, g: b.group, out: b.group.Add(), b: b}
	e.done = e.record
	return e
}

// record counts the outcome of an attempt sent to e, when it ends.
func (e *entry) record(di balancer.DoneInfo) {
	b := e.b
	o := outcome(di.Err, di.Trailer, di.BytesReceived, b.cfg.Load().failures)
	if o != outlier.Success && o != outlier.Failure {
		return
	}
	if e.out.Record(time.Now(), o) {
		b.count(ejectionsEnforced)
		return
	}
	if o == outlier.Failure {
		b.noteOverflow(e.g)
	}
}

// noteOverflow records, once each, the refusals of g's bound (g is the
// current group, or one a new configuration replaced, whose refusals are
// then dropped).
func (b *lb) noteOverflow(g *outlier.Group) {
	if g != b.current.Load() {
		return
	}
	_, refused := g.Ejections()
	for {
		seen := b.overflow.Load()
		if refused <= seen {
			return
		}
		if b.overflow.CompareAndSwap(seen, refused) {
			for range refused - seen {
				b.count(ejectionsOverflow)
			}
			return
		}
	}
}
