// Package admin is the admin view of grpc-resilience: one place that
// answers an operator's first question when a call fails fast, "which part
// refused it, and why?". It shows the state of every protective part of a
// process and a bounded log of their recent events:
//
//   - each Client's methods: breaker state and counts, adaptive
//     throttling's rejection probability, bulkhead in flight and queued,
//     the rateLimit block's waiting attempts and the pace a server's
//     pushback set, the hedging delay, the recent failed attempts, the
//     method config entry in force and where it came from
//     (interceptor.Client.Policy);
//     the retry budget's balance and A6 throttling's tokens;
//   - each Server's concurrency limits (limit, in flight, queued, RTTs,
//     admitted and shed by criticality, tenants and the busiest of them),
//     its rate limits (key, rate, burst, keys remembered) and its
//     idempotency store's health as its calls found it;
//   - each channel of the resilience_endpoint policy, its endpoints with
//     their ejection state and why;
//   - the events: a breaker's changes of state (an opening with the failed
//     attempts before it), an endpoint ejected (with its failures) or back,
//     and the refusals of each part (a full bulkhead, adaptive throttling,
//     a spent retry budget, A6 throttling, a limit's shed with the call's
//     criticality and tenant and whether the tenant was over its fair
//     share, CPU shedding, the headroom, the idempotency store down or
//     full, Shutdown, a rate limit with the key it refused and the wait, a
//     Client's rateLimit block; a reason the view does not know, under the
//     part "other"), one event per episode, its count growing while it goes on;
//   - "refusing now": the parts refusing calls at the moment of the view,
//     each with its cause, which is what the page and the CLI show first.
//
// It is served three ways: over gRPC (Register, the service
// resilience.admin.v1.AdminService, read by the command cmd/resadmin as
// grpcdebug reads channelz), and over HTTP as JSON and as a plain HTML page
// (Handler). Both are read-only by default; the write actions (forcing a
// breaker open or closed, resetting it) are refused unless the View is
// built WithWrites and its authorization hook allows each one, and every
// write asked is logged and recorded as an event.
//
// # Wiring
//
// A process builds one View, registers each Client and Server by name,
// gives their sources' hooks to the constructors and attaches what they
// return:
//
//	v, _ := admin.New()
//	cs, _ := v.Client("orders")
//	client, _ := interceptor.NewClient(append(opts, cs.Options()...)...)
//	cs.Attach(client)
//	ss, _ := v.Server("api")
//	srv, _ := server.New(append(sopts, ss.Options()...)...)
//	ss.Attach(srv)
//	admin.Register(grpcServer, v)
//	debugMux.Handle("/debug/resilience/", http.StripPrefix("/debug/resilience", v.Handler()))
//
// A source's Options install the hooks interceptor.WithOnStateChange,
// WithOnRetry and WithOnStop (server.WithOnRefusal for a Server); a
// program with hooks of its own calls the source's method of the same name
// from them instead.
//
// # Cost
//
// Nothing is kept up to date on the call path. The hooks run only on a
// breaker's change of state, a failed attempt or call, and a refusal: a
// call that succeeds never reaches them, and costs what it cost without
// the view (its allocations are pinned by a test). Refusals of one part
// are counted into one event per episode (the same reason, method,
// criticality and tenant within a second of the last), so a part refusing
// steadily costs each refused call a short critical section, not a new
// event. Refusals by an open breaker are not recorded at all: its opening
// says why, and callers spinning on it pay nothing more. The state of the
// parts is read when the view is asked: a snapshot, a page, a poll of a
// watcher.
//
// # Bounds
//
// Each part keeps its last 16 events; at most 256 parts are kept, the
// parts beyond sharing one overflow part per source; strings are cut to
// 256 bytes and an event keeps at most 8 failed attempts; each Client
// keeps the last 8 failures of at most 1,024 methods; a method's policy is
// cut to 1 KiB and a limit shows at most 8 tenants. The log's memory is
// therefore bounded whatever the traffic, and it counts the events it let
// go (ListEventsResponse.dropped).
//
// # What the view cannot see
//
// A failed attempt reaches the view through the Client's retry and stop
// hooks, which run for methods under a retry policy: a breaker of a method
// without one opens with no failures to show (the event says so). The
// endpoint policy reports its ejections to a process-wide logger, the
// user's (endpoint.SetLogger), not to a hook: the view reads
// endpoint.Snapshots when it is asked (and every 250ms while a watcher
// follows the events) and stamps each ejection it finds with when the
// policy ejected the endpoint, so an ejection that begins and ends between
// two looks shows only in the endpoint's count. A Client's rateLimit
// refusals (rate_limited) reach it through the stop hook too, so only for
// methods under a retry policy; the method's pace after a server's pushback
// is in its row whatever its policy.
//
// # Concurrency
//
// A View, its sources and its handlers are safe for concurrent use. The
// hooks take the log's mutex briefly; readers copy what they show under
// it.
package admin
