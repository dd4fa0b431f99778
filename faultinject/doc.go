// Package faultinject is the tool to test one's own retry policies: gRPC
// interceptors that make chosen methods fail with chosen codes at a chosen
// rate, add latency, send server pushback (grpc-retry-pushback-ms) or a
// google.rpc.RetryInfo detail, and abort streams after a number of
// messages.
//
// Install the server side on a staging server, or the client side under the
// interceptors under test (closest to the network), and watch what the
// retry policy does with the failures:
//
//	inj, err := faultinject.New(cfg)
//	grpc.NewServer(grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()), ...)
//	// or, on the client, inside the resilience interceptors:
//	grpc.NewClient(target,
//		grpc.WithChainUnaryInterceptor(client.UnaryClientInterceptor(), inj.UnaryClientInterceptor()))
//
// # Configuration
//
// A [Config] is a list of faults, each for a set of methods; the first
// fault whose methods match a call applies to it. It is written in Go or in
// JSON in the style of Envoy's HTTP fault filter ([Parse] validates it and
// names the JSON path of the first error):
//
//	{
//	  "seed": 7,
//	  "faults": [{
//	    "methods": ["resilience.echo.v1.EchoService/Echo"],
//	    "delay": {"fixedDelay": "0.05s", "percentage": {"numerator": 20}},
//	    "abort": {"grpcStatus": "UNAVAILABLE", "pushback": "0.2s",
//	              "percentage": {"numerator": 10, "denominator": "HUNDRED"}},
//	    "streamAbort": {"afterMessages": 3, "grpcStatus": "UNAVAILABLE"},
//	    "outage": {"every": "60s", "duration": "5s", "grpcStatus": "UNAVAILABLE"}
//	  }]
//	}
//
// A method is "/pkg.Service/Method" (the leading slash optional) or a whole
// service "pkg.Service"; a fault without methods matches every method but
// those of health checking (grpc.health.v1.Health) and reflection
// (grpc.reflection.v1 and v1alpha ServerReflection), which a fault reaches
// only by naming them. New checks each name against the services the
// program's generated code registers: a method its service does not have,
// or a method's name given as a service, is an error, so that a misspelt
// method never leaves a test of a retry policy passing without a fault; a
// service nothing registers is logged (WithLogger). A
// matching call is first delayed (with the delay's probability), then
// aborted, during an outage window or else with the abort's probability,
// before the handler runs; a
// streaming call not aborted fails once afterMessages messages, counted in
// both directions, have passed. Probabilities are drawn from a PCG
// generator seeded with the config's seed, so one sequence of calls sees
// one sequence of faults.
//
// # Per-call faults
//
// Tests can ask for a fault per call with metadata ([MetadataAbort],
// [MetadataDelayMs] and the others), which then replaces the configured
// fault for that call. Callers' metadata is untrusted, so it is honoured
// only when the injector is built with [WithMetadataFaults]; otherwise it
// is ignored. It never applies to health checking or reflection: a tool
// such as grpcurl sends its -H headers on its reflection calls too, and
// `grpcurl -H 'x-fault-abort: UNAVAILABLE' ... Echo` must reach Echo.
//
// # With resiliencetest
//
// Give the server interceptors to resiliencetest.Start (or Serve) as
// server options: its Server records every attempt that arrives, those the
// injector aborts included (Attempt.Handled tells them apart), so
// RequireAttempts counts what the client sent. See resiliencetest's
// Example_faultinject.
//
// # Concurrency and cost
//
// An Injector is safe for concurrent use. The fault of a method is resolved
// once and cached; a call that draws a probability takes a mutex around the
// shared generator. A call without a matching fault costs a map lookup
// and, without WithMetadataFaults, allocates nothing. This is a test and staging tool: the abort and delay paths allocate.
package faultinject
