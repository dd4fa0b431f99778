package interceptor

import (
	"sync"

	"google.golang.org/grpc/resolver"
	grpcsc "google.golang.org/grpc/serviceconfig"

	"github.com/grpc-resilience/resilience/serviceconfig"
)

// WrapResolver returns a resolver builder for grpc.WithResolvers that
// builds b's resolvers and passes every service config they deliver to
// the client, so that a config shipped by the platform (DNS TXT records,
// a control plane's resolver) drives the client's retries, hedging,
// breakers and bulkheads. b nil means grpc's dns resolver, grpc.NewClient's
// default. Install it beside the client's dial options:
//
//	conn, err := grpc.NewClient("dns:///orders.internal:443",
//		append(c.DialOptions(), grpc.WithResolvers(c.WrapResolver(nil)))...)
//
// Without it the client never sees the resolver's config: DialOptions
// turns grpc's own retry off, and with it the retryPolicy the resolver
// delivered.
//
// Which config wins: the resolver's, when it delivers one, replaces the
// client's config as a whole, as UpdateServiceConfig does, and as grpc-go
// lets a resolver's config replace WithDefaultServiceConfig. The config
// given to NewClient (WithServiceConfig, WithMethodConfig,
// WithRetryPolicy) is the default: it applies until the resolver delivers
// a config, and again when the resolver delivers none, or one with none
// of methodConfig, retryThrottling and retryBudget (only a load-balancing
// config, say). Per-call options (MaxAttempts, NoRetry) apply on top of
// either. A config grpc-go refuses is kept out as grpc-go keeps it out (the
// previous one stays); one that grpc-go accepts but serviceconfig.Parse
// refuses (a bad extension block) leaves the client's config as it was, as
// does an update that refuses it, and the reason is logged to grpclog's
// "resilience" component, with the document's warnings. A config equal to
// the one in force is not applied again, so breakers keep their state
// across the resolver's periodic re-resolutions.
//
// The config belongs to the Client, not to a connection: a Client
// installed on connections to several targets takes the config of the
// last resolver to deliver one. Use one Client per target whose resolver
// delivers configs.
//
// xDS: grpc-go's xds resolver delivers a service config whose only content
// is loadBalancingConfig (the cluster manager); a route's retry policy and
// max stream duration reach grpc through its config selector, per call,
// not through that document. The client sees neither, and DialOptions'
// grpc.WithDisableRetry turns the route's retry policy off: with xDS, give
// the client its policies in code or in a document of your own, or leave
// this client's retries out and let xDS drive grpc's.
func (c *Client) WrapResolver(b resolver.Builder) resolver.Builder {
	if b == nil {
		b = resolver.Get("dns")
	}
	return &configResolver{Builder: b, c: c}
}

// configResolver builds its builder's resolvers with a configConn between
// each resolver and grpc.
type configResolver struct {
	resolver.Builder
	c *Client
}

func (r *configResolver) Build(target resolver.Target, cc resolver.ClientConn, opts resolver.BuildOptions) (resolver.Resolver, error) {
	return r.Builder.Build(target, &configConn{ClientConn: cc, c: r.c}, opts)
}

// configConn is what a resolver sees as its grpc.ClientConn: it parses each
// service config the resolver parses, and when the resolver delivers one in
// UpdateState, applies it to the Client before grpc sees the update.
type configConn struct {
	resolver.ClientConn
	c *Client

	mu      sync.Mutex // serializes the resolver's calls into the client
	parsed  [4]parsed  // the latest parses, newest at next-1; guarded by mu
	next    int        // guarded by mu
	applied string     // the JSON in force from this resolver, "" for none; guarded by mu
}

// parsed is one service config the resolver parsed: grpc's result, which
// it hands back in UpdateState, and ours.
type parsed struct {
	grpc *grpcsc.ParseResult
	json string
	cfg  *serviceconfig.Config
	err  error
}

// ParseServiceConfig parses js for grpc, as the connection would, and for
// the client, and remembers both.
func (cc *configConn) ParseServiceConfig(js string) *grpcsc.ParseResult {
	pr := cc.ClientConn.ParseServiceConfig(js)
	cfg, err := serviceconfig.Parse([]byte(js), serviceconfig.WithMaxAttemptsCap(cc.c.opts.maxAttemptsCap))
	cc.mu.Lock()
	cc.parsed[cc.next%len(cc.parsed)] = parsed{grpc: pr, json: js, cfg: cfg, err: err}
	cc.next++
	cc.mu.Unlock()
	return pr
}

// UpdateState applies the state's service config to the client, then
// hands the state to grpc.
func (cc *configConn) UpdateState(s resolver.State) error {
	cc.mu.Lock()
	cc.apply(s.ServiceConfig)
	cc.mu.Unlock()
	return cc.ClientConn.UpdateState(s)
}

// apply makes the client's config follow sc, the resolver's latest; see
// WrapResolver for the rules. Called with mu held.
func (cc *configConn) apply(sc *grpcsc.ParseResult) {
	if sc != nil && sc.Err != nil {
		return // grpc keeps its previous config, and so do we
	}
	var p *parsed
	for i := range cc.parsed {
		if sc != nil && cc.parsed[i].grpc == sc {
			p = &cc.parsed[i]
		}
	}
	switch {
	case sc != nil && p == nil:
		clientLog.Warning("interceptor: the resolver delivered a service config it did not parse through this connection; the client's config is left as it is")
		return
	case p != nil && p.err != nil:
		clientLog.Warningf("interceptor: the resolver's service config is refused, the client's config is left as it is: %v", p.err)
		return
	case p == nil || !forClient(p.cfg):
		if cc.applied != "" {
			if err := cc.c.restore(); err != nil {
				clientLog.Warningf("interceptor: restoring the client's own config: %v", err)
				return
			}
			cc.applied = ""
		}
		return
	case p.json == cc.applied:
		return
	}
	for _, w := range p.cfg.Warnings() {
		clientLog.Warningf("interceptor: the resolver's service config: %v", w)
	}
	if err := cc.c.UpdateServiceConfig(p.cfg); err != nil {
		clientLog.Warningf("interceptor: the resolver's service config is refused, the client's config is left as it is: %v", err)
		return
	}
	cc.applied = p.json
}

// forClient reports whether cfg holds anything the client runs.
func forClient(cfg *serviceconfig.Config) bool {
	return len(cfg.MethodConfig) > 0 || cfg.RetryThrottling != nil || cfg.RetryBudget != nil
}

// restore makes the config given to NewClient the client's config again.
func (c *Client) restore() error {
	cfg := c.opts.config
	return c.update(&cfg, c.opts.parsedCap)
}
