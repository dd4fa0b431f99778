// Package resiliencetest helps users test their own retry policies: a
// scripted server, of the echo service (resilience.echo.v1.EchoService) or
// of the user's own services, that fails a chosen number of times and then
// lets the handler answer, or follows a per-call script or a sequence of
// latencies, and records every attempt it sees with its
// grpc-previous-rpc-attempts and metadata, so a test asserts what the
// server saw, not only what the client got.
//
// The fake runs over bufconn ([Start]), so it works inside
// testing/synctest: a retry policy with seconds of backoff is tested in
// microseconds of real time, with the waits on the bubble's fake clock.
//
//	srv := resiliencetest.NewServer()
//	srv.Script(resiliencetest.EchoMethod, resiliencetest.FailTimes(2, codes.Unavailable)...)
//	conn := resiliencetest.Start(t, srv, client.DialOptions())
//	// ... call, then:
//	resiliencetest.RequireAttempts(t, srv, resiliencetest.EchoMethod, 3)
//
// # Your own service
//
// Given registrars, NewServer serves their services instead of the echo
// service: a generated Register function bound to an implementation, or
// a grpc.ServiceDesc registered by hand. Scripts, OnCall, Attempts and
// RequireAttempts work per full method as they do for echo: a step is
// played in front of the handler (its delay, trailer and failure; a step
// that does not fail lets the handler answer).
//
//	srv := resiliencetest.NewServer(func(s *grpc.Server) { healthgrpc.RegisterHealthServer(s, hs) })
//	srv.Script("/grpc.health.v1.Health/Check", resiliencetest.FailTimes(2, codes.Unavailable)...)
//	conn := resiliencetest.Start(t, srv, client.DialOptions())
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
// # A cluster of backends
//
// [StartCluster] serves N Servers behind one target (grpc's manual
// resolver lists each as an endpoint), over bufconn by default (inside
// testing/synctest too; each backend's connection reports its address,
// "backend-0", ..., as the client's peer) or over loopback TCP
// ([WithLoopbackTCP]), so a test sees where a load-balancing policy sends
// each attempt: script each backend on its own and read [Cluster.Counts].
// The backends serve the echo service, or the user's ([WithService]).
//
// The load-balancing policy is named by [WithServiceConfig] (round_robin
// by default), not by a dial option: the cluster puts a thin policy of its
// own in front of it, by which StartCluster, [Cluster.SetEndpoints] and
// [Cluster.SetServiceConfig] return only once every backend the policy
// connects to is READY and in its picker. So a test's first calls already
// reach every backend, on a busy machine too, without sleeping or polling.
//
//	cl := resiliencetest.StartCluster(t, 3, client.DialOptions(),
//		resiliencetest.WithServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`))
//	cl.Backends[0].OnCall(func(resiliencetest.Attempt) resiliencetest.Step {
//		return resiliencetest.Step{Code: codes.Unavailable}
//	})
//
// A Server is safe for concurrent use. Scripts are consumed in the order
// attempts reach the Server's step (after every server interceptor given
// as a server option), per method.
package resiliencetest
