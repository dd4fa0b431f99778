package interceptor

import (
	"context"
	"log/slog"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/grpc-resilience/resilience/interceptor/internal/testserver"
	echov1 "github.com/grpc-resilience/resilience/proto/resilience/echo/v1"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// logRecorder is an slog.Handler that keeps the messages of the records it
// handles.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

// logged returns the messages so far.
func (r *logRecorder) logged() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// count returns how many messages so far contain s.
func (r *logRecorder) count(s string) int {
	n := 0
	for _, m := range r.logged() {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

func withRecorder() (ClientOption, *logRecorder) {
	r := &logRecorder{}
	return WithLogger(slog.New(r)), r
}

// mustParseWith parses doc with opts or fails t.
func mustParseWith(t testing.TB, doc string, opts ...serviceconfig.ParseOption) *serviceconfig.Config {
	t.Helper()
	cfg, err := serviceconfig.Parse([]byte(doc), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// typoDoc is the document: a 10-attempt policy for shop.Orders,
// whose name says "services".
const typoDoc = `{"methodConfig": [{"name": [{"services": "resilience.echo.v1.EchoService"}],
	"retryPolicy": {"maxAttempts": 10, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
	                "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`

// TestATypoNeverWidensAPolicy pins the two typos on the way a
// program hands a config to a client: refused by serviceconfig.Parse (and
// json.Unmarshal into a Config), so no Client ever runs them. Before, the
// "services" document parsed to the default entry, and NewClient ran its
// 10 attempts (capped to 5) on every method, health checks included; the
// "methodConfigs" one parsed to an empty config.
func TestATypoNeverWidensAPolicy(t *testing.T) {
	tests := []struct {
		name, doc, wantErr string
	}{
		{"services", typoDoc,
			`serviceconfig: methodConfig[0].name[0].services: unknown key: did you mean "service"? grpc-go ignores it, which leaves the name {}, the default entry: its policies would apply to every method`},
		{"methodConfigs", `{"methodConfigs": [{"name": [{"service": "resilience.echo.v1.EchoService"}], "timeout": "1s"}]}`,
			`serviceconfig: methodConfigs: unknown key: did you mean "methodConfig"? grpc-go ignores it, so the entries it holds apply to no method`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := serviceconfig.Parse([]byte(tt.doc))
			if err == nil || err.Error() != tt.wantErr || cfg != nil {
				t.Fatalf("Parse() = %v, %v, want %q", cfg, err, tt.wantErr)
			}
			var into serviceconfig.Config
			if err := into.UnmarshalJSON([]byte(tt.doc)); err == nil || err.Error() != tt.wantErr {
				t.Fatalf("Config.UnmarshalJSON() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestALenientTypoIsLoggedOnce pins what a Client does with a config
// parsed with serviceconfig.Lenient, as grpc-go reads it: it runs it (the
// program asked for grpc-go's verdict) and logs each warning once, naming
// the option, its path and its kind, however often the config is given.
func TestALenientTypoIsLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := mustParseWith(t, typoDoc, serviceconfig.Lenient())
		logger, rec := withRecorder()
		srv := &testserver.Server{}
		srv.SetScript(failFirst(100, codes.Unavailable))
		stub, c := newEcho(t, srv, logger, WithRetryBudget(nil), WithServiceConfig(cfg))
		_, _ = stub.Echo(t.Context(), &echov1.EchoRequest{})
		if n := srv.Count("Echo"); n != 5 {
			t.Errorf("server saw %d attempts, want 5: grpc-go's reading, the default entry capped", n)
		}
		for range 3 {
			if err := c.UpdateServiceConfig(cfg); err != nil {
				t.Fatal(err)
			}
		}
		want := []string{
			`interceptor: WithServiceConfig: methodConfig[0].name[0].services: unknown key: did you mean "service"? grpc-go ignores it, which leaves the name {}, the default entry: its policies would apply to every method (coverage)`,
			`interceptor: UpdateServiceConfig: methodConfig[0].name[0].services: unknown key: did you mean "service"? grpc-go ignores it, which leaves the name {}, the default entry: its policies would apply to every method (coverage)`,
		}
		if got := rec.logged(); !slices.Equal(got, want) {
			t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}

// TestAResolverConfigKeepsGRPCsLeniency pins the resolver's path: a
// document grpc-go applies is applied, typo and all, as grpc-go applies
// it, and the typo is logged once, however often the resolver delivers
// the document. Before, its warning was logged on each new delivery to
// grpclog, which the Client's logger could not redirect.
func TestAResolverConfigKeepsGRPCsLeniency(t *testing.T) {
	logger, rec := withRecorder()
	c := newTestClient(t, logger, WithRetryBudget(nil))
	e := newResolverEnv(t, c, true)
	e.deliver(typoDoc)
	if n := e.attempts(); n != 5 {
		t.Errorf("server saw %d attempts, want 5: grpc-go's reading of the document (the default entry)", n)
	}
	e.deliver("")
	e.deliver(typoDoc) // applied again after the withdrawal: logged before
	e.deliver(resolverConfig("2"))
	e.deliver(typoDoc)
	const want = `interceptor: the resolver's service config: methodConfig[0].name[0].services: unknown key: did you mean "service"?`
	if n := rec.count(want); n != 1 {
		t.Errorf("logged %q %d times, want once; logged:\n%s", want, n, strings.Join(rec.logged(), "\n"))
	}
}

// TestAResolverConfigWithoutEntriesStillLogsItsTypo pins the issue's
// second typo on the resolver's path: {"methodConfigs": [...]} leaves a
// document with nothing for the client (grpc-go's reading), which
// replaces the client's config as grpc's own channel would replace its
// default (no policy: one attempt), and the client says why. Before, the warning was never
// logged: a document the client does not run skipped updateFrom, where
// Parse's warnings are logged, and the platform's policies were dropped
// in silence.
func TestAResolverConfigWithoutEntriesStillLogsItsTypo(t *testing.T) {
	logger, rec := withRecorder()
	c := newTestClient(t, logger, WithRetryBudget(nil), WithRetryPolicy(fastPolicy(2)))
	e := newResolverEnv(t, c, true)
	for range 2 {
		e.deliver(`{"loadBalancingConfig": [{"round_robin": {}}],
			"methodConfigs": [{"name": [{"service": "resilience.echo.v1.EchoService"}], "timeout": "1s"}]}`)
	}
	if n := e.attempts(); n != 1 {
		t.Errorf("server saw %d attempts, want 1: the document, which holds no policy, replaces the client's own", n)
	}
	const want = `interceptor: the resolver's service config: methodConfigs: unknown key: did you mean "methodConfig"? ` +
		`grpc-go ignores it, so the entries it holds apply to no method (coverage)`
	if got := rec.logged(); !slices.Equal(got, []string{want}) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), want)
	}
}

// TestSettingsThatDoNothingAreRefused pins NewClient's refusals of
// settings that cannot be right, each naming where it was written: the
// option and its Go fields for a policy written in Go, the JSON path for a
// parsed document. Before, each was accepted: an entry without a Name and
// a misspelt method applied to no call, hedging on a stream and keys or a
// fallback for a stream did nothing, and errors of Go options named JSON
// paths the caller never wrote (methodConfig[0].retryPolicy...). And
// WithRetryPolicy(nil, names...), a policy variable never set, made an
// entry without a policy: the names lost the default policy, in silence.
func TestSettingsThatDoNothingAreRefused(t *testing.T) {
	p := fastPolicy(3)
	echo := func(m string) []serviceconfig.Name { return []serviceconfig.Name{{Service: echoService, Method: m}} }
	hedge := &serviceconfig.HedgingPolicy{MaxAttempts: 2}
	fallback := func(context.Context, string, any, any, error) error { return nil }
	tests := []struct {
		name    string
		opts    []ClientOption
		wantErr string
	}{
		{"method config without a name", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{RetryPolicy: p})},
			"interceptor: WithMethodConfig: entry 0: has no Name, so it applies to no method: name its methods, or give Name: []serviceconfig.Name{{}} for every method"},
		{"Go config entry without a name", []ClientOption{WithServiceConfig(&serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{
			{Name: echo("Echo")}, {RetryPolicy: p}}})},
			"interceptor: WithServiceConfig: MethodConfig[1]: has no Name, so it applies to no method"},
		{"a method's name for a service", []ClientOption{WithRetryPolicy(p, "Echo")},
			`interceptor: WithRetryPolicy("Echo"): "Echo" is not a registered service but the name of a method: "/resilience.echo.v1.EchoService/Echo"`},
		{"a misspelt method", []ClientOption{WithRetryPolicy(p, "/resilience.echo.v1.EchoService/Ecko")},
			`interceptor: WithRetryPolicy("/resilience.echo.v1.EchoService/Ecko"): service resilience.echo.v1.EchoService has no method "Ecko" (did you mean "Echo"?)`},
		{"a misspelt method in a Go entry", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{Name: echo("Lokup"), RetryPolicy: p})},
			`interceptor: WithMethodConfig: entry 0: Name[0]: service resilience.echo.v1.EchoService has no method "Lokup" (did you mean "Lookup"?)`},
		{"a misspelt method in a parsed config", []ClientOption{WithServiceConfig(mustParse(t,
			`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "echo"}], "timeout": "1s"}]}`))},
			`interceptor: WithServiceConfig: methodConfig[0].name[0]: service resilience.echo.v1.EchoService has no method "echo" (did you mean "Echo"?)`},
		{"hedging on a stream", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{Name: echo("ServerStream"), HedgingPolicy: hedge})},
			"interceptor: WithMethodConfig: entry 0: HedgingPolicy: /resilience.echo.v1.EchoService/ServerStream is a server-streaming method, and a stream is never hedged: it runs one attempt (a retryPolicy retries it until it commits)"},
		{"hedging on a stream in a parsed config", []ClientOption{WithServiceConfig(mustParse(t,
			`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "BidiStream"}], "hedgingPolicy": {"maxAttempts": 3}}]}`))},
			"interceptor: WithServiceConfig: methodConfig[0].hedgingPolicy: /resilience.echo.v1.EchoService/BidiStream is a bidirectional-streaming method, and a stream is never hedged"},
		{"idempotency keys on a stream", []ClientOption{WithIdempotencyKeys("/resilience.echo.v1.EchoService/ClientStream")},
			`interceptor: WithIdempotencyKeys("/resilience.echo.v1.EchoService/ClientStream"): a client-streaming method: idempotency keys apply to unary methods only (a server runs a stream once per call, whatever its key)`},
		{"a fallback for a stream", []ClientOption{WithFallback(fallback, "/resilience.echo.v1.EchoService/ServerStream")},
			`interceptor: WithFallback("/resilience.echo.v1.EchoService/ServerStream"): a server-streaming method: a fallback answers unary calls only (a stream's rejection is returned as it is)`},
		{"a misspelt idempotent method", []ClientOption{WithIdempotentMethods("/resilience.echo.v1.EchoService/Echoo")},
			`interceptor: WithIdempotentMethods("/resilience.echo.v1.EchoService/Echoo"): service resilience.echo.v1.EchoService has no method "Echoo" (did you mean "Echo"?)`},
		{"a message for a service", []ClientOption{WithExemptMethods("resilience.echo.v1.EchoRequest")},
			`interceptor: WithExemptMethods("resilience.echo.v1.EchoRequest"): "resilience.echo.v1.EchoRequest" is not a service but a message`},
		{"a nil retry policy", []ClientOption{WithRetryPolicy(nil, echoService)},
			"interceptor: WithRetryPolicy: nil policy (to run methods without retries, give them an entry without a retryPolicy: WithMethodConfig)"},
		{"a nil default retry policy", []ClientOption{WithRetryPolicy(nil)},
			"interceptor: WithRetryPolicy: nil policy"},
		{"a negative backoff", []ClientOption{WithRetryPolicy(&serviceconfig.RetryPolicy{InitialBackoff: -1})},
			"interceptor: WithRetryPolicy: InitialBackoff: must not be negative"},
		{"a bad bulkhead", []ClientOption{WithMethodConfig(serviceconfig.MethodConfig{Name: echo("Echo"), Bulkhead: &serviceconfig.Bulkhead{}})},
			"interceptor: WithMethodConfig: entry 0: Bulkhead.MaxConcurrent: must be greater than 0"},
		{"a bad code in a Go config", []ClientOption{WithServiceConfig(&serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name: echo("Echo"), RetryPolicy: &serviceconfig.RetryPolicy{RetryableStatusCodes: []codes.Code{codes.Unavailable, 17}}}}})},
			"interceptor: WithServiceConfig: MethodConfig[0].RetryPolicy.RetryableStatusCodes[1]: code 17 is not a gRPC status code (0 to 16)"},
		{"a bad throttle in a Go config", []ClientOption{WithServiceConfig(&serviceconfig.Config{RetryThrottling: &serviceconfig.RetryThrottling{TokenRatio: 1}})},
			"interceptor: WithServiceConfig: RetryThrottling.MaxTokens: must be greater than 0 and at most 1000"},
		{"a bad budget", []ClientOption{WithRetryBudget(&serviceconfig.RetryBudget{TTL: -1})},
			"interceptor: WithRetryBudget: TTL: must not be negative"},
		{"a name given twice", []ClientOption{WithRetryPolicy(p, echoService), WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{Service: echoService}}, Bulkhead: &serviceconfig.Bulkhead{MaxConcurrent: 1}})},
			`interceptor: WithMethodConfig: entry 0: Name[0]: duplicates the name at WithRetryPolicy("resilience.echo.v1.EchoService")`},
		{"the default given twice", []ClientOption{WithRetryPolicy(p), WithMethodConfig(serviceconfig.MethodConfig{
			Name: []serviceconfig.Name{{}}, Timeout: time.Second})},
			`interceptor: WithMethodConfig: entry 0: Name[0]: duplicates the name at WithRetryPolicy without names (the default of every method)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClient(tt.opts...)
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) || c != nil {
				t.Fatalf("NewClient() = %v, %v, want error %q", c, err, tt.wantErr)
			}
		})
	}
}

// TestUpdateServiceConfigRefusesWhatNewClientRefuses pins that a config
// handed over later is held to NewClient's rules, and that the old config
// stays. A nil config too, as WithServiceConfig(nil) is refused: before,
// UpdateServiceConfig(nil) (a Parse whose error was dropped) removed every
// policy in silence.
func TestUpdateServiceConfigRefusesWhatNewClientRefuses(t *testing.T) {
	c := newTestClient(t, WithRetryPolicy(fastPolicy(3)))
	tests := []struct {
		name    string
		cfg     *serviceconfig.Config
		wantErr string
	}{
		{"nil config", nil, "interceptor: UpdateServiceConfig: nil config (pass &serviceconfig.Config{} to remove every policy)"},
		{"no name", &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{RetryPolicy: fastPolicy(2)}}},
			"interceptor: UpdateServiceConfig: MethodConfig[0]: has no Name, so it applies to no method"},
		{"hedged stream", &serviceconfig.Config{MethodConfig: []serviceconfig.MethodConfig{{
			Name: []serviceconfig.Name{{Service: echoService, Method: "ServerStream"}}, HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2}}}},
			"interceptor: UpdateServiceConfig: MethodConfig[0].HedgingPolicy: /resilience.echo.v1.EchoService/ServerStream is a server-streaming method, and a stream is never hedged"},
		{"parsed, misspelt method", mustParse(t, `{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Lookups"}], "timeout": "1s"}]}`),
			`interceptor: UpdateServiceConfig: methodConfig[0].name[0]: service resilience.echo.v1.EchoService has no method "Lookups" (did you mean "Lookup"?)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.UpdateServiceConfig(tt.cfg); err == nil || !strings.HasPrefix(err.Error(), tt.wantErr) {
				t.Fatalf("UpdateServiceConfig() = %v, want %q", err, tt.wantErr)
			}
			if policyOf(c, echoMethod).retry == nil {
				t.Error("a refused config replaced the old one")
			}
		})
	}
}

// TestNamesNoCodeRegistersAreLoggedOnce pins the settings that may yet be
// right, or are right for some methods only: a service no code linked into
// the program registers (a call made without generated code may carry
// it), a hedging policy for a service with streaming methods (which it
// leaves without retries): accepted, and logged once each, naming the
// setting; a resolver's config that NewClient would refuse for the
// registry's sake is applied and logged, as grpc-go applies it.
func TestNamesNoCodeRegistersAreLoggedOnce(t *testing.T) {
	logger, rec := withRecorder()
	c := newTestClient(t, logger,
		WithRetryPolicy(fastPolicy(3), "shop.Orders"),
		WithMethodConfig(serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: "resilience.echo.v1.EchoServce", Method: "Echo"}},
			Timeout: 1}, serviceconfig.MethodConfig{Name: []serviceconfig.Name{{Service: echoService}},
			HedgingPolicy: &serviceconfig.HedgingPolicy{MaxAttempts: 2}}),
		WithIdempotencyKeys("/shop.Orders/Pay"),
		WithExemptMethods("grpc.health.v1.Health", "shop.Carts"))
	for range 2 {
		if err := c.UpdateServiceConfig(mustParse(t, `{"methodConfig": [{"name": [{"service": "shop.Payments"}], "timeout": "1s"}]}`)); err != nil {
			t.Fatal(err)
		}
	}
	e := newResolverEnv(t, c, true)
	e.deliver(`{"methodConfig": [{"name": [{"service": "resilience.echo.v1.EchoService", "method": "BidiStream"}], "hedgingPolicy": {"maxAttempts": 2}},
		{"name": [{"service": "resilience.echo.v1.EchoService", "method": "Ecko"}], "timeout": "1s"}]}`)
	if got := policyOf(c, "/resilience.echo.v1.EchoService/Ecko").timeout; got != time.Second {
		t.Errorf("timeout of Ecko under the resolver's config = %v, want 1s: the config is applied, as grpc-go applies it", got)
	}
	e.deliver("")
	want := []string{
		`interceptor: WithRetryPolicy("shop.Orders"): service "shop.Orders" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`,
		`interceptor: WithMethodConfig: entry 0: Name[0]: service "resilience.echo.v1.EchoServce" is not registered in this program (protoregistry.GlobalFiles) (did you mean "resilience.echo.v1.EchoService"?): the name applies to no call made with generated code`,
		`interceptor: WithMethodConfig: entry 1: HedgingPolicy: service resilience.echo.v1.EchoService has streaming methods (ServerStream, ClientStream, BidiStream), which are never hedged: under this entry they run one attempt, without retries`,
		`interceptor: WithIdempotencyKeys("/shop.Orders/Pay"): service "shop.Orders" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`,
		`interceptor: WithExemptMethods("grpc.health.v1.Health"): service "grpc.health.v1.Health" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`,
		`interceptor: WithExemptMethods("shop.Carts"): service "shop.Carts" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`,
		`interceptor: UpdateServiceConfig: methodConfig[0].name[0]: service "shop.Payments" is not registered in this program (protoregistry.GlobalFiles): the name applies to no call made with generated code`,
		`interceptor: the resolver's service config: methodConfig[0].hedgingPolicy: /resilience.echo.v1.EchoService/BidiStream is a bidirectional-streaming method, and a stream is never hedged: it runs one attempt (a retryPolicy retries it until it commits)`,
		`interceptor: the resolver's service config: methodConfig[1].name[0]: service resilience.echo.v1.EchoService has no method "Ecko" (did you mean "Echo"?)`,
	}
	if got := rec.logged(); !slices.Equal(got, want) {
		t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestWarningsWithoutALoggerReachSlogDefault pins where a Client that was
// given no WithLogger writes its warnings: slog.Default(), as it is when
// the warning is written. Before, they went to grpclog's "resilience"
// component, whose default logger discards warnings (it writes errors only
// unless GRPC_GO_LOG_SEVERITY_LEVEL asks for more): a resolver's config
// whose typo widened a retry policy to every method was applied and said
// so to no one. Not parallel: it replaces slog's default logger.
func TestWarningsWithoutALoggerReachSlogDefault(t *testing.T) {
	rec := &logRecorder{}
	old := slog.Default()
	slog.SetDefault(slog.New(rec))
	t.Cleanup(func() { slog.SetDefault(old) })

	c := newTestClient(t, WithRetryBudget(nil), WithRetryPolicy(fastPolicy(2), "zz.slogdefault.Unregistered"))
	e := newResolverEnv(t, c, true)
	e.deliver(typoDoc)
	if n := e.attempts(); n != 5 {
		t.Errorf("server saw %d attempts, want 5: the resolver's config as grpc-go reads it", n)
	}
	for _, want := range []string{
		`interceptor: WithRetryPolicy("zz.slogdefault.Unregistered"): service "zz.slogdefault.Unregistered" is not registered in this program`,
		`interceptor: the resolver's service config: methodConfig[0].name[0].services: unknown key: did you mean "service"?`,
	} {
		if n := rec.count(want); n != 1 {
			t.Errorf("slog.Default() got %q %d times, want once; it got:\n%s", want, n, strings.Join(rec.logged(), "\n"))
		}
	}
}

// TestWarnLogIsBoundedInCountAndBytes pins the memory of a Client's
// warn-once log against texts its callers choose: names given to Status or
// HedgingDelay, the keys of the documents a resolver delivers. It holds at
// most maxWarned entries, and each is a hash, not the text: before, it
// kept each text whole, so maxWarned names of 64 KiB each held 16 MiB.
// Each text is still written once until the log forgets.
func TestWarnLogIsBoundedInCountAndBytes(t *testing.T) {
	rec := &logRecorder{}
	w := &warnLog{l: slog.New(rec)}
	for i := range 10 * maxWarned {
		w.warn("short " + strconv.Itoa(i))
		if n := len(w.seen); n > maxWarned {
			t.Fatalf("after %d texts the log remembers %d, want at most %d", i+1, n, maxWarned)
		}
	}
	w.warn("again")
	w.warn("again")
	if n := rec.count("again"); n != 1 {
		t.Errorf("a text given twice was written %d times, want once", n)
	}

	const size = 64 << 10
	quiet := &warnLog{l: slog.New(slog.DiscardHandler)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range maxWarned {
		quiet.warn(strings.Repeat("x", size) + strconv.Itoa(i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if held := int64(after.HeapAlloc) - int64(before.HeapAlloc); held > maxWarned*size/4 {
		t.Errorf("the log holds %d bytes after %d texts of %d bytes, want far less than their %d", held, maxWarned, size, maxWarned*size)
	}
	runtime.KeepAlive(quiet)
}

// TestIdempotencyKeysWithoutNamesAreLogged pins WithIdempotencyKeys given
// no names (an empty list from a config, or a call meant as "every
// method", as WithFallback without names is): it keys nothing, which is
// legal, and says so once. Before, it was accepted in silence.
func TestIdempotencyKeysWithoutNamesAreLogged(t *testing.T) {
	logger, rec := withRecorder()
	newTestClient(t, logger, WithIdempotencyKeys())
	const want = "interceptor: WithIdempotencyKeys without names: no method gets keys " +
		"(WithAutomaticIdempotencyKeys keys every method not known to be idempotent)"
	if got := rec.logged(); !slices.Equal(got, []string{want}) {
		t.Errorf("logged %q, want %q", got, want)
	}
}
