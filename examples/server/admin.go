package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/admin"
	_ "github.com/grpc-resilience/resilience/interceptor/endpoint" // registers the resilience_endpoint policy
	adminv1 "github.com/grpc-resilience/resilience/proto/resilience/admin/v1"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// The names under which the server registers its parts in the admin view.
const (
	adminServerName = "example"
	adminClientName = "backends"
)

// defaultForwardConfig is the client's service config of -forward without
// -forward-config: retries of UNAVAILABLE, a breaker that opens after 5
// failures in a row, and the endpoint policy, which takes a backend that
// fails 5 times in a row out of rotation.
//
//go:embed forward.json
var defaultForwardConfig []byte

// adminSelector keeps the admin service out of the interceptors of the
// echo service (the limits, the faults): an operator must be able to read
// the view while the server sheds everything else. A production server
// serves it on a port of its own instead.
func adminSelector(next grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	prefix := "/" + adminv1.AdminService_ServiceDesc.ServiceName + "/"
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if strings.HasPrefix(info.FullMethod, prefix) {
			return h(ctx, req)
		}
		return next(ctx, req, info, h)
	}
}

// adminStreamSelector is adminSelector for streams (WatchEvents).
func adminStreamSelector(next grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	prefix := "/" + adminv1.AdminService_ServiceDesc.ServiceName + "/"
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if strings.HasPrefix(info.FullMethod, prefix) {
			return h(srv, ss)
		}
		return next(srv, ss, info, h)
	}
}

// forwarder is the client of -forward: the echo service of the backends,
// through an interceptor.Client registered in the admin view.
type forwarder struct {
	client *interceptor.Client
	conn   *grpc.ClientConn
	echo   echov1.EchoServiceClient
}

func (f *forwarder) close() {
	f.conn.Close()
	f.client.Close() // after the connection: unregisters its gauges
}

// newForwarder dials the backends of -forward (comma-separated addresses,
// one endpoint each) through a Client configured by -forward-config (or
// defaultForwardConfig), whose hooks feed view.
func (c *config) newForwarder(view *admin.View, mp metric.MeterProvider) (*forwarder, error) {
	if c.forward == "" {
		if c.forwardConfig != "" {
			return nil, fmt.Errorf("-forward-config needs -forward")
		}
		return nil, nil
	}
	doc := defaultForwardConfig
	if c.forwardConfig != "" {
		var err error
		if doc, err = os.ReadFile(c.forwardConfig); err != nil {
			return nil, fmt.Errorf("-forward-config: %w", err)
		}
	}
	sc, err := serviceconfig.Parse(doc)
	if err != nil {
		return nil, fmt.Errorf("-forward-config: %w", err)
	}
	var addrs []resolver.Address
	for a := range strings.SplitSeq(c.forward, ",") {
		if a = strings.TrimSpace(a); a == "" {
			return nil, fmt.Errorf("-forward %q: an empty address", c.forward)
		}
		addrs = append(addrs, resolver.Address{Addr: a})
	}
	src, err := view.Client(adminClientName)
	if err != nil {
		return nil, err
	}
	client, err := interceptor.NewClient(append([]interceptor.ClientOption{interceptor.WithServiceConfig(sc),
		interceptor.WithMeterProvider(mp)}, src.Options()...)...)
	if err != nil {
		return nil, err
	}
	src.Attach(client)
	dial := client.DialOptions()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil {
		client.Close()
		return nil, fmt.Errorf("-forward-config: %w", err)
	}
	if lb, ok := top["loadBalancingConfig"]; ok {
		dial = append(dial, grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": `+string(lb)+`}`))
	}
	// One endpoint per backend, from a resolver of this process's own.
	r := manual.NewBuilderWithScheme("backends")
	r.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient("backends:///"+adminClientName, append(dial, grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		client.Close()
		return nil, err
	}
	conn.Connect() // a middle tier connects to its backends before its first call
	return &forwarder{client: client, conn: conn, echo: echov1.NewEchoServiceClient(conn)}, nil
}
