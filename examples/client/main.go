package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/admin"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
}

type config struct {
	configPath, addr, method, metricsAddr string
	adminAddr                             string
	rate                                  float64
	concurrency                           int
	duration, timeout                     time.Duration
	keyed                                 bool
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	fs.StringVar(&c.configPath, "config", "", "service-config JSON file (required)")
	fs.StringVar(&c.addr, "addr", "127.0.0.1:50051", "server address, or several (HOST:PORT,...): one endpoint each")
	fs.StringVar(&c.method, "method", "Echo", "method to call: Echo or Lookup")
	fs.Float64Var(&c.rate, "rate", 0, "calls per second in total; 0: as fast as -concurrency allows")
	fs.IntVar(&c.concurrency, "concurrency", 8, "callers at once")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "how long to drive load")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Second, "deadline of each call")
	fs.BoolVar(&c.keyed, "keyed", false, "send an idempotency key with every call")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "127.0.0.1:9465", "debug HTTP address: Prometheus /metrics and the admin page /debug/resilience/; empty disables")
	fs.StringVar(&c.adminAddr, "admin-addr", "", "serve the admin view over gRPC (resilience.admin.v1.AdminService, for cmd/resadmin) on this address; empty: off")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case fs.NArg() > 0:
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.configPath == "":
		return nil, errors.New("-config is required")
	case c.method != "Echo" && c.method != "Lookup":
		return nil, fmt.Errorf("-method %q: want Echo or Lookup", c.method)
	case c.concurrency < 1:
		return nil, fmt.Errorf("-concurrency %d: must be at least 1", c.concurrency)
	case c.rate < 0:
		return nil, fmt.Errorf("-rate %v: must not be negative", c.rate)
	case c.duration <= 0 || c.timeout <= 0:
		return nil, errors.New("-duration and -timeout must be positive")
	}
	return c, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(c.configPath)
	if err != nil {
		return fmt.Errorf("-config: %w", err)
	}
	sc, err := serviceconfig.Parse(data)
	if err != nil {
		return fmt.Errorf("-config %s: %w", c.configPath, err)
	}
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "resilience-example-client"))))
	defer mp.Shutdown(context.Background())

	fullMethod := "/" + echov1.EchoService_ServiceDesc.ServiceName + "/" + c.method
	st := newStats()
	view, err := admin.New()
	if err != nil {
		return err
	}
	src, err := view.Client("example")
	if err != nil {
		return err
	}
	opts := []interceptor.ClientOption{
		interceptor.WithServiceConfig(sc),
		interceptor.WithMeterProvider(mp),
		// The view's hooks, and the summary's count of retries beside the
		// view's in the retry hook.
		interceptor.WithOnStateChange(src.OnStateChange),
		interceptor.WithOnStop(src.OnStop),
		interceptor.WithOnRetry(func(ctx context.Context, e interceptor.RetryEvent) {
			st.retries.Add(1)
			src.OnRetry(ctx, e)
		}),
	}
	if c.keyed {
		opts = append(opts, interceptor.WithIdempotencyKeys(fullMethod))
	}
	client, err := interceptor.NewClient(opts...)
	if err != nil {
		return err
	}
	defer client.Close() // after conn.Close: unregisters its gauges from mp
	src.Attach(client)
	gopts, err := grpcOptions(data, mp)
	if err != nil {
		return err
	}
	dial := append(client.DialOptions(), gopts...)
	target, ropts, err := targetOf(c.addr)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(target, append(append(dial, ropts...), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer conn.Close()

	if c.metricsAddr != "" {
		mlis, err := net.Listen("tcp", c.metricsAddr)
		if err != nil {
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.Handle("/debug/resilience/", http.StripPrefix("/debug/resilience", view.Handler()))
		hsrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		fmt.Fprintf(stdout, "metrics listening on %s\n", mlis.Addr())
		go func() { _ = hsrv.Serve(mlis) }()
		defer hsrv.Close()
	}
	if c.adminAddr != "" {
		alis, err := net.Listen("tcp", c.adminAddr)
		if err != nil {
			return err
		}
		gs := grpc.NewServer()
		admin.Register(gs, view)
		fmt.Fprintf(stdout, "admin listening on %s\n", alis.Addr())
		go func() { _ = gs.Serve(alis) }()
		defer gs.Stop()
	}

	ctx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()
	call := caller(echov1.NewEchoServiceClient(conn), c)
	breaker := func() string {
		if b := client.Status(fullMethod).Breaker; b != nil {
			return b.State.String()
		}
		return "none"
	}
	drive(ctx, c, call, st, func(total bool) { st.print(stdout, total, breaker()) })
	return nil
}
