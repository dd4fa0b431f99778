package resiliencetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/serviceconfig"
)

// A cluster learns when every backend is READY from the load-balancing
// policy itself: its connection's policy is readyPolicy, a thin parent of
// the policy the test chose (round_robin, resilience_endpoint, ...), which
// sees every SubConn the child creates and every state the child acts on.
// A SubConn counts as READY once the child has handled its READY (the raw
// connectivity state, or the health state when the child registered a
// health listener, as pick_first under round_robin does): grpc's policies
// publish their picker synchronously inside that callback, so when the
// cluster's wait returns, the channel's picker holds every backend. No
// RPC, sleep or poll is involved, and nothing reaches the child's picks or
// the backends that the test did not send.
//
// The parent wraps each SubConn it hands the child, as grpc's own
// outlier-detection policy does, and unwraps the SubConn of every pick.

// readyPolicy is the name under which the parent policy is registered.
const readyPolicy = "resiliencetest_cluster"

func init() { balancer.Register(readyBuilder{}) }

type readyBuilder struct{}

func (readyBuilder) Name() string { return readyPolicy }

func (readyBuilder) Build(cc balancer.ClientConn, opts balancer.BuildOptions) balancer.Balancer {
	b := &readyBalancer{cc: cc, opts: opts}
	b.childCC = &readyCC{ClientConn: cc, b: b}
	return b
}

// readyConfig is the parent's parsed config: the child policy, chosen as
// grpc chooses from a loadBalancingConfig list (the first registered).
type readyConfig struct {
	serviceconfig.LoadBalancingConfig
	child    balancer.Builder
	childCfg serviceconfig.LoadBalancingConfig
}

func (readyBuilder) ParseConfig(js json.RawMessage) (serviceconfig.LoadBalancingConfig, error) {
	var cfg struct {
		ChildPolicy []map[string]json.RawMessage `json:"childPolicy"`
	}
	if err := json.Unmarshal(js, &cfg); err != nil {
		return nil, fmt.Errorf("resiliencetest: %s config: %w", readyPolicy, err)
	}
	var names []string
	for _, entry := range cfg.ChildPolicy {
		if len(entry) != 1 {
			return nil, fmt.Errorf("resiliencetest: a loadBalancingConfig entry has %d keys, want 1", len(entry))
		}
		for name, raw := range entry {
			names = append(names, name)
			b := balancer.Get(name)
			if b == nil {
				continue
			}
			rc := &readyConfig{child: b}
			if p, ok := b.(balancer.ConfigParser); ok {
				c, err := p.ParseConfig(raw)
				if err != nil {
					return nil, err
				}
				rc.childCfg = c
			}
			return rc, nil
		}
	}
	return nil, fmt.Errorf("resiliencetest: no registered load-balancing policy among %q", names)
}

// readyBalancer is the parent policy on one channel. grpc calls its
// methods, and the SubConn listeners, one at a time (its serializer).
type readyBalancer struct {
	cc      balancer.ClientConn // grpc's
	opts    balancer.BuildOptions
	childCC *readyCC // what the child sees
	child   balancer.Balancer
	builder balancer.Builder // the child's
	r       *readiness       // the cluster's, from the resolver's attributes
}

func (b *readyBalancer) UpdateClientConnState(ccs balancer.ClientConnState) error {
	cfg, ok := ccs.BalancerConfig.(*readyConfig)
	if !ok {
		return fmt.Errorf("resiliencetest: %s got config %T", readyPolicy, ccs.BalancerConfig)
	}
	if b.r == nil {
		b.r, _ = ccs.ResolverState.Attributes.Value(readinessKey{}).(*readiness)
		if b.r == nil {
			b.r = newReadiness() // outside a cluster: nobody waits
		}
		b.r.attach(b)
	}
	if b.child != nil && b.builder.Name() != cfg.child.Name() {
		b.child.Close() // shuts its SubConns down, through childCC
		b.child = nil
	}
	if b.child == nil {
		b.builder, b.child = cfg.child, cfg.child.Build(b.childCC, b.opts)
	}
	ccs.BalancerConfig = cfg.childCfg
	err := b.child.UpdateClientConnState(ccs)
	b.r.changed()
	return err
}

func (b *readyBalancer) ResolverError(err error) {
	if b.child != nil {
		b.child.ResolverError(err)
	}
}

// UpdateSubConnState is never called: every SubConn has a StateListener.
func (b *readyBalancer) UpdateSubConnState(balancer.SubConn, balancer.SubConnState) {}

// ExitIdle is called by ClientConn.Connect, after the policy has taken
// the resolver's first state (asynchronously: grpc schedules it). A child
// may publish a new picker (endpointsharding does, at a new place in its
// rotation), so the cluster's first wait includes it.
func (b *readyBalancer) ExitIdle() {
	if b.child != nil {
		b.child.ExitIdle()
	}
	if b.r != nil {
		b.r.update(func() { b.r.exits++ })
	}
}

func (b *readyBalancer) Close() {
	if b.child != nil {
		b.child.Close()
	}
	if b.r != nil {
		b.r.detach(b)
	}
}

// readyCC is the ClientConn the child sees.
type readyCC struct {
	balancer.ClientConn
	b *readyBalancer
}

func (c *readyCC) NewSubConn(addrs []resolver.Address, opts balancer.NewSubConnOptions) (balancer.SubConn, error) {
	s := &readySubConn{r: c.b.r, raw: connectivity.Idle}
	for _, a := range addrs {
		s.addrs = append(s.addrs, a.Addr)
	}
	listener := opts.StateListener
	opts.StateListener = func(st balancer.SubConnState) {
		if listener != nil {
			listener(st)
		}
		s.r.update(func() { s.noteRaw(st) })
	}
	sc, err := c.ClientConn.NewSubConn(addrs, opts)
	if err != nil {
		return nil, err
	}
	s.SubConn = sc
	c.b.r.update(func() { c.b.r.subConns[s] = struct{}{} })
	return s, nil
}

func (c *readyCC) RemoveSubConn(sc balancer.SubConn) { sc.Shutdown() }

func (c *readyCC) UpdateAddresses(sc balancer.SubConn, addrs []resolver.Address) {
	sc.UpdateAddresses(addrs)
}

func (c *readyCC) UpdateState(s balancer.State) {
	if s.Picker != nil {
		s.Picker = readyPicker{s.Picker}
	}
	c.ClientConn.UpdateState(s)
	c.b.r.update(func() { c.b.r.child = s.ConnectivityState })
}

// readyPicker unwraps the SubConn of each pick: grpc takes only its own.
type readyPicker struct{ p balancer.Picker }

func (p readyPicker) Pick(info balancer.PickInfo) (balancer.PickResult, error) {
	res, err := p.p.Pick(info)
	if s, ok := res.SubConn.(*readySubConn); ok {
		res.SubConn = s.SubConn
	}
	return res, err
}

// readySubConn is a SubConn as the child sees it. Its state fields are
// guarded by r.mu.
type readySubConn struct {
	balancer.SubConn // grpc's
	r                *readiness
	addrs            []string

	asked  bool               // the child asked it to connect
	raw    connectivity.State // the latest connectivity state
	err    error              // why it was last in TRANSIENT_FAILURE, since its latest READY
	health error              // why its health was last TRANSIENT_FAILURE, since its latest READY
	gated  bool               // the child registered a health listener since the latest READY
	ready  bool               // the child has handled its READY: its picker may pick it
	shut   bool
}

func (s *readySubConn) Connect() {
	s.r.update(func() { s.asked = true })
	s.SubConn.Connect()
}

func (s *readySubConn) Shutdown() {
	s.r.update(func() {
		s.shut = true
		delete(s.r.subConns, s)
	})
	s.SubConn.Shutdown()
}

func (s *readySubConn) RegisterHealthListener(listener func(balancer.SubConnState)) {
	s.r.update(func() { s.gated = true })
	s.SubConn.RegisterHealthListener(func(st balancer.SubConnState) {
		listener(st)
		s.r.update(func() {
			if s.gated {
				s.ready = st.ConnectivityState == connectivity.Ready
				if s.ready {
					s.health = nil
				}
				if st.ConnectivityState == connectivity.TransientFailure {
					s.health = fmt.Errorf("health check: %v", st.ConnectionError)
				}
			}
		})
	})
}

// noteRaw records a connectivity state after the child handled it.
func (s *readySubConn) noteRaw(st balancer.SubConnState) {
	s.raw = st.ConnectivityState
	switch st.ConnectivityState {
	case connectivity.Ready:
		s.ready = !s.gated // else READY comes from the health listener
		s.err = nil
	case connectivity.Shutdown:
		s.shut, s.ready = true, false
		delete(s.r.subConns, s)
	default:
		s.ready, s.gated = false, false
		if st.ConnectivityState == connectivity.TransientFailure {
			s.err = st.ConnectionError
		}
	}
}

// readinessKey is the resolver attribute that hands a cluster's readiness
// to its connection's parent policy.
type readinessKey struct{}

// readiness is what a cluster's waits read: the SubConns of the current
// parent policy and the child's state. Waiters wait for wake to close;
// every update closes it and makes a new one.
type readiness struct {
	mu       sync.Mutex
	b        *readyBalancer             // the attached policy, nil when none is; guarded by mu
	built    bool                       // a policy attached once; guarded by mu
	subConns map[*readySubConn]struct{} // the live SubConns; guarded by mu
	child    connectivity.State         // the child's latest state; guarded by mu
	exits    int                        // ExitIdle calls handled; guarded by mu
	wake     chan struct{}              // closed at the next update; guarded by mu
}

func newReadiness() *readiness {
	return &readiness{subConns: map[*readySubConn]struct{}{}, child: connectivity.Idle, wake: make(chan struct{})}
}

// Equal lets grpc compare resolver attributes holding a readiness.
func (r *readiness) Equal(o any) bool { return r == o }

// update applies f under the lock and wakes the waiters.
func (r *readiness) update(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
	close(r.wake)
	r.wake = make(chan struct{})
}

func (r *readiness) changed() { r.update(func() {}) }

func (r *readiness) attach(b *readyBalancer) {
	r.update(func() { r.b, r.built = b, true })
}

func (r *readiness) detach(b *readyBalancer) {
	r.update(func() {
		if r.b == b {
			r.b = nil
			clear(r.subConns)
			r.child = connectivity.Idle
		}
	})
}

// attached reports whether a parent policy took this readiness: false when
// the dial options replaced the cluster's service config.
func (r *readiness) attached() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.built
}

// errNotReady is statusLocked's answer while a backend is still connecting.
var errNotReady = errors.New("not ready")

// statusLocked returns nil when every SubConn the child asked to connect is
// READY as the child sees it (at least one), or the child is IDLE (it
// connects when a call comes); errNotReady while one is still on its way;
// and, once each is READY or has failed (TRANSIENT_FAILURE, or a failed
// health check, since its latest READY), the failures, naming each
// address.
func (r *readiness) statusLocked(skip func(addr string) bool) error {
	if r.b == nil {
		return errors.New("the connection's load-balancing policy is closed (the connection closed or went idle)")
	}
	var failed []string
	asked, ready := 0, 0
	for s := range r.subConns {
		if !s.asked || s.shut || slices.ContainsFunc(s.addrs, skip) {
			continue
		}
		asked++
		switch {
		case s.ready:
			ready++
		case s.err != nil:
			failed = append(failed, fmt.Sprintf("%s: %v", strings.Join(s.addrs, ","), s.err))
		case s.health != nil:
			failed = append(failed, fmt.Sprintf("%s: %v", strings.Join(s.addrs, ","), s.health))
		}
	}
	switch {
	case len(failed) > 0 && ready+len(failed) == asked:
		slices.Sort(failed)
		return fmt.Errorf("not READY: %s", strings.Join(failed, "; "))
	case asked > 0 && ready == asked:
		return nil
	case asked == 0 && r.child == connectivity.Idle:
		return nil
	case asked == 0 && r.child == connectivity.TransientFailure:
		return errors.New("the load-balancing policy reports TRANSIENT_FAILURE without a backend it connects to")
	}
	return errNotReady
}

// wait blocks until statusLocked says READY or failed, and the policy
// has handled exits ExitIdle calls, or ctx ends. The SubConns of the
// addresses skip reports are left out.
func (r *readiness) wait(ctx context.Context, exits int, skip func(addr string) bool) error {
	for {
		r.mu.Lock()
		err, wake := r.statusLocked(skip), r.wake
		if err == nil && r.exits < exits {
			err = errNotReady
		}
		r.mu.Unlock()
		if err != errNotReady {
			return err
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}
