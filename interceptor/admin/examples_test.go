package admin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/grpc-resilience/resilience/interceptor"
	"github.com/grpc-resilience/resilience/interceptor/admin"
	"github.com/grpc-resilience/resilience/interceptor/server"
	"github.com/grpc-resilience/resilience/serviceconfig"
)

// A process registers its Client and Server by name, gives their sources'
// hooks to the constructors, attaches what they return, and serves the
// view over gRPC (Register) and HTTP (Handler). Here an operator's
// ForceOpen shows in "refusing now" with its cause.
func Example() {
	v, err := admin.New(admin.WithoutEndpoints())
	if err != nil {
		log.Fatal(err)
	}
	src, err := v.Client("orders")
	if err != nil {
		log.Fatal(err)
	}
	client, err := interceptor.NewClient(append([]interceptor.ClientOption{
		interceptor.WithMethodConfig(serviceconfig.MethodConfig{
			Name:           []serviceconfig.Name{{Service: "shop.Orders", Method: "Pay"}},
			CircuitBreaker: &serviceconfig.CircuitBreaker{ConsecutiveFailures: 5},
		}),
	}, src.Options()...)...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	src.Attach(client)

	ss, err := v.Server("api")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := server.New(ss.Options()...)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	ss.Attach(srv)

	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(srv.UnaryServerInterceptor()))
	admin.Register(gs, v) // beside the process's services, or on an admin port
	mux := http.NewServeMux()
	mux.Handle("/debug/resilience/", http.StripPrefix("/debug/resilience", v.Handler()))

	if err := client.ForceOpen("/shop.Orders/Pay"); err != nil {
		log.Fatal(err)
	}
	for _, r := range v.Snapshot().GetRefusing() {
		fmt.Printf("%s %s %s: %s\n", r.GetSide(), r.GetSource(), r.GetSubject(), r.GetCause())
	}
	// Output:
	// client orders /shop.Orders/Pay: breaker forced-open: forced open (ForceOpen): every call is rejected until a reset
}

// WithWrites turns the write actions on, each decided by the hook: here,
// an HTTP request must carry the operators' token and a gRPC call their
// metadata. Without it, every write is refused.
func ExampleWithWrites() {
	authorize := func(ctx context.Context, w admin.Write) error {
		if w.HTTP != nil {
			if w.HTTP.Header.Get("Authorization") != "Bearer operators-token" {
				return errors.New("not an operator")
			}
			return nil
		}
		md, _ := metadata.FromIncomingContext(ctx)
		if vs := md.Get("authorization"); len(vs) != 1 || vs[0] != "Bearer operators-token" {
			return errors.New("not an operator")
		}
		return nil
	}
	v, err := admin.New(admin.WithWrites(authorize), admin.WithoutEndpoints())
	if err != nil {
		log.Fatal(err)
	}
	hs := httptest.NewServer(http.StripPrefix("/debug/resilience", v.Handler()))
	defer hs.Close()
	resp, err := http.Post(hs.URL+"/debug/resilience/breaker", "application/json",
		strings.NewReader(`{"client": "orders", "fullMethod": "/shop.Orders/Pay", "action": "BREAKER_ACTION_FORCE_OPEN"}`))
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, strings.TrimSpace(string(body)))
	// Output:
	// 403 admin: not authorized: not an operator
}
