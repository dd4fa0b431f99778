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
// A Server is safe for concurrent use. Scripts are consumed in the order
// attempts arrive, per method.
package resiliencetest
