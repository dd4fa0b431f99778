package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	rescodes "github.com/grpc-resilience/resilience/codes"
	"github.com/grpc-resilience/resilience/faultinject"
	"github.com/grpc-resilience/resilience/interceptor/admin"
	"github.com/grpc-resilience/resilience/interceptor/idempotency"
	"github.com/grpc-resilience/resilience/interceptor/idempotency/redisstore"
	"github.com/grpc-resilience/resilience/interceptor/server"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	addr, metricsAddr string
	store, redisAddr  string
	scope             string
	tlsCert, tlsKey   string
	tlsClientCA       string
	faults            string
	serverConfig      string
	failRate          float64
	failCode          string
	latency           time.Duration
	outage            string
	seed              uint64
	seedSet           bool
	metadataFaults    bool
	executionLog      string
	headroom, floor   time.Duration
	shutdownTimeout   time.Duration
	forward           string // backends' addresses, comma-separated: Echo and Lookup forward to them
	forwardConfig     string // the forwarding client's service config (JSON file)
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	fs.StringVar(&c.addr, "addr", "127.0.0.1:50051", "gRPC listen address")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "127.0.0.1:9464", "debug HTTP listen address: Prometheus /metrics and the admin page /debug/resilience/; empty disables")
	fs.StringVar(&c.store, "store", "memory", "idempotency store: memory or redis")
	fs.StringVar(&c.redisAddr, "redis-addr", "127.0.0.1:6379", "Redis address for -store redis")
	fs.StringVar(&c.scope, "scope", "none", "idempotency scope: none (keyed calls refused), mtls, metadata:<key> or shared")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "serve TLS with this certificate (PEM; with -tls-key)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "the key of -tls-cert (PEM)")
	fs.StringVar(&c.tlsClientCA, "tls-client-ca", "", "require client certificates signed by this CA (PEM): mTLS")
	fs.StringVar(&c.faults, "faults", "", "fault-injection config (JSON file, see package faultinject)")
	fs.StringVar(&c.serverConfig, "server-config", "", "concurrency and rate limits: a server document (JSON file, see svcconfig server; limits.json has a per-tenant rate limit)")
	fs.Func("fail-rate", "abort this fraction of calls: 0 to 1, such as 0.3, or a percentage such as 30%", c.setFailRate)
	fs.StringVar(&c.failCode, "fail-code", "UNAVAILABLE", "status code of -fail-rate")
	fs.DurationVar(&c.latency, "latency", 0, "delay every call this long")
	fs.StringVar(&c.outage, "outage", "", "DURATION/EVERY, e.g. 2s/10s: fail every call (-fail-code) for the first 2s of every 10s")
	fs.Uint64Var(&c.seed, "seed", 1, "seed of the fault injector (overrides the config's)")
	fs.BoolVar(&c.metadataFaults, "metadata-faults", false, "honour per-call fault metadata (untrusted: tests only)")
	fs.StringVar(&c.executionLog, "execution-log", "", "append one line per handler execution of a keyed call")
	fs.DurationVar(&c.headroom, "headroom", 20*time.Millisecond, "deadline headroom kept for the server's own work")
	fs.DurationVar(&c.floor, "headroom-floor", 5*time.Millisecond, "least time a handler gets after the headroom: calls arriving with less than headroom + floor left are refused")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 5*time.Second, "bound of the graceful stop")
	fs.StringVar(&c.forward, "forward", "", "forward Echo and Lookup to these backends (HOST:PORT,...) through an interceptor.Client")
	fs.StringVar(&c.forwardConfig, "forward-config", "", "the forwarding client's service config (JSON file; default: retries, a breaker, resilience_endpoint)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { c.seedSet = c.seedSet || f.Name == "seed" })
	return c, nil
}

// faultConfig builds the injector's config: the file's faults first, then
// a fault of the shorthand flags for every method of the echo service.
func (c *config) faultConfig() (faultinject.Config, error) {
	cfg := faultinject.Config{Seed: 1}
	if c.faults != "" {
		data, err := os.ReadFile(c.faults)
		if err != nil {
			return cfg, fmt.Errorf("-faults: %w", err)
		}
		if cfg, err = faultinject.Parse(data); err != nil {
			return cfg, fmt.Errorf("-faults %s: %w", c.faults, err)
		}
	}
	if c.seedSet {
		cfg.Seed = c.seed
	}
	if c.failRate != 0 || c.latency != 0 || c.outage != "" {
		// Health and reflection stay reliable: the shorthand faults are the
		// echo service's.
		f := faultinject.Fault{Methods: []string{echov1.EchoService_ServiceDesc.ServiceName}}
		if c.failRate != 0 {
			code, err := failureCode(c.failCode)
			if err != nil {
				return cfg, err
			}
			f.Abort = &faultinject.Abort{Code: code, Rate: c.failRate}
		}
		if c.latency != 0 {
			f.Delay = &faultinject.Delay{Fixed: c.latency}
		}
		if c.outage != "" {
			o, err := parseOutage(c.outage, c.failCode)
			if err != nil {
				return cfg, err
			}
			f.Outage = o
		}
		cfg.Faults = append(cfg.Faults, f)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("fault flags: %w", err)
	}
	return cfg, nil
}

// injector builds the fault injector of the fault flags.
func (c *config) injector() (*faultinject.Injector, error) {
	cfg, err := c.faultConfig()
	if err != nil {
		return nil, err
	}
	var opts []faultinject.Option
	if c.metadataFaults {
		opts = append(opts, faultinject.WithMetadataFaults())
	}
	return faultinject.New(cfg, opts...)
}

// failureCode parses -fail-code.
func failureCode(s string) (codes.Code, error) {
	code, err := rescodes.Parse(s)
	if err == nil && code == codes.OK {
		err = errors.New("OK is not a failure")
	}
	if err != nil {
		return 0, fmt.Errorf("-fail-code: %w", err)
	}
	return code, nil
}

// parseOutage parses -outage DURATION/EVERY.
func parseOutage(s, code string) (*faultinject.Outage, error) {
	d, every, ok := strings.Cut(s, "/")
	o := &faultinject.Outage{}
	var err1, err2 error
	o.Duration, err1 = time.ParseDuration(d)
	o.Every, err2 = time.ParseDuration(every)
	if !ok || err1 != nil || err2 != nil {
		return nil, fmt.Errorf("-outage %q: want DURATION/EVERY, such as 2s/10s", s)
	}
	if o.Duration <= 0 || o.Duration > o.Every {
		return nil, fmt.Errorf("-outage %q: the outage must be positive and no longer than its period", s)
	}
	c, err := failureCode(code)
	if err != nil {
		return nil, err
	}
	o.Code = c
	return o, nil
}

// run serves until ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	creds, err := c.transportCreds()
	if err != nil {
		return err
	}
	inj, err := c.injector()
	if err != nil {
		return err
	}
	idem, closeStore, err := c.idempotency(ctx, logger)
	if err != nil {
		return err
	}
	defer closeStore()

	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter),
		sdkmetric.WithResource(resource.NewSchemaless(attribute.String("service.name", "resilience-example-server"))))
	defer mp.Shutdown(context.Background())

	view, err := admin.New()
	if err != nil {
		return err
	}
	fwd, err := c.newForwarder(view, mp)
	if err != nil {
		return err
	}
	if fwd != nil {
		defer fwd.close()
	}
	src, err := view.Server(adminServerName)
	if err != nil {
		return err
	}
	src.DescribeStore(c.storeDescription())
	opts := []server.Option{idem, server.WithHeadroom(c.headroom, c.floor), server.WithLogger(logger)}
	opts = append(opts, src.Options()...)
	opts = append(opts, serverMetrics(mp)...)
	limits, err := c.limitOptions()
	if err != nil {
		return err
	}
	opts = append(opts, limits...)
	if err := faultMetrics(mp, inj); err != nil {
		return err
	}
	srv, err := server.New(opts...)
	if err != nil {
		return err
	}
	defer srv.Close() // runs after the grpc.Server has stopped: unregisters its gauges
	src.Attach(srv)
	echo, err := newEcho(c.executionLog)
	if err != nil {
		return err
	}
	defer echo.close()
	if fwd != nil {
		echo.forward = fwd.echo
	}

	gs := grpc.NewServer(append(creds, grpcMetrics(mp),
		grpc.ChainUnaryInterceptor(recoverUnary(logger), adminSelector(srv.UnaryServerInterceptor()), adminSelector(inj.UnaryServerInterceptor())),
		grpc.ChainStreamInterceptor(recoverStream(logger), adminStreamSelector(srv.StreamServerInterceptor()), adminStreamSelector(inj.StreamServerInterceptor())))...)
	echov1.RegisterEchoServiceServer(gs, echo)
	admin.Register(gs, view)
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(echov1.EchoService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)

	lis, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "grpc listening on %s\n", lis.Addr())
	errc := make(chan error, 2) // one send at most from each server's goroutine
	hsrv, err := serveMetrics(c.metricsAddr, reg, view, stdout, errc)
	if err != nil {
		lis.Close()
		return err
	}
	go func() { errc <- gs.Serve(lis) }()

	select {
	case <-ctx.Done():
	case err := <-errc:
		gs.Stop()
		if hsrv != nil {
			hsrv.Close()
		}
		return err
	}
	hs.Shutdown() // NOT_SERVING, so load balancers stop sending
	stopGracefully(gs, srv, c.shutdownTimeout, logger)
	if hsrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = hsrv.Shutdown(sctx)
	}
	return nil
}

// serveMetrics serves reg's /metrics and view's admin page
// (/debug/resilience/) on addr in a goroutine that sends to errc only when
// serving fails; nil, nil when addr is empty.
func serveMetrics(addr string, reg *prometheus.Registry, view *admin.View, stdout io.Writer, errc chan<- error) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	mlis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/debug/resilience/", http.StripPrefix("/debug/resilience", view.Handler()))
	hsrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Fprintf(stdout, "metrics listening on %s\n", mlis.Addr())
	go func() {
		if err := hsrv.Serve(mlis); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("metrics: %w", err)
		}
	}()
	return hsrv, nil
}

// stopGracefully lets the calls in flight finish, cutting them after
// timeout: gs.Stop cuts the plain calls, and srv.Shutdown the keyed calls'
// handlers, which run detached from their callers, so that gs.Stop does
// not reach them (their outcomes are then not stored: a retry runs them).
func stopGracefully(gs *grpc.Server, srv *server.Server, timeout time.Duration, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	if err := srv.Shutdown(ctx); err != nil {
		logger.Warn("keyed handlers still running at the shutdown timeout were cancelled", "timeout", timeout, "error", err)
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		logger.Warn("graceful stop timed out; cutting the remaining calls", "timeout", timeout)
		gs.Stop()
		<-stopped
	}
}

// openStore opens the idempotency store named by -store. Each scope gets
// the store's default quota (a quarter of the memory store; a quarter of
// Redis's maxmemory), so one caller cannot fill it for the others; with
// one scope shared by every caller, that scope is everyone, and the store's
// own bounds are its quota.
func openStore(ctx context.Context, c *config, logger *slog.Logger, shared bool) (idempotency.Store, func(), error) {
	switch c.store {
	case "memory":
		var opts []idempotency.MemoryOption
		if shared {
			opts = append(opts, idempotency.WithScopeQuota(0, 0))
		}
		s, err := idempotency.NewMemoryStore(opts...)
		return s, func() {}, err
	case "redis":
		rc := redis.NewClient(&redis.Options{Addr: c.redisAddr})
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		opts := []redisstore.Option{redisstore.WithLogger(logger)}
		if shared {
			opts = append(opts, redisstore.WithScopeQuota(0, 0))
		}
		s, err := redisstore.Open(octx, rc, opts...)
		if err != nil {
			rc.Close()
			return nil, nil, fmt.Errorf("-store redis at %s: %w", c.redisAddr, err)
		}
		return s, func() { rc.Close() }, nil
	default:
		return nil, nil, fmt.Errorf("-store %q: want memory or redis", c.store)
	}
}

// idempotency returns the server's idempotency options (-scope, -store,
// with the store's quotas) and the store's close, and says at startup
// which scope and quota apply.
func (c *config) idempotency(ctx context.Context, logger *slog.Logger) (server.Option, func(), error) {
	scope, err := parseScope(c.scope, c.tlsClientCA != "")
	if err != nil {
		return nil, nil, err
	}
	store, closeStore, err := openStore(ctx, c, logger, scope.shared)
	if err != nil {
		return nil, nil, err
	}
	quota := "per scope, a quarter of the store (memory: of its entries and bytes; redis: of maxmemory)"
	if scope.shared {
		quota = "the store's own bounds (one scope for every caller)"
	}
	logger.Info("idempotency", "scope", scope.desc, "store", c.store, "quota", quota)
	return server.WithIdempotency(server.Idempotency{Store: store, Scope: scope.scope}), closeStore, nil
}

// storeDescription says which idempotency store -store opens, for the
// admin view.
func (c *config) storeDescription() string {
	if c.store == "redis" {
		return "redis at " + c.redisAddr
	}
	return c.store
}
