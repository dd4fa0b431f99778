package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
)

// View is the admin view of one process: the Clients and Servers registered
// with it by name, the channels of the resilience_endpoint policy, and the
// log of their recent events. Register serves it over gRPC, Handler over
// HTTP. A View is safe for concurrent use.
type View struct {
	opts   options
	events *eventLog
	eps    *endpointWatch

	mu      sync.RWMutex
	clients map[string]*ClientSource
	servers map[string]*ServerSource
}

// Option configures a View (New).
type Option interface{ apply(*options) }

type optionFunc func(*options)

func (f optionFunc) apply(o *options) { f(o) }

type options struct {
	now       func() time.Time
	logger    *slog.Logger
	authorize Authorizer
	endpoints bool
	errs      []error
}

// Authorizer decides whether a write action may run: nil allows it, an
// error refuses it (its text is returned to the caller and logged). It
// runs on the request's goroutine; for a gRPC call ctx is the call's (its
// peer and metadata say who asks), for HTTP, w.HTTP is the request.
type Authorizer func(ctx context.Context, w Write) error

// Write is a write action asked of the view, for an Authorizer.
type Write struct {
	// Action is "force_open", "force_closed" or "reset".
	Action string
	// Client is the name of the Client, FullMethod the method whose
	// breaker the action is for.
	Client, FullMethod string
	// HTTP is the request, when the action came over HTTP; nil over gRPC.
	HTTP *http.Request
}

// WithWrites turns the write actions on (ForceOpen, ForceClosed and
// ResetBreaker of a Client's method), each allowed only when authorize
// returns nil. Without this option every write is refused
// (PERMISSION_DENIED over gRPC, 403 over HTTP): the view is read-only by
// default. Every write asked, allowed or refused, is logged (WithLogger)
// and recorded as an event.
func WithWrites(authorize Authorizer) Option {
	return optionFunc(func(o *options) {
		if authorize == nil {
			o.errs = append(o.errs, errors.New("admin: WithWrites: nil Authorizer"))
			return
		}
		o.authorize = authorize
	})
}

// WithLogger sets the logger of the write actions; by default
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(o *options) {
		if l == nil {
			o.errs = append(o.errs, errors.New("admin: WithLogger: nil logger"))
			return
		}
		o.logger = l
	})
}

// WithNow sets the clock of the view's timestamps and of its episodes of
// refusals; by default the wall clock (read as time.Now reads it, at most
// once a second, and on the monotonic clock in between). For tests.
func WithNow(now func() time.Time) Option {
	return optionFunc(func(o *options) {
		if now == nil {
			o.errs = append(o.errs, errors.New("admin: WithNow: nil function"))
			return
		}
		o.now = now
	})
}

// WithoutEndpoints leaves the resilience_endpoint policy's channels out of
// the view. They are in by default: the policy's state is process-wide
// (endpoint.Snapshots), and the view shows every channel that uses it.
func WithoutEndpoints() Option {
	return optionFunc(func(o *options) { o.endpoints = false })
}

// New returns an empty View configured by opts.
func New(opts ...Option) (*View, error) {
	o := options{now: (&anchoredClock{}).now, endpoints: true}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("admin: New: nil Option")
		}
		opt.apply(&o)
	}
	if err := errors.Join(o.errs...); err != nil {
		return nil, err
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	v := &View{opts: o, events: newEventLog(o.now), clients: map[string]*ClientSource{}, servers: map[string]*ServerSource{}}
	v.eps = newEndpointWatch(v.events)
	return v, nil
}

// checkName refuses an empty name, one with control characters, or one
// longer than maxText.
func checkName(kind, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("admin: %s: empty name", kind)
	case len(name) > maxText:
		return fmt.Errorf("admin: %s(%.20q…): name longer than %d bytes", kind, name, maxText)
	case strings.ContainsFunc(name, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return fmt.Errorf("admin: %s(%q): name has a control character", kind, name)
	}
	return nil
}

// Client registers a Client under name and returns its source: give the
// source's Options (or call its hooks from yours) to interceptor.NewClient,
// then Attach the Client. A name is taken once per View among Clients;
// Close the source to free it.
func (v *View) Client(name string) (*ClientSource, error) {
	if err := checkName("Client", name); err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.clients[name]; ok {
		return nil, fmt.Errorf("admin: Client(%q): a Client of that name is registered already", name)
	}
	s := &ClientSource{v: v, name: name, fails: newFailures()}
	v.clients[name] = s
	return s, nil
}

// Server registers a Server under name and returns its source: give the
// source's Options to server.New, then Attach the Server. A name is taken
// once per View among Servers; Close the source to free it.
func (v *View) Server(name string) (*ServerSource, error) {
	if err := checkName("Server", name); err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.servers[name]; ok {
		return nil, fmt.Errorf("admin: Server(%q): a Server of that name is registered already", name)
	}
	s := &ServerSource{v: v, name: name}
	v.servers[name] = s
	return s, nil
}

// sources returns the registered sources, by name.
func (v *View) sources() ([]*ClientSource, []*ServerSource) {
	v.mu.RLock()
	cs := make([]*ClientSource, 0, len(v.clients))
	for _, c := range v.clients {
		cs = append(cs, c)
	}
	ss := make([]*ServerSource, 0, len(v.servers))
	for _, s := range v.servers {
		ss = append(ss, s)
	}
	v.mu.RUnlock()
	slices.SortFunc(cs, func(a, b *ClientSource) int { return strings.Compare(a.name, b.name) })
	slices.SortFunc(ss, func(a, b *ServerSource) int { return strings.Compare(a.name, b.name) })
	return cs, ss
}

func (v *View) client(name string) *ClientSource {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.clients[name]
}

// Snapshot returns the view now: every registered part's state, read when
// asked (nothing is kept up to date on the call path), and the parts
// refusing calls now.
func (v *View) Snapshot() *adminv1.View {
	now := v.opts.now()
	out := &adminv1.View{Time: ts(now), WritesAllowed: v.opts.authorize != nil}
	cs, ss := v.sources()
	for _, c := range cs {
		out.Clients = append(out.Clients, c.snapshot(now))
	}
	for _, s := range ss {
		out.Servers = append(out.Servers, s.snapshot(now))
	}
	if v.opts.endpoints {
		out.Channels = v.eps.poll(now)
	}
	out.LastSequence, _ = v.events.position()
	out.Refusing = v.refusing(out, now)
	return out
}

// Events returns the events after sequence after (0: every one kept),
// oldest first, at most max of the newest (0: all of them), and the
// number of events the bounded log has let go.
func (v *View) Events(after uint64, max int) (events []*adminv1.Event, dropped uint64) {
	return v.events.list(after, max)
}

// anchoredClock reads the time as an anchor read with time.Now at most
// anchorFor before, plus the monotonic time since: a refused call stamps
// its refusal with it, and on virtual machines without a fast wall clock
// time.Now was most of what a refusal cost the view. The wall clock's
// adjustments within anchorFor (NTP slews at most 0.5 ms per second) are
// all that it can miss.
type anchoredClock struct{ anchor atomic.Pointer[time.Time] }

// anchorFor is how long an anchor serves.
const anchorFor = time.Second

func (c *anchoredClock) now() time.Time {
	if a := c.anchor.Load(); a != nil {
		if d := time.Since(*a); d < anchorFor {
			return a.Add(d)
		}
	}
	t := time.Now()
	c.anchor.Store(&t)
	return t
}
