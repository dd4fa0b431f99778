package serviceconfig_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"

	rescodes "github.com/grpc-resilience/resilience/codes"
)

// grpcParser feeds documents to grpc-go's own service-config parser through
// a public path: a resolver's ClientConn.ParseServiceConfig, which calls the
// same parseServiceConfig as grpc.WithDefaultServiceConfig and as the DNS
// resolver, with the channel's WithMaxCallAttempts.
type grpcParser struct {
	conn *grpc.ClientConn
	cc   resolver.ClientConn
}

// captureBuilder is a resolver that hands its ClientConn to the test and
// never resolves anything.
type captureBuilder struct {
	scheme string
	ccs    chan resolver.ClientConn
}

func (b *captureBuilder) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	b.ccs <- cc
	return nopResolver{}, nil
}

func (b *captureBuilder) Scheme() string { return b.scheme }

type nopResolver struct{}

func (nopResolver) ResolveNow(resolver.ResolveNowOptions) {}
func (nopResolver) Close()                                {}

// newGRPCParser returns a parser whose channel has WithMaxCallAttempts(cap)
// (cap 0: the option is not given), closed when t ends.
func newGRPCParser(t testing.TB, cap int) *grpcParser {
	t.Helper()
	b := &captureBuilder{scheme: "sctest", ccs: make(chan resolver.ClientConn, 1)}
	opts := []grpc.DialOption{
		grpc.WithResolvers(b),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}
	if cap != 0 {
		opts = append(opts, grpc.WithMaxCallAttempts(cap))
	}
	conn, err := grpc.NewClient("sctest:///"+strconv.Itoa(cap), opts...)
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.Connect() // leaves idle mode, which builds the resolver
	select {
	case cc := <-b.ccs:
		return &grpcParser{conn: conn, cc: cc}
	case <-time.After(10 * time.Second):
		t.Fatal("grpc did not build the resolver")
		return nil
	}
}

// grpcPolicy is what grpc-go resolved for a method, in our types.
type grpcPolicy struct {
	found        bool
	waitForReady *bool
	timeout      time.Duration // 0 when absent or negative (grpc-go ignores those); "0s" is 1ns
	maxReq       *int
	maxResp      *int
	retry        *grpcRetry
}

type grpcRetry struct {
	maxAttempts       int
	initialBackoff    time.Duration
	maxBackoff        time.Duration
	backoffMultiplier float64
	codes             rescodes.Set
}

// parse returns grpc-go's verdict on doc and its policy for fullMethod.
func (p *grpcParser) parse(doc, fullMethod string) (grpcPolicy, error) {
	res := p.cc.ParseServiceConfig(doc)
	if res.Err != nil {
		return grpcPolicy{}, res.Err
	}
	sc := res.Config.(*grpc.ServiceConfig)
	// grpc-go's getMethodConfig: exact key, then the service key, then "".
	mc, ok := sc.Methods[fullMethod]
	if !ok {
		mc, ok = sc.Methods[fullMethod[:strings.LastIndex(fullMethod, "/")+1]]
	}
	if !ok {
		mc, ok = sc.Methods[""]
	}
	if !ok {
		return grpcPolicy{}, nil
	}
	got := grpcPolicy{found: true, waitForReady: mc.WaitForReady, maxReq: mc.MaxReqSize, maxResp: mc.MaxRespSize}
	if mc.Timeout != nil && *mc.Timeout >= 0 {
		// grpc-go's 0 fails calls at once; Parse keeps it as 1ns, which
		// does the same.
		got.timeout = max(*mc.Timeout, time.Nanosecond)
	}
	if rp := mc.RetryPolicy; rp != nil {
		r := &grpcRetry{
			maxAttempts:       rp.MaxAttempts,
			initialBackoff:    rp.InitialBackoff,
			maxBackoff:        rp.MaxBackoff,
			backoffMultiplier: rp.BackoffMultiplier,
		}
		for c, on := range rp.RetryableStatusCodes {
			if on {
				r.codes = r.codes.With(codes.Code(c))
			}
		}
		got.retry = r
	}
	return got, nil
}
