// Package resiliencetest helps users test their own retry policies: a
// scripted fake of the echo service (resilience.echo.v1.EchoService) that
// fails a chosen number of times and then succeeds, or follows a per-call
// script or a sequence of latencies, and records every attempt it sees
// with its grpc-previous-rpc-attempts, so a test asserts what the server
// saw, not only what the client got.
//
// The fake runs over bufconn ([Start]), so it works inside
// testing/synctest: a retry policy with seconds of backoff is tested in
// microseconds of real time, with the waits on the bubble's fake clock.
//
//	srv := resiliencetest.NewServer()
//	srv.Script(resiliencetest.EchoMethod, resiliencetest.FailTimes(2, codes.Unavailable)...)
//	conn := resiliencetest.Start(t, srv, client.DialOptions()...)
//	// ... call, then:
//	resiliencetest.RequireAttempts(t, srv, resiliencetest.EchoMethod, 3)
//
// # With faultinject
//
// Give faultinject's server interceptors to Start as server options. The
// Server records each attempt as it arrives, before them, so the attempts
// the injector aborts count in Attempts and RequireAttempts (with
// Attempt.Handled false), and the scripts apply to the attempts that reach
// the handler:
//
//	conn := resiliencetest.Start(t, srv, client.DialOptions(),
//		grpc.ChainUnaryInterceptor(inj.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(inj.StreamServerInterceptor()))
//
// Installed on the client instead (inside the client's interceptors), the
// injector fails attempts that never reach the server, and the Server
// cannot see them: count those with the injector's Counts.
//
// A Server is safe for concurrent use. Scripts are consumed in the order
// attempts reach the handler, per method.
package resiliencetest
