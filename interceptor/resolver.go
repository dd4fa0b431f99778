package interceptor

import (
	"fmt"
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
// Which config wins follows grpc-go's own rule for a channel's config
// (ClientConn.updateResolverStateAndUnlock and
// maybeApplyDefaultServiceConfig in grpc's clientconn.go): the config given
// to NewClient (WithServiceConfig, WithMethodConfig, WithRetryPolicy) is
// the default, as grpc.WithDefaultServiceConfig is grpc's; it applies until
// the resolver delivers a config. A config the resolver delivers replaces
// the client's config as a whole, as UpdateServiceConfig does, even one
// with nothing for the client (only a loadBalancingConfig: the client then
// runs no method config, as grpc runs no retry policy). The last config the
// resolver delivered stays until it delivers another: an update with no
// service config (grpc's DNS resolver sends addresses alone when its TXT
// lookup fails or finds nothing), a resolver error, and a config grpc
// refuses (ServiceConfig.Err) all keep it, as grpc keeps its own. Per-call
// options (MaxAttempts, NoRetry) apply on top of either. A config that
// grpc-go accepts but serviceconfig.Parse refuses (a bad extension block)
// leaves the client's config as it was, as does an update that refuses
// it, and the reason is logged. The config is read as grpc-go reads it
// (serviceconfig.Lenient), since grpc-go applies it anyway: a typo that
// changes which methods a policy covers, a method the program's generated
// code lacks, a hedging policy on a stream are applied as grpc-go would
// apply them, where NewClient and UpdateServiceConfig refuse them, and
// logged. Logs go to WithLogger's logger (slog.Default()
// without it), each text once per Client, however often the resolver
// delivers it, and after the wrapper's lock is released (a logger is the
// user's code, and may call back into the client). A config equal to the
// last one the resolver delivered is not applied again, so breakers keep
// their state across the resolver's periodic re-resolutions, and across
// the resolvers grpc builds anew when the connection leaves idle (the
// builder WrapResolver returns remembers that config, so give each
// connection its own); and a config given since by UpdateServiceConfig
// stays in force until the resolver delivers a different one.
// A config delivered after the resolver was closed, or with
// grpc.WithDisableServiceConfig, is ignored, as grpc ignores it.
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
// each resolver and grpc. It keeps what the resolvers delivered, not the
// resolver: grpc closes a channel's resolver when the channel goes idle and
// builds another when it leaves idle, and the config in force from the
// resolver, and the configs parsed for it, carry over.
type configResolver struct {
	resolver.Builder
	c *Client

	mu      sync.Mutex // serializes the resolvers' calls into the client
	parsed  [4]parsed  // the latest parses, newest at next-1; guarded by mu
	next    int        // guarded by mu
	applied string     // the JSON in force from the resolver, "" before it delivered one; guarded by mu
}

// Build builds the wrapped builder's resolver. With
// grpc.WithDisableServiceConfig grpc ignores the configs a resolver
// delivers, and so does the client: the resolver is not wrapped.
func (r *configResolver) Build(target resolver.Target, cc resolver.ClientConn, opts resolver.BuildOptions) (resolver.Resolver, error) {
	if opts.DisableServiceConfig {
		return r.Builder.Build(target, cc, opts)
	}
	conn := &configConn{ClientConn: cc, r: r}
	res, err := r.Builder.Build(target, conn, opts)
	if err != nil {
		return nil, err
	}
	return &closingResolver{Resolver: res, conn: conn}, nil
}

// closingResolver is a built resolver that, on Close, stops its configConn
// from applying what the resolver still delivers: grpc ignores a closed
// resolver's updates, and so does the client.
type closingResolver struct {
	resolver.Resolver
	conn *configConn
}

func (r *closingResolver) Close() {
	r.conn.r.mu.Lock()
	r.conn.closed = true
	r.conn.r.mu.Unlock()
	r.Resolver.Close() // outside mu: a resolver may deliver while it closes
}

// configConn is what a resolver sees as its grpc.ClientConn: it parses each
// service config the resolver parses, and when the resolver delivers one in
// UpdateState, applies it to the Client before grpc sees the update.
type configConn struct {
	resolver.ClientConn
	r      *configResolver
	closed bool // the resolver was closed; guarded by r.mu
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
	r := cc.r
	// Lenient: grpc-go applies a typo that changes which methods a policy
	// covers, and so does the client, logging it (apply).
	cfg, err := serviceconfig.Parse([]byte(js), serviceconfig.WithMaxAttemptsCap(r.c.opts.maxAttemptsCap), serviceconfig.Lenient())
	r.mu.Lock()
	r.parsed[r.next%len(r.parsed)] = parsed{grpc: pr, json: js, cfg: cfg, err: err}
	r.next++
	r.mu.Unlock()
	return pr
}

// UpdateState applies the state's service config to the client, unless
// the resolver was closed, then hands the state to grpc. What there is to
// log is logged once the wrapper's lock is released.
func (cc *configConn) UpdateState(s resolver.State) error {
	var logs []string
	cc.r.mu.Lock()
	if !cc.closed {
		logs = cc.r.apply(s.ServiceConfig)
	}
	cc.r.mu.Unlock()
	cc.r.c.log.warnAll(logs)
	return cc.ClientConn.UpdateState(s)
}

// apply makes the client's config follow sc, the resolver's latest, and
// returns what to log; see WrapResolver for the rules. Called with mu
// held.
func (r *configResolver) apply(sc *grpcsc.ParseResult) (logs []string) {
	if sc == nil || sc.Err != nil {
		// No config, or one grpc refuses: grpc keeps the config in force
		// (maybeApplyDefaultServiceConfig re-applies cc.sc, its last; the
		// default only while it has none), and so does the client.
		return nil
	}
	var p *parsed
	for i := range r.parsed {
		if r.parsed[i].grpc == sc {
			p = &r.parsed[i]
		}
	}
	switch {
	case p == nil:
		return []string{"interceptor: the resolver delivered a service config it did not parse through this builder; the client's config is left as it is"}
	case p.err != nil:
		return []string{fmt.Sprintf("interceptor: the resolver's service config is refused, the client's config is left as it is: %v", p.err)}
	case p.json == r.applied:
		return nil
	}
	// Its warnings, those of kind WarningCoverage included, and the names
	// no linked-in code registers are logged, once each: grpc-go applies
	// the config whatever they say.
	warnings, err := r.c.updateFrom(resolverOrigin, p.cfg, false)
	if err != nil {
		return append(warnings, "interceptor: the resolver's service config is refused, the client's config is left as it is: "+err.Error())
	}
	r.applied = p.json
	return warnings
}
